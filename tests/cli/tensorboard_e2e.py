#!/usr/bin/env python3
"""tensorboard_e2e.py PRETRAIN_GPT CONFIG PB2_DIR: a 2-rank run with
--tensorboard-dir and --metrics-file; the event file is read back (TFRecord
framing with both CRC32Cs checked, every record decoded with protoc's Python
classes of TensorBoard's Event schema) and its scalars must be the JSON-lines
metrics' and the printed validation losses, at the same iterations."""
import glob
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, sys.argv[3])
try:
    import tensorboard_event_pb2 as pb  # noqa: E402
except ImportError as e:  # python3-protobuf missing: tools/install_deps.sh installs it
    print(f"tensorboard_e2e: FAIL: cannot import the generated classes ({e})")
    sys.exit(1)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(c):
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    i = 0
    while i < len(data):
        header = data[i:i + 8]
        (n,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        assert hcrc == masked(crc32c(header)), f"length CRC at {i}"
        body = data[i + 12:i + 12 + n]
        (bcrc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        assert bcrc == masked(crc32c(body)), f"data CRC at {i}"
        yield body
        i += 16 + n


def main():
    train, cfg = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="mz-tb-")
    tb, metrics = os.path.join(work, "tb"), os.path.join(work, "m.jsonl")
    out = subprocess.run(["mpiexec", "-n", "2", train, "--config", cfg, "--mock-data", "--vocab-size", "256",
                          "--train-iters", "6", "--log-interval", "2", "--eval-interval", "2", "--eval-iters", "1",
                          "--tensorboard-dir", tb, "--metrics-file", metrics],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300).stdout.decode()
    files = glob.glob(os.path.join(tb, "events.out.tfevents.*"))
    assert len(files) == 1, f"expected one event file (rank 0 writes), found {files}\n{out}"
    events = [pb.Event.FromString(r) for r in records(files[0])]
    assert events[0].file_version == "brain.Event:2", events[0]
    scalars = {}
    for e in events[1:]:
        for v in e.summary.value:
            assert v.WhichOneof("value") == "simple_value", v
            scalars.setdefault(v.tag, {})[e.step] = v.simple_value
    logged = [json.loads(l) for l in open(metrics)]
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]  # noqa: E731
    for tag, key in [("lm loss", "loss"), ("learning-rate", "lr"), ("grad-norm", "grad_norm"),
                     ("loss-scale", "loss_scale"), ("throughput/tokens-per-second", "tokens_per_s"),
                     ("timers/forward-ms", "forward_ms")]:
        got = scalars.get(tag)
        assert got is not None, f"no '{tag}' in the event file: {sorted(scalars)}"
        want = {r["iteration"]: f32(r[key]) for r in logged}
        assert sorted(got) == sorted(want), f"'{tag}' at steps {sorted(got)}, metrics at {sorted(want)}"
        for step, v in want.items():
            # The JSON lines print 6 significant digits; the event file holds the float.
            assert abs(got[step] - v) <= 1e-5 * max(1.0, abs(v)), f"'{tag}' at {step}: {got[step]} vs {v}"
    printed = {int(m.group(1)): float(m.group(2))
               for m in re.finditer(r"validation loss at iteration (\d+): ([0-9.]+)", out)}
    val = scalars.get("lm loss validation", {})
    assert sorted(val) == sorted(printed) == [2, 4, 6], f"validation at {sorted(val)}, printed at {sorted(printed)}"
    for step, v in printed.items():
        assert abs(val[step] - v) <= 5e-5, f"validation at {step}: {val[step]} vs printed {v}"
    print(f"tensorboard_e2e: {len(events)} events, {len(scalars)} tags; loss, lr, grad norm, loss scale, "
          f"throughput and timers equal the metrics file at iterations {sorted(scalars['lm loss'])}, "
          f"validation at {sorted(val)}")


if __name__ == "__main__":
    main()

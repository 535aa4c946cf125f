#!/usr/bin/env bash
# generation_server_e2e.sh PRETRAIN_GPT GENERATE_TEXT SERVER PYTHON CONFIG: Megatron's REST text generation
# API (tools/text_generation_server, docs/GENERATION.md) through the real executables:
#  1. a ByteLevel model (257 tokens) trains 2 steps and saves;
#  2. the server (one process, --port 0) answers PUT /api: greedy (top_k 1, and "greedy": true) the tokens
#     of generate_text --greedy for the same prompt, a batch of two prompts, the same sampled text for the
#     same random_seed, prompt_tokens instead of text; Megatron's logprobs (those of generate_text --logprobs;
#     tokens_to_generate 0 scores the prompt alone), segments, add_BOS, stop_on_eol (the greedy tokens cut
#     after the first "\n"), prevent_newline_after_colon, top_p_decay, no_log;
#     beam search ("beam_width", "length_penalty"): generate_text --beam-width's hypotheses and scores;
#  3. bad requests get HTTP 400 naming the field (unknown field, beam search's misuses, too many tokens, not
#     JSON, the new fields' misuses), a GET
#     no answer; a second server on the same port is refused with exit 2, printed once;
#  4. SIGTERM stops it with exit 0;
#  5. under mpiexec -n 2 the model is split over the ranks (TP 2): the same first greedy token, beam search's
#     best first token (the request handed to both ranks with its beam fields), SIGTERM to
#     mpiexec stops every rank with exit 0.
set -u
train=$1 generate=$2 server=$3 python=$4 cfg=$5
work=$(mktemp -d /tmp/mz-gen-server-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "generation_server_e2e: FAIL: $*" >&2; for f in "$work"/*.log; do echo "---- $f"; tail -n 15 "$f"; done >&2; exit 1; }
step() {  # step NAME COMMAND...: output in $work/NAME.log; fails the test on a nonzero exit
  local name=$1; shift
  timeout 300 "$@" >"$work/$name.log" 2>&1 || fail "$name exited with $?"
}
start() {  # start NAME COMMAND...: a server in the background; sets $pid and $port once it serves
  local name=$1; shift
  "$@" >"$work/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 600); do
    port=$(sed -nE 's/^text_generation_server: serving .* at http:\/\/127\.0\.0\.1:([0-9]+)\/api.*/\1/p' "$work/$name.log")
    [ -n "$port" ] && return 0
    kill -0 "$pid" 2>/dev/null || fail "$name exited before serving"
    sleep 0.1
  done
  fail "$name did not serve within a minute"
}
stop() {  # stop PID NAME: SIGTERM, then its exit code must be 0
  kill -TERM "$1"
  local rc=0
  timeout 60 tail --pid="$1" -f /dev/null || fail "$2 did not stop within a minute of SIGTERM"
  wait "$1"; rc=$?
  [ "$rc" = 0 ] || fail "$2 exited with $rc after SIGTERM"
  grep -q "text_generation_server: stopped by signal 15" "$work/$2.log" || fail "$2 did not say it stopped"
}
cat >"$work/client.py" <<'EOF'
import json, sys, urllib.request, urllib.error
def put(port, body, method="PUT"):
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api", data=data if method != "GET" else None, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, (json.loads(text) if text else {})
port, mode = sys.argv[1], sys.argv[2]
prompt = "In the beginning"
if mode == "greedy":  # prints the greedy tokens; both spellings of greedy agree
    s1, a = put(port, {"prompts": [prompt], "tokens_to_generate": 8, "top_k": 1, "stop_token": None})
    s2, b = put(port, {"prompts": [prompt], "tokens_to_generate": 8, "greedy": True, "stop_token": None})
    assert s1 == 200 and s2 == 200, (s1, a, s2, b)
    assert a["tokens"] == b["tokens"], (a, b)
    assert a["text"][0].startswith(prompt), a
    print(",".join(str(t) for t in a["tokens"][0]))
elif mode == "api":
    s, r = put(port, {"prompts": [prompt, "And God said"], "tokens_to_generate": 5, "top_p": 0.9,
                      "random_seed": 7, "stop_token": None})
    assert s == 200 and len(r["text"]) == 2 and len(r["tokens"]) == 2 and all(len(t) == 5 for t in r["tokens"]), r
    assert r["text"][1].startswith("And God said") and r["stopped"] == [False, False], r
    s, again = put(port, {"prompts": [prompt, "And God said"], "tokens_to_generate": 5, "top_p": 0.9,
                          "random_seed": 7, "stop_token": None})
    assert again == r, ("the same seed drew other tokens", r, again)
    s, other = put(port, {"prompts": [prompt, "And God said"], "tokens_to_generate": 5, "top_p": 0.9,
                          "random_seed": 8, "stop_token": None})
    assert s == 200 and other["tokens"] != r["tokens"], ("another seed drew the same tokens", r, other)
    s, ids = put(port, {"prompt_tokens": [[73, 110, 32]], "tokens_to_generate": 3, "top_k": 1})
    assert s == 200 and len(ids["tokens"][0]) <= 3, ids
    assert r["logprobs"] is None and len(r["segments"][1]) == len("And God said") + 5, r
    assert "".join(r["segments"][1][:12]) == "And God said", r
    for body, code, words in [({"prompts": [prompt], "beam": 2}, 400, "unknown field 'beam'"),
                              ({"prompts": [prompt], "length_penalty": 2, "tokens_to_generate": 4}, 400,
                               "'length_penalty' scores beam search's hypotheses: add 'beam_width'"),
                              ({"prompts": [prompt, prompt], "beam_width": 2, "tokens_to_generate": 4}, 400,
                               "beam search takes one prompt"),
                              ({"prompts": [prompt], "beam_width": 2, "temperature": 0.5, "tokens_to_generate": 4}, 400,
                               "'temperature': 0.5 has no effect on beam search"),
                              ({"prompts": [prompt], "beam_width": 2, "logprobs": True, "tokens_to_generate": 4}, 400,
                               "'logprobs': true has no effect on beam search"),
                              ({"prompts": [prompt], "beam_width": 0, "tokens_to_generate": 4}, 400,
                               "'beam_width' must be 1 to"),
                              ({"prompts": [prompt], "beam_width": 2.5, "tokens_to_generate": 4}, 400,
                               "'beam_width' must be a whole number"),
                              ({"prompts": [prompt], "logprobs": "yes", "tokens_to_generate": 4}, 400, "'logprobs' must be true or false"),
                              ({"prompts": [prompt], "tokens_to_generate": 0}, 400, "0 scores the prompts alone: add"),
                              ({"prompts": [prompt], "stop_on_eol": True, "stop_on_double_eol": True, "tokens_to_generate": 4}, 400,
                               "contradict each other; keep one"),
                              ({"prompts": [prompt], "top_p_decay": 0.9, "tokens_to_generate": 4}, 400, "'top_p_decay' decays 'top_p'"),
                              ({"prompts": [prompt], "top_p": 0.9, "top_p_bound": 0.5, "tokens_to_generate": 4}, 400,
                               "'top_p_bound' bounds 'top_p_decay''s decay"),
                              ({"prompts": [prompt], "tokens_to_generate": 1000}, 400, "ask for 48 tokens or fewer"),
                              ({"prompts": [prompt], "tokens_to_generate": 4, "temperature": 0}, 400, "'temperature' must be a positive"),
                              ({"tokens_to_generate": 4}, 400, "give 'prompts'"),
                              ("not json", 400, "the request is not JSON")]:
        s, r = put(port, body)
        assert s == code and words in r.get("error", ""), (body, s, r)
    s, _ = put(port, {}, method="GET")
    assert s in (404, 405), s
    print("api ok")
elif mode == "megatron":  # Megatron's other fields; argv[3]: generate_text --logprobs's JSON for the prompt
    want = json.load(open(sys.argv[3]))
    s, r = put(port, {"prompts": [prompt], "tokens_to_generate": 8, "greedy": True, "stop_token": None,
                      "logprobs": True, "no_log": True})
    assert s == 200 and r["tokens"][0] == want["tokens"], (r, want)
    n = len(want["prompt_tokens"]) + len(want["tokens"])
    assert len(r["logprobs"][0]) == n - 1 and len(r["segments"][0]) == n, r
    assert all(abs(a - b) <= 1e-9 * max(1, abs(b)) for a, b in zip(r["logprobs"][0], want["logprobs"])), (r, want)
    assert all(lp <= 0 for lp in r["logprobs"][0]), r
    s, score = put(port, {"prompts": [prompt], "tokens_to_generate": 0, "logprobs": True})
    assert s == 200 and score["tokens"] == [[]] and score["text"] == [prompt], score
    assert score["logprobs"][0] == r["logprobs"][0][:len(prompt) - 1], (score, r)
    s, bos = put(port, {"prompts": [prompt], "tokens_to_generate": 0, "logprobs": True, "add_BOS": True})
    assert s == 200 and len(bos["logprobs"][0]) == len(prompt) and len(bos["segments"][0]) == len(prompt) + 1, bos
    # stop_on_eol: a seed's tokens up to the first "\n" (byte 10) drawn, kept (the stop changes no draw
    # before it); seeds tried until one draws a "\n".
    cuts = 0
    for seed in range(60):
        sampled = {"prompts": [prompt], "tokens_to_generate": 40, "temperature": 4.0, "stop_token": None,
                   "random_seed": seed}
        s, plain = put(port, sampled)
        s2, eol = put(port, dict(sampled, stop_on_eol=True))
        p = plain["tokens"][0]
        cut = p[:p.index(10) + 1] if 10 in p else p
        assert s == s2 == 200 and eol["tokens"][0] == cut and eol["stopped"] == [10 in p], (plain, eol)
        cuts += 10 in p[:-1]
        if cuts == 2:
            break
    assert cuts == 2, "no seed drew a line end before the last token"
    s, colon = put(port, {"prompts": [prompt + ":"], "tokens_to_generate": 4, "greedy": True, "stop_token": None,
                          "prevent_newline_after_colon": True})
    assert s == 200 and colon["tokens"][0][0] != 10, colon
    body = {"prompts": [prompt], "tokens_to_generate": 6, "top_p": 0.9, "top_p_decay": 0.5, "top_p_bound": 0.2,
            "random_seed": 3}
    s, d1 = put(port, body)
    s2, d2 = put(port, body)
    assert s == s2 == 200 and d1 == d2, (d1, d2)
    print("megatron ok; seeds tried for two line stops:", seed + 1)
elif mode == "beam":  # argv[3]: generate_text --beam-width 3 --length-penalty 0.7's JSON for the prompt
    want = json.load(open(sys.argv[3]))["hypotheses"]
    s, r = put(port, {"prompts": [prompt], "tokens_to_generate": 6, "beam_width": 3, "length_penalty": 0.7,
                      "stop_token": None, "random_seed": -1, "temperature": 1.0})
    assert s == 200 and r["tokens"] == [h["tokens"] for h in want], (r, want)
    assert all(abs(a - h["score"]) <= 1e-9 * max(1, abs(h["score"])) for a, h in zip(r["scores"], want)), (r, want)
    assert r["scores"] == sorted(r["scores"], reverse=True) and len(r["text"]) == 3, r
    assert all(t.startswith(prompt) for t in r["text"]) and len(r["segments"][0]) == len(prompt) + 6, r
    print("beam ok")
elif mode == "beam_tp":  # at TP 2: three hypotheses, best first, the first one's first token one rank's
    want = json.load(open(sys.argv[3]))["hypotheses"]
    s, r = put(port, {"prompts": [prompt], "tokens_to_generate": 6, "beam_width": 3, "length_penalty": 0.7,
                      "stop_token": None})
    assert s == 200 and len(r["tokens"]) == 3 and all(len(t) == 6 for t in r["tokens"]), r
    assert r["scores"] == sorted(r["scores"], reverse=True), r
    assert r["tokens"][0][0] == want[0]["tokens"][0], (r, want)
    print("beam at TP 2 ok")
EOF
tokens_of() { "$python" -c 'import json, sys; print(",".join(str(t) for t in json.load(open(sys.argv[1]))["tokens"]))' "$1"; }

# 1.
step train mpiexec -n 2 "$train" --config "$cfg" --mock-data --vocab-size 257 --train-iters 2 --eval-iters 0 \
  --save "$work/bytes"
step generate "$generate" --load "$work/bytes" --prompt "In the beginning" --tokenizer-type ByteLevel --greedy \
  --no-stop --max-new-tokens 8 --logprobs --output "$work/generated.json"
want=$(tokens_of "$work/generated.json")
step beam "$generate" --load "$work/bytes" --prompt "In the beginning" --tokenizer-type ByteLevel --beam-width 3 \
  --length-penalty 0.7 --no-stop --max-new-tokens 6 --output "$work/beam.json"
grep -q "generate_text: hypothesis 3: score" "$work/beam.log" || fail "generate_text --beam-width 3 printed no third hypothesis"

# 2. and 3.
start server "$server" --load "$work/bytes" --tokenizer-type ByteLevel --port 0
one=$pid one_port=$port
got=$("$python" "$work/client.py" "$port" greedy 2>"$work/client_greedy.log") || fail "greedy requests: $(cat "$work/client_greedy.log")"
[ "$got" = "$want" ] || fail "the server's greedy tokens ($got) are not generate_text's ($want)"
"$python" "$work/client.py" "$port" api >"$work/client_api.log" 2>&1 || fail "the API's answers: $(cat "$work/client_api.log")"
"$python" "$work/client.py" "$port" megatron "$work/generated.json" >"$work/client_megatron.log" 2>&1 ||
  fail "Megatron's other fields: $(cat "$work/client_megatron.log")"
"$python" "$work/client.py" "$port" beam "$work/beam.json" >"$work/client_beam.log" 2>&1 ||
  fail "beam search: $(cat "$work/client_beam.log")"
timeout 120 "$server" --load "$work/bytes" --tokenizer-type ByteLevel --port "$one_port" >"$work/taken.log" 2>&1
rc=$?
[ "$rc" = 2 ] && [ "$(grep -c "cannot listen there" "$work/taken.log")" = 1 ] ||
  fail "a second server on port $one_port was not refused with exit 2 (rc $rc)"
grep -q "request 1: 1 prompt, up to 8 new tokens each, status 200" "$work/server.log" || fail "the server logged no request"
[ "$(grep -c "up to 8 new tokens each" "$work/server.log")" = 2 ] || fail "no_log did not keep a request out of the log"

# 4.
stop "$one" server

# 5.
start server_tp mpiexec -n 2 "$server" --load "$work/bytes" --tokenizer-type ByteLevel --port 0
grep -q "split over 2 ranks (tensor parallel)" "$work/server_tp.log" || fail "the server under mpiexec -n 2 did not split the model"
got_tp=$("$python" "$work/client.py" "$port" greedy 2>"$work/client_tp.log") || fail "greedy requests at TP 2: $(cat "$work/client_tp.log")"
[ "${got_tp%%,*}" = "${want%%,*}" ] || fail "the first greedy token at TP 2 (${got_tp%%,*}) is not one rank's (${want%%,*})"
"$python" "$work/client.py" "$port" beam_tp "$work/beam.json" >"$work/client_beam_tp.log" 2>&1 ||
  fail "beam search at TP 2: $(cat "$work/client_beam_tp.log")"
stop "$pid" server_tp
echo "generation_server_e2e: passed (greedy $want; TP 2 $got_tp)"

#!/usr/bin/env bash
# prefetch_bad_data_e2e.sh PRETRAIN_GPT PREPROCESS_DATA: the trainer makes the
# next iteration's batch while the device runs the optimizer step
# (megazero/trainer/trainer.cpp). A bad sample found that early must change
# nothing the user sees: the iteration before it still logs and saves its
# checkpoint, and the run then stops at the bad sample's own iteration with
# the data error (exit 2, on both ranks alike), as it did when each batch
# was made at the start of its iteration.
#
# The corpus: 300 byte-level documents of characters below 'd' (ids < 100),
# two of them holding 'z' (id 122), trained with --vocab-size 100. Which
# iteration first reads a 'z' depends on the dataset's shuffle (fixed by the
# seed); the test reads it from the error's sample index and fails unless it
# is past the first iteration (a batch the previous step made).
set -u
exe=$1 preprocess=$2
tmp=$(mktemp -d)
trap '[ -n "${MZ_KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail() {
  echo "prefetch_bad_data_e2e: $*" >&2
  echo "---- log" >&2
  cat "$tmp/log" >&2
  exit 1
}

for d in $(seq 1 300); do
  if [ "$d" -eq 170 ] || [ "$d" -eq 240 ]; then
    echo "DOCUMENT $d WITH A zzzz TOKEN"
  else
    echo "DOCUMENT $d: THE QUICK BROWN FOX, 0123456789; AND SO ON $((d * 7919 % 1000))."
  fi
  echo
done >"$tmp/corpus.txt"
"$preprocess" --input "$tmp/corpus.txt" --output-prefix "$tmp/corpus" --tokenizer-type ByteLevel >/dev/null ||
  fail "preprocess_data failed"

global=4
mpiexec -n 2 "$exe" --data-path "$tmp/corpus" --vocab-size 100 --num-layers 1 --hidden-size 32 \
  --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16 --micro-batch-size 2 \
  --global-batch-size $global --train-iters 60 --lr 1e-3 --log-interval 1 --eval-iters 0 \
  --save "$tmp/ck" --save-interval 1 >"$tmp/log" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "exit code $rc, want 2 (the data error)"
grep -qE "token id 122 in sample [0-9]+ is outside the vocabulary of --vocab-size 100" "$tmp/log" ||
  fail "no data error naming token 122"
sample=$(grep -oE "token id 122 in sample [0-9]+" "$tmp/log" | head -1 | grep -oE "[0-9]+$")
bad=$((sample / global + 1))  # the iteration that reads the sample (training starts at sample 0)
[ "$bad" -ge 2 ] || fail "sample $sample is read by iteration $bad: not a prefetched batch; change the corpus"
last=$((bad - 1))
grep -qE "^ iteration +$last/ +60 " "$tmp/log" || fail "iteration $last (before the bad sample) did not log"
grep -qE "^ iteration +$bad/ +60 " "$tmp/log" && fail "iteration $bad (the bad sample's) logged"
[ -d "$tmp/ck/$(printf 'iter_%07d' "$last")" ] || fail "no checkpoint of iteration $last: $(ls "$tmp/ck" | tr '\n' ' ')"
[ -d "$tmp/ck/$(printf 'iter_%07d' "$bad")" ] && fail "a checkpoint of iteration $bad"
echo "prefetch_bad_data_e2e: iteration $last logged and saved; iteration $bad stopped on sample $sample (exit 2)"

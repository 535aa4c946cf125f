#!/usr/bin/env bash
# sentencepiece_e2e.sh PRETRAIN_GPT PREPROCESS_DATA GENERATE_TEXT MODEL CONFIG: a Llama-style
# run on SentencePiece-tokenized data, as a Megatron user makes it, through the real executables:
#  1. preprocess_data --tokenizer-type Llama2Tokenizer --tokenizer-model MODEL --append-eod: every
#     document starts with <s> (1) and ends with </s> (2), and GPTSentencePieceTokenizer writes the
#     same ids without the <s>;
#  2. pretrain_gpt on it at TP 2 x DP 2, ZeRO 3 (a process that also loads protobuf for TensorBoard:
#     SentencePiece's own protobuf copy must stay local), --vocab-size taken from the model and
#     --eod-mask-loss masking its </s>, with TensorBoard events written;
#  3. generate_text continues a text prompt from the checkpoint (<s> first in the prompt's ids);
#  4. the refusals: a model without its type, a type without its model, a --vocab-size below the
#     model's pieces, a missing SentencePiece module.
set -u
train=$1 preprocess=$2 generate=$3 model=$4 cfg=$5
corpus=$(dirname "$0")/../../data/corpus/kjv.txt
work=$(mktemp -d /tmp/mz-sp-XXXXXX)
trap 'rm -rf "$work"' EXIT
script=sentencepiece_e2e
source "$(dirname "$0")/e2e_steps.sh"
u16() { od -An -tu2 -v "$1" | tr -s ' ' '\n' | grep -v '^$'; }  # the .bin's token ids (uint16)

# 1. The data.
step llama "$preprocess" --input "$corpus" --output-prefix "$work/kjv_llama" --tokenizer-type Llama2Tokenizer \
  --tokenizer-model "$model" --append-eod
step gptsp "$preprocess" --input "$corpus" --output-prefix "$work/kjv_gptsp" --tokenizer-type GPTSentencePieceTokenizer \
  --tokenizer-model "$model" --append-eod
grep -q "(Llama2Tokenizer, uint16)" "$work/llama.log" || fail "preprocess_data did not report Llama2Tokenizer"
step llama2 "$preprocess" --input "$corpus" --output-prefix "$work/kjv_llama2" --tokenizer-type Llama2Tokenizer \
  --tokenizer-model "$model" --append-eod --workers 2
cmp -s "$work/kjv_llama.bin" "$work/kjv_llama2.bin" && cmp -s "$work/kjv_llama.idx" "$work/kjv_llama2.idx" ||
  fail "--workers 2 (the model loaded again) wrote other bytes than one worker"
u16 "$work/kjv_llama.bin" >"$work/llama.ids"
u16 "$work/kjv_gptsp.bin" >"$work/gptsp.ids"
[ "$(head -1 "$work/llama.ids")" = 1 ] || fail "the first document does not start with <s> (1)"
[ "$(tail -1 "$work/llama.ids")" = 2 ] || fail "the last document does not end with </s> (2)"
docs=$(grep -o "[0-9]* documents" "$work/llama.log" | cut -d' ' -f1)
[ "$(grep -c '^1$' "$work/llama.ids")" -ge "$docs" ] || fail "fewer <s> than the $docs documents"
# Without the <s> ids, the Llama data is the GPTSentencePieceTokenizer data.
awk 'prev == 2 || NR == 1 { prev = $0; if ($0 == 1) next } { prev = $0; print }' "$work/llama.ids" | cmp -s - "$work/gptsp.ids" ||
  fail "Llama2Tokenizer's ids less its <s> differ from GPTSentencePieceTokenizer's"

# 2. Training.
step train mpiexec -n 4 "$train" --config "$cfg" --data-path "$work/kjv_llama" --tokenizer-type Llama2Tokenizer \
  --tokenizer-model "$model" --eod-mask-loss --tensor-model-parallel-size 2 --zero-stage 3 --train-iters 6 \
  --log-interval 2 --eval-interval 6 --eval-iters 1 --save "$work/ckpt" --tensorboard-dir "$work/tb"
grep -q -- "--vocab-size 1000 from --tokenizer-model" "$work/train.log" || fail "the vocabulary size was not the model's"
grep -q "no loss where the input is token 2 (--eod-mask-loss)" "$work/train.log" || fail "--eod-mask-loss did not mask </s>"
grep -q "iteration        6/       6" "$work/train.log" || fail "training did not reach iteration 6"
ls "$work"/tb/events.out.tfevents.* >/dev/null 2>&1 || fail "no TensorBoard events beside SentencePiece"

# 3. Generation from a text prompt.
step generate "$generate" --load "$work/ckpt" --tokenizer-type Llama2Tokenizer --tokenizer-model "$model" \
  --prompt "And God said" --greedy --max-new-tokens 8 --no-stop --output "$work/gen.json"
grep -q '"prompt_tokens":\[1,' "$work/gen.json" || fail "the prompt's ids do not start with <s>"
grep -q '"tokens":\[[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*\]' "$work/gen.json" ||
  fail "not 8 new tokens"
grep -q '^And God said' "$work/generate.log" || fail "the printed text does not start with the prompt"

# 4. Refusals.
refused model-without-type "read only with --tokenizer-type Llama2Tokenizer" \
  "$train" --config "$cfg" --mock-data --tokenizer-model "$model" --train-iters 1
refused type-without-model "needs --tokenizer-model" \
  "$train" --config "$cfg" --mock-data --tokenizer-type Llama2Tokenizer --train-iters 1
refused vocab-below-model "is smaller than --tokenizer-model" \
  "$train" --config "$cfg" --mock-data --tokenizer-type Llama2Tokenizer --tokenizer-model "$model" --vocab-size 500 \
  --train-iters 1
refused no-module "libmegazero_sentencepiece.so) was not found" \
  env MEGAZERO_SENTENCEPIECE_MODULE=/nonexistent/libmegazero_sentencepiece.so "$preprocess" --input "$corpus" \
  --output-prefix "$work/x" --tokenizer-type Llama2Tokenizer --tokenizer-model "$model"
echo "sentencepiece_e2e: passed"

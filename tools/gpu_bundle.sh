#!/usr/bin/env bash
# Packs CUDA-built megazero binaries with the non-CUDA shared libraries they
# need (MPICH and its UCX, OpenBLAS, oneDNN, Boost, libstdc++) into
# .gpu/bundle.tar.xz, for a GPU machine that has the NVIDIA driver, cuBLAS,
# cuDNN and NCCL but none of our other dependencies (and no package access).
# tools/gpu_session.sh unpacks and runs it there.
#   tools/gpu_bundle.sh [BUILD_DIR]     (default /tmp/build-gpu)
# A BUILD_DIR that does not exist yet is configured for the lent GPUs only
# (H100 and H200: sm_90 machine code, no PTX). Each binary links the whole
# library, CUDA kernels included, so the then default architectures (sm_80 and
# sm_90, each with PTX) made a 72 MB bundle; the device tool carries at most
# 64 MiB. The bundle's size is checked at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-/tmp/build-gpu}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMEGAZERO_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real
else
  cmake "$build" > /dev/null  # an existing build dir learns targets added since it was configured
fi
archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")
archs=${archs:-the default (native with a GPU, else 80-virtual 90-real)}
[ "$archs" = "90-real" ] ||
  echo "gpu_bundle: note: $build builds CUDA architectures '$archs'; a build for 90-real alone packs about 3x smaller" >&2
targets=(test_cuda test_nccl test_gpt_tp test_zero test_zero_precision test_zero_r test_gemm
         test_layernorm_kernels test_gelu_bias_kernels test_softmax_kernels test_dropout_kernels
         test_embedding_kernels test_cross_entropy_kernels test_kernel_conventions
         test_rmsnorm_kernels test_swiglu_kernels test_rope_kernels test_activation_memory
         test_cudnn_attention test_sdpa_graph test_layer_gradients test_linear_epilogues
         test_collectives bench_collectives bench_layer bench_kernels bench_gpt pretrain_gpt convert_checkpoint generate_text)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" megazero_sentencepiece
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib/ucx"
for t in "${targets[@]}"; do
  f=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  [ -n "$f" ] || { echo "gpu_bundle: $t was not built in $build" >&2; exit 1; }
  strip -o "$stage/bin/$t" "$f"
done
# SentencePiece, loaded at run time from ../lib beside bin/ (data/sentencepiece_tokenizer.h).
strip -o "$stage/lib/libmegazero_sentencepiece.so" "$(find "$build" -type f -name libmegazero_sentencepiece.so | head -1)"
cp /usr/bin/mpiexec.hydra /usr/bin/hydra_pmi_proxy "$stage/bin/"
# The end-to-end scripts (tests/cli) call plain `mpiexec`.
ln -s mpiexec.hydra "$stage/bin/mpiexec"
# Everything the binaries load except glibc, the driver and the CUDA libraries
# the GPU machine brings (cuBLAS is 600 MB; cuDNN and NCCL come with PyTorch there).
ldd "$stage"/bin/* "$stage"/lib/libmegazero_sentencepiece.so 2>/dev/null | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcublas|libcublasLt|libcudnn[^/]*|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
cp -L /usr/lib/x86_64-linux-gnu/ucx/*.so.0 "$stage/lib/ucx/" 2>/dev/null || true
# The bundled corpus's dataset (tools/setup_data.sh makes it; data/ is git-ignored, so the working
# tree the device tool sends lacks it): gpu_session.sh's `documents` phase trains on it.
corpus=data/corpus/kjv_text_document
[ -f "$corpus.bin" ] && [ -f "$corpus.idx" ] ||
  { echo "gpu_bundle: $corpus.{bin,idx} is missing: run tools/setup_data.sh first" >&2; exit 1; }
mkdir -p "$stage/data/corpus"
cp "$corpus.bin" "$corpus.idx" "$stage/data/corpus/"
# Which commit the binaries are (the GPU session prints it first in env.txt), "-dirty" when the
# working tree had changes then.
echo "commit $(git describe --always --dirty 2>/dev/null || echo unknown), built $(date -u +%Y-%m-%dT%H:%MZ)" \
  > "$stage/BUILD_INFO"
mkdir -p .gpu
tar -C "$stage" -cf - . | xz -T0 -6 > .gpu/bundle.tar.xz
rm -rf "$stage"
ls -la .gpu/bundle.tar.xz
bytes=$(stat -c %s .gpu/bundle.tar.xz)
limit=$((60 << 20))  # the device tool carries 64 MiB in all; leave room for the rest
if [ "$bytes" -gt "$limit" ]; then
  echo "gpu_bundle: .gpu/bundle.tar.xz is $((bytes >> 20)) MiB, over the $((limit >> 20)) MiB it may be to travel" \
       "to a GPU machine; build for the lent GPUs only (a new BUILD_DIR is configured with" \
       "-DCMAKE_CUDA_ARCHITECTURES=90-real) or drop targets" >&2
  exit 1
fi

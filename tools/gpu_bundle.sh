#!/usr/bin/env bash
# Packs CUDA-built megazero binaries with the non-CUDA shared libraries they
# need (MPICH and its UCX, OpenBLAS, oneDNN, Boost, libstdc++) into
# .gpu/bundle.tar.xz, for a GPU machine that has the NVIDIA driver, cuBLAS,
# cuDNN and NCCL but none of our other dependencies (and no package access).
# tools/gpu_session.sh unpacks and runs it there.
#   tools/gpu_bundle.sh [BUILD_DIR]     (default /tmp/build-gpu, configured with -DMEGAZERO_CUDA=ON)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-/tmp/build-gpu}
targets=(test_cuda test_nccl test_gpt_tp test_zero test_zero_precision test_zero_r test_gemm
         test_layernorm_kernels test_gelu_bias_kernels test_softmax_kernels test_dropout_kernels
         test_embedding_kernels test_cross_entropy_kernels test_kernel_conventions
         test_rmsnorm_kernels test_swiglu_kernels test_rope_kernels test_activation_memory
         test_cudnn_attention test_sdpa_graph test_layer_gradients
         test_collectives bench_layer bench_kernels bench_gpt pretrain_gpt convert_checkpoint)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib/ucx"
for t in "${targets[@]}"; do
  f=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  [ -n "$f" ] || { echo "gpu_bundle: $t was not built in $build" >&2; exit 1; }
  strip -o "$stage/bin/$t" "$f"
done
cp /usr/bin/mpiexec.hydra /usr/bin/hydra_pmi_proxy "$stage/bin/"
# The end-to-end scripts (tests/cli) call plain `mpiexec`.
ln -s mpiexec.hydra "$stage/bin/mpiexec"
# Everything the binaries load except glibc, the driver and the CUDA libraries
# the GPU machine brings (cuBLAS is 600 MB; cuDNN and NCCL come with PyTorch there).
ldd "$stage"/bin/* 2>/dev/null | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcublas|libcublasLt|libcudnn[^/]*|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
cp -L /usr/lib/x86_64-linux-gnu/ucx/*.so.0 "$stage/lib/ucx/" 2>/dev/null || true
mkdir -p .gpu
tar -C "$stage" -cf - . | xz -T0 -6 > .gpu/bundle.tar.xz
rm -rf "$stage"
ls -la .gpu/bundle.tar.xz

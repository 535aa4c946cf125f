#!/usr/bin/env bash
# Runs on a GPU machine from the repository root: unpacks .gpu/bundle.tar.xz
# (tools/gpu_bundle.sh), finds cuBLAS/cuDNN/NCCL there, and runs the phases
# asked for, writing each phase's log to $OUT (or ./gpu-out):
#   paths  - every user path of a GPU run, 2 and 4 ranks sharing the GPU over
#            MPI (tests/cli/device_paths_e2e.sh and checkpoint_e2e.sh with cuda):
#            save -> resume bit-exact in fp32/bf16/fp16, ZeRO 0-3 with
#            checkpoints, GPU <-> CPU and relayout resume, SIGTERM/SIGUSR1
#            saves, kill -9 mid-save, NaN stop, --device-arena with saves, HF
#            export -> import -> identical logits, the memory pre-flight, the
#            Llama-style model with --sequence-parallel (exact resume, the
#            CPU's losses); and
#            test_zero_precision / test_zero_r on cuda. All passed on an H200 (2026-11-26).
#   tests  - test_cuda (CPU vs GPU, every kernel and a whole GPT), test_gemm,
#            the layer kernel suites (test_*_kernels, test_kernel_conventions),
#            and the TP-equivalence and ZeRO suites with
#            MEGAZERO_TEST_DEVICE=cuda on 1 and 2 ranks sharing the GPU (MPI backend)
#   kernels- test_cuda (every CUDA kernel against the CPU's, a whole GPT) and the
#            kernel suites: a minute at most, for a short lease whose other
#            phases would not otherwise check the kernels changed since the last
#            GPU run
#   quick  - test_cuda and our layer benchmark only
#   layer  - bench_layer (the paper's 100B layer as one TP-16 rank holds it) with
#            the unfused and the fused attention, and the same layer in PyTorch
#            (bench/torch_layer.py), bf16 and fp16
#   profile- per-kernel times of the layer: bench_layer --profile's CUPTI trace of 4 steps at B 32
#            (trace-layer.txt), then Nsight Compute on one step at B 8 (cuDNN attention unless MZ_ATTENTION)
#   profile-gpt - per-kernel times of two 355M iterations with cuDNN attention: pretrain_gpt --profile's
#            CUPTI trace (real clocks, the device's busy share and idle gaps; trace-gpt.txt/.csv), then
#            Nsight Compute (MZ_ATTENTION picks another backend): the kernels beside the GEMMs that #21
#            still pays for
#   train  - pretrain_gpt --device cuda on a GPT-2 350M-class model (mock data)
#   peers  - ours and the PyTorch peers back to back on this GPU (issue #21): pretrain_gpt on
#            GPT-2 medium 355M (bf16, B 8, seq 1024, 30 iterations; attention cudnn, cudnn with
#            --gemm-epilogues, with --gemm-epilogues --gemm-autotune, unfused, fused) against bench/torch_gpt.py eager and --compile (the
#            last 10 of 30 iterations each); bench_layer (the 100B layer as one TP-16 rank holds
#            it, bf16, the same variants)
#            against bench/torch_layer.py SDPA eager and --compile. Log in peers.txt, the ratio
#            table (tools/peer_ratios.py: speed ours/theirs, MFU, peak memory, the #21 goals) in
#            peers-ratios.txt. peers-gpt / peers-layer run one half each (peers-gpt.txt, ...).
#   cudnn  - --attention-backend cudnn (issue #21 item 1): test_cudnn_attention's GPU half (cuDNN
#            against our fp64 fused attention through strided QKV views, dropout's kept fraction
#            and forward/backward mask agreement, the plan cache), test_gpt_tp/test_cuda's model
#            paths, bench_layer unfused/fused/cudnn, the 355M run and llama_tiny (GQA) with cudnn; cuDNN's own
#            log (CUDNN_LOGLEVEL_DBG=2) in cudnn-api.log for a graph it refuses. Also --gemm-epilogues
#            (cuBLASLt epilogues): test_linear_epilogues' GPU half, the model's TP test with them in fp32,
#            the 355M run with cudnn + epilogues (dropout 0: the four 355M runs' losses agree to
#            rounding). Run it after paths and kernels.
#   cudnn-tests - the cudnn phase without its four 355M runs: the tests and the llama_tiny TP 2 runs
#   cudnn-engines - the 100B layer and the 355M step with each engine configuration cuDNN offers
#            for the attention (MEGAZERO_CUDNN_ENGINE=k), against its first choice
#   cudnn-bench - bench_layer (the 100B layer) unfused, fused, cudnn, cudnn + epilogues, cudnn
#            deterministic.
#   zero3  - ZeRO on 2 ranks sharing the GPU (issue #21's last goal): first bench_collectives on GPU
#            tensors over MPI's messages and over the shared-memory transport (--distributed-backend
#            shm: device slots in CUDA IPC memory, and with MEGAZERO_SHM_DEVICE_SLOTS=0 DMA to one
#            page-locked host segment; no MPICH in the data path); then stages 0-3 and stage 3
#            without its prefetch over shm, stage 3 (with and without) over shm's host slots,
#            stages 0 and 3 (with and without the prefetch) over MPI: step time and the exposed DP
#            communication the prefetch leaves; recompute
#            with and without Pa+cpu; last, tests/cli/shm_backend_e2e.sh on cuda (4 ranks: shm's
#            losses are MPI's).
#   documents - --reset-position-ids --reset-attention-mask on the 355M model over the bundled corpus
#            (GPT-2 BPE, ~890-token documents: one or two a 1024-token sample), bf16, dropout 0: the
#            unfused, fused and cudnn (its additive bias) attentions must agree on the loss to
#            rounding; their step times, against cudnn without the masks, decide which backend
#            Megatron's auto picks with them
#   combos - tests/cli/feature_combos.py on cuda (~4 min for MZ_COMBOS=24): random combinations of the
#            model's features and layouts (TP, SP, ZeRO stage, ZeRO-R, offload, overlaps, attention
#            backend with cuDNN, transport), each like one rank on the GPU or refused naming a flag
#   offload - ZeRO-Offload (--optimizer-cpu-offload) on the 355M model, one GPU: step, optimizer
#            timer and peak memory with the state on the device and in host memory (same losses),
#            then the host's AdamW alone (bench_kernels --device cpu)
#   tools/gpu_session.sh paths cudnn tests layer train
# A short lease (one command of at most 600 s): MZ_BUDGET_S=540 bounds the whole
# script, phases in the order given (MZ_PEERS_QUICK=1: the peers phases time only
# cuDNN attention, with and without the epilogues, against torch.compile), e.g.
#   MZ_PEERS_QUICK=1 MZ_BUDGET_S=540 tools/gpu_session.sh kernels peers-gpt peers-layer profile-gpt profile documents
# (2026-11-28's lease: kernels 23 s, peers-gpt 142 s with four of ours, peers-layer 108 s,
# profile-gpt 68 s, profile 37 s, zero3 ~150 s; documents, in zero3's place since, ~2 min.
# cuDNN's engine configurations 0 and 1 tied on the layer, so cudnn-engines can wait.)
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out" /tmp/mz
tar -C /tmp/mz -xJf .gpu/bundle.tar.xz || exit 1
libdirs=/tmp/mz/lib
for lib in libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libcudart.so.13; do
  [ -e "/tmp/mz/lib/$lib" ] && continue
  # A library file or link, never a directory of that name (perf's ~/.debug cache keeps those).
  f=$(find / -xdev \( -path /proc -o -path /sys -o -path /tmp/mz \) -prune -o -name "$lib" \( -type f -o -type l \) \
    -print 2>/dev/null | head -1)
  [ -n "$f" ] && libdirs="$libdirs:$(dirname "$f")"
done
# The PyTorch peers run with the machine's own library path (peer below): the
# bundle's libstdc++/libz/libcudart first on the path is ours, not theirs, and
# torch.compile's Triton builds and loads C launchers with the system toolchain.
host_ld=${LD_LIBRARY_PATH-}
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR=/tmp/mz/lib/ucx PATH="/tmp/mz/bin:$PATH" OMP_NUM_THREADS=4
B=/tmp/mz/bin
# Every run is bounded, so one hang cannot eat the machine's lease. MZ_BUDGET_S
# (seconds, from the start of this script) bounds the whole session too: no run
# outlives it and a phase that would start with under 20 s left is skipped, so
# a lease shorter than the phases asked for still brings back complete logs of
# the phases that ran (e.g. MZ_BUDGET_S=540 under a 600 s command limit).
deadline=$(( ${MZ_BUDGET_S:-86400} ))
left() { echo $(( deadline - SECONDS )); }
bounded() {  # bounded SECS CMD...: timeout SECS, or less when the budget ends sooner
  local t=$1 l; shift
  l=$(left); [ "$l" -lt "$t" ] && t=$l
  [ "$t" -lt 1 ] && { echo "== skipped (session budget spent): $*"; return 124; }
  timeout "$t" "$@"
}
mpi() { bounded "${MZ_RUN_TIMEOUT:-240}" mpiexec.hydra -n "$@"; }
# peer SECS SCRIPT ARGS...: a PyTorch peer, bounded, in the machine's environment;
# TORCH_LOGS=recompiles shows any recompilation after the warm-up (none expected).
peer() {
  local t=$1 path=(-u LD_LIBRARY_PATH); shift
  [ -n "$host_ld" ] && path=(LD_LIBRARY_PATH="$host_ld")
  bounded "$t" env "${path[@]}" TORCH_LOGS=recompiles python3 "$@"
}
# The GPU's clocks, power and throttle reasons every 100 ms while a phase runs
# ($out/$phase-telemetry.csv), and stamp, the run headers' time in nvidia-smi's
# format: tools/gpu_telemetry.py puts the two together, run by run, so a spread
# of step times that follows the SM clock shows as the machine's.
stamp() { date +'%Y/%m/%d %H:%M:%S.%3N'; }
telemetry_start() {
  local q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$q --format=csv,nounits > /dev/null 2>&1 || q=${q%,*}  # an older driver's names
  nvidia-smi --query-gpu=$q --format=csv,nounits -lms 100 > "$out/$phase-telemetry.csv" 2>&1 &
  telemetry_pid=$!
}
telemetry_stop() {
  [ -n "${telemetry_pid:-}" ] || return 0
  kill "$telemetry_pid" 2> /dev/null; wait "$telemetry_pid" 2> /dev/null; telemetry_pid=
}
# Every CUDA kernel against the CPU's (test_cuda), GEMMs, and the kernel suites.
kernel_suites() {
  echo "== test_cuda"; mpi 1 $B/test_cuda
  echo "== test_gemm"; mpi 1 $B/test_gemm
  for t in test_layernorm_kernels test_gelu_bias_kernels test_softmax_kernels test_dropout_kernels \
           test_embedding_kernels test_cross_entropy_kernels test_kernel_conventions; do
    echo "== $t"; mpi 1 "$B/$t"
  done
  for t in test_rmsnorm_kernels test_swiglu_kernels test_rope_kernels; do
    echo "== $t on cuda"; MEGAZERO_TEST_DEVICE=cuda mpi 1 $B/$t
  done
}
{
  echo "bundle: $(cat /tmp/mz/BUILD_INFO 2>/dev/null || echo 'no BUILD_INFO (packed before 2026-11-27)')"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd $B/test_cuda | grep -E "not found|cublas|cudnn|nccl|cudart" || true
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

for phase in "$@"; do
  if [ "$(left)" -lt 20 ]; then
    echo "== phase $phase skipped: $(left) s of MZ_BUDGET_S left" | tee -a "$out/skipped.txt"
    continue
  fi
  echo "== phase $phase starts, $(left) s of the budget left" >> "$out/env.txt"
  case $phase in
    paths)
      # MZ_PATHS_DEVICE=cpu-isolated checks the phase's plumbing on a machine without a GPU.
      dev=${MZ_PATHS_DEVICE:-cuda}
      # A tiny run takes seconds: 120 s each, so one that hangs costs the lease 2 minutes, not 5.
      export MZ_E2E_RUN_TIMEOUT=${MZ_E2E_RUN_TIMEOUT:-120}
      {
        echo "== device_paths_e2e on $dev (2 ranks sharing the GPU)"
        bounded 1200 bash tests/cli/device_paths_e2e.sh $B/pretrain_gpt $B/convert_checkpoint configs/gpt_tiny.cfg "$dev"
        echo "== exit $?"
        echo "== checkpoint_e2e on $dev (4 ranks sharing the GPU: TP 2 x DP 2, ZeRO 2)"
        bounded 900 bash tests/cli/checkpoint_e2e.sh $B/pretrain_gpt configs/gpt_tiny.cfg "$dev"
        echo "== exit $?"
        for t in test_zero_precision test_zero_r; do
          echo "== $t on $dev, 2 ranks"; MEGAZERO_TEST_DEVICE=$dev mpi 2 $B/$t
          echo "== exit $?"
        done
        # The overlaps on the device (2026-11-27): AdamW on the side stream and the parameter
        # all-gather during the next forward give the bits of doing them at the step's end.
        echo "== test_zero's overlap and offload tests on $dev, 2 ranks"
        MEGAZERO_TEST_DEVICE=$dev mpi 2 $B/test_zero \
          --gtest_filter='Zero.OptimizerBeside*:Zero.ParameterGather*:Zero.EveryStageWaits*:Zero.OffloadedOptimizer*'
        echo "== exit $?"
        echo "== overlap_same_bits_e2e on $dev (2 ranks sharing the GPU)"
        bounded 600 bash tests/cli/overlap_same_bits_e2e.sh $B/pretrain_gpt configs/gpt_tiny.cfg "$dev"
        echo "== exit $?"
      } > "$out/paths.txt" 2>&1
      grep -E "^==|^device_paths_e2e|^checkpoint_e2e|^overlap_same_bits_e2e|FAIL|PASSED|FAILED" "$out/paths.txt" | tail -60
      ;;
    kernels)
      {
        kernel_suites
        # The optimizer's two passes over GPT-2 medium's 354.9M parameters (bf16 gradients and
        # parameters): the step's 4.9 ms on the 2026-11-26 H200 was twice its memory time.
        echo "== bench_kernels at GPT-2 medium's shapes (gradient sums, cross-entropy, optimizer passes)"
        bounded 120 $B/bench_kernels --device cuda --dtype bf16 --cols 4096 --hidden 1024 --ce-rows 8192 \
          --ce-vocab 50304 --adam-elements 354871296
        # The 100B layer's residual width ([32768, 8192]): LayerNorm's backward in one pass
        # (two packs a thread, 64 KB of shared memory a block) against the split one.
        echo "== bench_kernels at the 100B layer's residual shape"
        bounded 120 $B/bench_kernels --device cuda --dtype bf16 --rows 32768 --cols 2048 --hidden 8192 \
          --ce-rows 1024 --adam-elements 1000000
      } > "$out/kernels.txt" 2>&1
      grep -E "^==|PASSED|FAILED|SKIPPED|tests ran|GB/s" "$out/kernels.txt" | tail -48
      ;;
    tests)
      {
        kernel_suites
        echo "== test_nccl (one rank per GPU)"; mpi "$(nvidia-smi -L | wc -l)" $B/test_nccl
        echo "== test_linear_epilogues"; mpi 1 $B/test_linear_epilogues
        echo "== test_activation_memory on cuda"; MEGAZERO_TEST_DEVICE=cuda mpi 1 $B/test_activation_memory
        echo "== test_activation_memory on cuda, 2 ranks"; MEGAZERO_TEST_DEVICE=cuda mpi 2 $B/test_activation_memory
        for n in 1 2; do
          echo "== test_gpt_tp on cuda, $n ranks"; MEGAZERO_TEST_DEVICE=cuda mpi $n $B/test_gpt_tp
          echo "== test_zero on cuda, $n ranks"; MEGAZERO_TEST_DEVICE=cuda mpi $n $B/test_zero
        done
      } > "$out/tests.txt" 2>&1
      grep -E "^==|PASSED|FAILED|SKIPPED|tests ran" "$out/tests.txt" | tail -60
      ;;
    cudnn|cudnn-tests)
      {
        export CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$out/$phase-api.log"
        echo "== test_sdpa_graph"; mpi 1 $B/test_sdpa_graph
        echo "== test_cudnn_attention (GPU half)"; mpi 1 $B/test_cudnn_attention
        unset CUDNN_LOGLEVEL_DBG CUDNN_LOGDEST_DBG
        echo "== test_linear_epilogues (GPU half: cuBLASLt epilogues against the definitions)"
        mpi 1 $B/test_linear_epilogues
        echo "== test_gpt_tp on cuda, GEMM epilogues (fp32 through cuBLASLt, fp64 the plain passes), the one-pass cross-entropy"
        MEGAZERO_TEST_DEVICE=cuda mpi 1 $B/test_gpt_tp --gtest_filter='*GemmEpilogues*:*CrossEntropyGradient*'
        echo "== test_layer_gradients"; mpi 1 $B/test_layer_gradients
        # Dropout 0, one seed: the losses of the four agree to rounding (cuDNN and cuBLASLt against ours, end to end).
        # cudnn-tests: the tests and the small TP runs only (seconds, not minutes).
        [ "$phase" = cudnn ] && for a in fused cudnn "cudnn --gemm-epilogues" "cudnn --gemm-epilogues=all" \
                                         "cudnn --deterministic-mode"; do
          echo "== pretrain_gpt 355M bf16 attention $a"
          mpi 1 $B/pretrain_gpt --device cuda --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \
            --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 8 --global-batch-size 8 \
            --bf16 --mock-data --vocab-size 50257 --train-iters 30 --log-interval 10 --lr 1e-4 --attention-backend $a \
            --attention-dropout 0.0 --hidden-dropout 0.0 --seed 5
          echo "== exit $?"
        done
        for a in fused cudnn; do  # RoPE, RMSNorm, SwiGLU, grouped-query attention, TP 2 on one GPU
          echo "== pretrain_gpt llama_tiny bf16 TP 2 attention $a"
          mpi 2 $B/pretrain_gpt --config configs/llama_tiny.cfg --device cuda --bf16 --mock-data --train-iters 20 \
            --log-interval 10 --attention-backend $a --attention-dropout 0.0 --hidden-dropout 0.0 \
            --tensor-model-parallel-size 2  # the 2026-11-26 run left this out and ran DP 2
          echo "== exit $?"
        done
      } > "$out/$phase.txt" 2>&1
      grep -E "^==|PASSED|FAILED|median|iteration +(10|20|30)/|timers|error|GEMM epilogues|\[lt\]" "$out/$phase.txt" | tail -60
      ;;
    cudnn-engines)
      # Every engine configuration cuDNN offers for the attention, against its first choice
      # (MEGAZERO_CUDNN_ENGINE=k starts the search at k; the log line names the one taken): the
      # 100B layer and the 355M step, both with dropout 0.1, where the first choice may not be fastest.
      {
        for k in 0 1 2 3 4; do
          echo "== MEGAZERO_CUDNN_ENGINE=$k bench_layer 100B layer (TP-16 rank) bf16, attention cudnn"
          MEGAZERO_CUDNN_ENGINE=$k bounded 120 $B/bench_layer --device cuda --dtype bf16 --steps 10 --attention-backend cudnn
          echo "== MEGAZERO_CUDNN_ENGINE=$k pretrain_gpt 355M bf16, attention cudnn"
          MEGAZERO_CUDNN_ENGINE=$k mpi 1 $B/pretrain_gpt --device cuda --num-layers 24 --hidden-size 1024 \
            --num-attention-heads 16 --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 8 \
            --global-batch-size 8 --bf16 --mock-data --vocab-size 50257 --train-iters 20 --log-interval 10 --lr 1e-4 \
            --attention-backend cudnn --eval-iters 0
          echo "== exit $?"
        done
      } > "$out/cudnn-engines.txt" 2>&1
      grep -E "^==|median|engine configuration|iteration +20/|error" "$out/cudnn-engines.txt" | cut -c1-240
      ;;
    cudnn-bench)
      # The 100B layer with each attention backend (peers-layer times the same against PyTorch).
      {
        for a in unfused fused cudnn "cudnn --gemm-epilogues" "cudnn --deterministic-mode"; do
          echo "== bench_layer bf16 $a"; bounded 300 $B/bench_layer --device cuda --dtype bf16 --steps 10 --attention-backend $a
        done
      } > "$out/cudnn-bench.txt" 2>&1
      grep -E "^==|median|error" "$out/cudnn-bench.txt"
      ;;
    quick)
      # A re-check after a kernel change: the CPU-vs-GPU kernel tests and our layer's speed.
      {
        mpi 1 $B/test_cuda
        for a in unfused fused; do bounded 300 $B/bench_layer --device cuda --dtype bf16 --steps 10 --attention-backend $a; done
      } > "$out/quick.txt" 2>&1
      grep -E "PASSED|FAILED|median" "$out/quick.txt"
      ;;
    layer)
      {
        for dt in bf16 fp16; do
          for a in unfused fused; do bounded 300 $B/bench_layer --device cuda --dtype $dt --steps 10 --attention-backend $a; done
          peer 300 bench/torch_layer.py --dtype $dt --steps 10
        done
        # As the paper ran it: activation recompute (model FLOPs still count forward once).
        for a in unfused fused; do
          bounded 300 $B/bench_layer --device cuda --dtype bf16 --steps 10 --recompute-activations --attention-backend $a
        done
        # What the bias-GeLU fusion (on above, Megatron's default) buys: the layer, and the kernels alone.
        bounded 300 $B/bench_layer --device cuda --dtype bf16 --steps 10 --attention-backend fused --no-bias-gelu-fusion
        bounded 300 $B/bench_kernels --device cuda --dtype bf16
        # GPT-2 medium's shapes (B 8): the gradient-sum passes and the cross-entropy, with their GB/s
        # (the 2026-11-24 profile had them at 0.4-1.2 TB/s before the tiled sums and packed cross-entropy).
        bounded 300 $B/bench_kernels --device cuda --dtype bf16 --cols 4096 --hidden 1024 --ce-rows 8192 --ce-vocab 50304
      } > "$out/layer.txt" 2>&1
      cat "$out/layer.txt"
      ;;
    profile-gpt)
      # Per-kernel GPU time of two 355M iterations with cuDNN attention (the #21 goal's
      # configuration, dropout 0.1): what is left besides the GEMMs, by kernel name.
      # First our own trace (pretrain_gpt --profile: CUPTI, the GPU's real clocks, kernels
      # queued as in training, ~20 s): the device's busy share and idle gaps (what launch
      # overheads cost) and each kernel's time over iterations 11-12. Then Nsight Compute
      # (base clocks, caches flushed, one kernel at a time) for each kernel's DRAM bytes.
      {
        mpi 1 $B/pretrain_gpt --device cuda --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \
          --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 8 --global-batch-size 8 \
          --vocab-size 50257 --bf16 --mock-data --train-iters 12 --log-interval 6 --lr 1e-4 --eval-iters 0 \
          --attention-backend "${MZ_ATTENTION:-cudnn}" --profile --profile-file "$out/trace-gpt.csv"
      } > "$out/trace-gpt.txt" 2>&1
      grep -A48 "^kernel trace" "$out/trace-gpt.txt" | head -50
      ncu_bin=$(command -v ncu || find / -xdev -name ncu -type f -perm -u+x 2>/dev/null | head -1)
      {
        bounded 400 "$ncu_bin" --metrics gpu__time_duration.sum,dram__bytes.sum --print-summary per-kernel --csv \
          $B/pretrain_gpt --device cuda --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \
          --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 8 --global-batch-size 8 \
          --vocab-size 50257 --bf16 --mock-data --train-iters 2 --log-interval 1 --lr 1e-4 --eval-iters 0 \
          --attention-backend "${MZ_ATTENTION:-cudnn}"
      } > "$out/profile-gpt.csv" 2>&1
      python3 tools/ncu_summary.py "$out/profile-gpt.csv" | tee "$out/profile-gpt.txt"
      ;;
    profile)
      # Per-kernel GPU time of one layer step (B = 8), summed by kernel name. First the
      # CUPTI trace of four timed steps at the paper's B = 32 (bench_layer --profile).
      bounded 120 $B/bench_layer --device cuda --dtype bf16 --steps 4 --attention-backend "${MZ_ATTENTION:-cudnn}" \
        --profile > "$out/trace-layer.txt" 2>&1
      grep -A45 "^kernel trace" "$out/trace-layer.txt" | head -48
      ncu_bin=$(command -v ncu || find / -xdev -name ncu -type f -perm -u+x 2>/dev/null | head -1)
      {
        bounded 300 "$ncu_bin" --metrics gpu__time_duration.sum,dram__bytes.sum --print-summary per-kernel --csv \
          $B/bench_layer --device cuda --dtype bf16 --micro-batch-size 8 --warmup 1 --steps 1 \
          --attention-backend "${MZ_ATTENTION:-cudnn}"
      } > "$out/profile.csv" 2>&1
      python3 tools/ncu_summary.py "$out/profile.csv" | tee "$out/profile.txt"
      ;;
    train)
      {
        # GPT-2 medium shape (24 x 1024, 16 heads, 355M parameters), bf16, one GPU, mock data.
        # The third run: all device memory in one arena sized by the plan (--device-arena; its log
        # line says how many allocations missed it).
        for v in "unfused" "fused" "cudnn" "fused --device-arena"; do
          echo "== attention $v (NCCL groups on one rank)"
          mpi 1 $B/pretrain_gpt --device cuda --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \
            --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 8 --global-batch-size 8 \
            --bf16 --mock-data --vocab-size 50257 --train-iters 30 --log-interval 10 --lr 1e-4 --attention-backend $v
        done
      } > "$out/train.txt" 2>&1
      grep -E "^==|iteration +(10|20|30)/|error" "$out/train.txt" | tail -20
      ;;
    documents)
      {
        # The bundle's copy of the corpus's dataset (data/ is not in the tree the device tool sends).
        corpus=/tmp/mz/data/corpus/kjv_text_document
        [ -f "$corpus.bin" ] || corpus=data/corpus/kjv_text_document
        [ -f "$corpus.bin" ] || echo "== error: no $corpus.bin: rebuild the bundle (tools/gpu_bundle.sh) after tools/setup_data.sh"
        for a in "cudnn" "unfused --reset-position-ids --reset-attention-mask" \
                 "fused --reset-position-ids --reset-attention-mask" "cudnn --reset-position-ids --reset-attention-mask"; do
          echo "== 355M bf16 corpus attention $a"
          mpi 1 $B/pretrain_gpt --device cuda --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \
            --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 8 --global-batch-size 8 \
            --bf16 --data-path "$corpus" --split 99,1,0 --tokenizer-type GPT2BPETokenizer \
            --vocab-size 50257 \
            --train-iters 30 --log-interval 10 --eval-iters 0 --lr 1e-4 --attention-dropout 0.0 --hidden-dropout 0.0 \
            --seed 5 --attention-backend $a
          echo "== exit $?"
        done
      } > "$out/documents.txt" 2>&1
      grep -E "^==|iteration +(10|20|30)/|documents:|error" "$out/documents.txt" | tail -30
      ;;
    combos)
      # Features in random combinations on the GPU (tests/cli/feature_combos.py --device cuda): the
      # draws CI runs on the CPU (seed 1) and more, every run on the GPU; each layout trains like
      # one rank there to rounding (a checkpoint halfway resumed on another layout too), or is
      # refused naming a flag; cuDNN's attention for half the fused draws.
      MZ_MPIEXEC=mpiexec.hydra bounded 420 python3 tests/cli/feature_combos.py --exe $B/pretrain_gpt --convert $B/convert_checkpoint \
        --device "${MZ_COMBOS_DEVICE:-cuda}" \
        --combos "${MZ_COMBOS:-24}" --seed 1 > "$out/combos.txt" 2>&1
      echo "== exit $?" >> "$out/combos.txt"
      grep -E "FAIL|^feature_combos|^== exit|refused" "$out/combos.txt" | tail -30
      ;;
    offload)
      {
        # ZeRO-Offload (--optimizer-cpu-offload): the 355M model's step on one GPU with the
        # optimizer state on the device and in page-locked host memory (AdamW on the host's
        # cores, the copies pipelined with it): the optimizer timer, the step and the peak
        # device memory; the losses must agree to the bit. Then the host's AdamW alone
        # (bench_kernels --device cpu: the update's rate in host memory, what the time model's
        # host_memory_gbps prices).
        for v in "" "--optimizer-cpu-offload"; do
          echo "== 355M bf16 cudnn, one GPU ${v:-(state on the device)}"
          mpi 1 $B/pretrain_gpt --device cuda --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \
            --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 8 --global-batch-size 8 \
            --bf16 --mock-data --vocab-size 50257 --train-iters 20 --log-interval 10 --lr 1e-4 --eval-iters 0 \
            --attention-backend cudnn --timing-log-level 1 $v
          echo "== exit $?"
        done
        echo "== the host's AdamW over the 355M model's parameters (bench_kernels --device cpu)"
        bounded 120 $B/bench_kernels --device cpu --dtype bf16 --rows 8 --cols 8 --hidden 64 --ce-rows 8 \
          --ce-vocab 64 --adam-elements 354871296 --steps 3
        echo "== exit $?"
      } > "$out/offload.txt" 2>&1
      grep -E "^==|iteration +(10|20)/|timers|ZeRO-Offload|optimizer over|error" "$out/offload.txt" | tail -24
      ;;
    peers|peers-gpt|peers-layer)
      # Each run bounded by MZ_PEER_TIMEOUT (ours under mpi by MZ_RUN_TIMEOUT); a failed or
      # timed-out run leaves no JSON line and shows as n/a in the table.
      pt=${MZ_PEER_TIMEOUT:-420}
      telemetry_start
      gpt=(--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
           --micro-batch-size 8 --vocab-size 50257)
      {
        echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
        # The goals' pair first (ours with cuDNN attention, theirs compiled), so a budget that
        # ends the phase early (MZ_BUDGET_S) still leaves the comparison that matters.
        ours_gpt() {  # ours_gpt BACKEND [NAME_SUFFIX FLAG...]: e.g. ours_gpt cudnn +epilogues --gemm-epilogues
          local backend=$1 name="megazero-$1${2:-}"; shift; [ $# -gt 0 ] && shift
          local m="$out/$phase-metrics-$name.jsonl"
          rm -f "$m"
          echo "== @$(stamp) ours: pretrain_gpt 355M bf16, attention $backend $*"
          mpi 1 $B/pretrain_gpt --device cuda "${gpt[@]}" --max-position-embeddings 1024 --global-batch-size 8 \
            --bf16 --mock-data --train-iters 30 --log-interval 10 --lr 1e-4 --attention-backend "$backend" \
            --eval-iters 0 --metrics-file "$m" "$@"  # no final evaluation (nor its cuDNN plans): theirs has none
          echo "== exit $?"
          python3 tools/peer_ratios.py --from-metrics "$m" --impl "$name"
        }
        theirs_gpt() {
          echo "== @$(stamp) theirs: bench/torch_gpt.py 355M bf16 $*"
          peer "$pt" bench/torch_gpt.py "${gpt[@]}" --dtype bf16 --warmup 20 --steps 10 "$@"
          echo "== exit $?"
        }
        ours_layer() {  # ours_layer BACKEND [FLAG...]
          echo "== @$(stamp) ours: bench_layer 100B layer (TP-16 rank) bf16, attention $*"
          bounded "$pt" $B/bench_layer --device cuda --dtype bf16 --steps 10 --attention-backend "$@"
          echo "== exit $?"
        }
        theirs_layer() {
          echo "== @$(stamp) theirs: bench/torch_layer.py sdpa bf16 $*"
          peer "$pt" bench/torch_layer.py --dtype bf16 --steps 10 --attention sdpa "$@"
          echo "== exit $?"
        }
        if [ "$phase" != peers-layer ]; then
          # --gemm-epilogues is the forward's epilogues only since 2026-11-26 (=all adds the backward's,
          # which cost the H200's 355M backward 5.1 ms while the forward's saved 1.1 ms).
          # =all lost on both H200 leases (0.99x at 355M): only outside MZ_PEERS_QUICK now.
          ours_gpt cudnn; theirs_gpt --compile; ours_gpt cudnn +epilogues --gemm-epilogues
          # The column sums' finish as its own launch (2026-11-28, sixteenth session: folded into the
          # partial kernels by default, 72 launches fewer a 355M step): the fold's A/B.
          MEGAZERO_COLUMN_FINISH=kernel ours_gpt cudnn +epilogues+finish-apart --gemm-epilogues
          # --gemm-autotune (2026-11-27): each GEMM problem's cuBLASLt candidates timed once, the fastest
          # kept; its log line says how much the kept ones beat the heuristics' first.
          ours_gpt cudnn +epilogues+autotune --gemm-epilogues --gemm-autotune
          # --overlap-optimizer (2026-11-27): AdamW run by run of layers on a side stream, each layer's
          # next forward waiting for its own run; the step's end no longer waits for the update.
          ours_gpt cudnn +epilogues+overlap-opt --gemm-epilogues --overlap-optimizer true
          if [ -z "${MZ_PEERS_QUICK:-}" ]; then  # MZ_PEERS_QUICK=1: the rows above only (a short lease)
            ours_gpt cudnn +epilogues-all --gemm-epilogues=all
            ours_gpt unfused; ours_gpt fused; theirs_gpt
            ours_gpt unfused +epilogues --gemm-epilogues  # the epilogues' gain without cuDNN, should cuDNN refuse
          fi
        fi
        if [ "$phase" != peers-gpt ]; then
          ours_layer cudnn; theirs_layer --compile; ours_layer cudnn --gemm-epilogues
          ours_layer cudnn --gemm-epilogues --gemm-autotune  # prints each GEMM's first and kept times
          [ -z "${MZ_PEERS_QUICK:-}" ] &&
            { ours_layer cudnn --gemm-epilogues=all; ours_layer unfused; ours_layer fused; theirs_layer; }
        fi
      } > "$out/$phase.txt" 2>&1
      telemetry_stop
      grep -E "^== |median|iteration +30/|timers|GEMM autotune|^peer_ratios|Error|error" "$out/$phase.txt" | tail -50
      python3 tools/gpu_telemetry.py "$out/$phase.txt" "$out/$phase-telemetry.csv" | tee "$out/$phase-clocks.txt"
      tables=gpt,layer
      [ "$phase" = peers-gpt ] && tables=gpt
      [ "$phase" = peers-layer ] && tables=layer
      python3 tools/peer_ratios.py --bench $tables "$out/$phase.txt" | tee "$out/$phase-ratios.txt"
      ;;
    zero3)
      # Issue #21's goal "ZeRO stage 3 on 2 ranks sharing a GPU with its prefetch overlapping": a
      # GPT-2 small-class model on 2 ranks sharing the GPU (MPI backend: NCCL refuses two ranks on
      # one GPU, so collectives stage through the host on the communicator's thread), stages 0-3.
      # The timers line's "exposed DP comm" is what the prefetch failed to hide.
      {
        # First what the phase's numbers rest on: device marks time the GPU's work, and the
        # staging copies wait only for the point a collective was issued.
        echo "== test_cuda marks, staged copies and the device slots' reduction"
        mpi 1 $B/test_cuda --gtest_filter='Cuda.MarksTimeTheDevicesWorkNotTheLaunch:Cuda.CopiesAfterAMarkDoNotWaitForLaterCompute:Cuda.SlotReductionGivesTheHostsBitsAndSharedBlocksExport'
        # The transports on GPU tensors, 2 ranks sharing the GPU (bf16, 1-64 MiB): MPI's messages,
        # shm through device slots (CUDA IPC, the default) and through the host segment
        # (MEGAZERO_SHM_DEVICE_SLOTS=0).
        for be in mpi shm shm-hostslots; do
          echo "== bench_collectives --device cuda --distributed-backend $be, 2 ranks sharing the GPU"
          MEGAZERO_SHM_DEVICE_SLOTS=$([ $be = shm-hostslots ] && echo 0 || echo 1) \
            mpi 2 $B/bench_collectives --device cuda --distributed-backend ${be%-hostslots} --dtype bf16 \
            --min-bytes 1048576 --max-bytes 67108864 --iters 5
          echo "== exit $?"
        done
        # Stage 3 with its prefetch and without (--stage3-prefetch false), so the difference in
        # step time is what the prefetch hides; over shm first, then over MPI's messages. Stage 2
        # likewise with its parameter all-gather at the end of the step (--overlap-param-gather false).
        for run in "shm 0" "shm 1" "shm 2" "shm 2 --overlap-param-gather false" "shm 3" \
          "shm 3 --stage3-prefetch false" "shm-hostslots 3" \
          "shm-hostslots 3 --stage3-prefetch false" "mpi 0" "mpi 3" "mpi 3 --stage3-prefetch false"; do
          read -r be stage <<<"$run"
          echo "== pretrain_gpt 12 x 768 bf16, 2 ranks sharing the GPU, --distributed-backend $be, ZeRO stage $stage"
          MEGAZERO_SHM_DEVICE_SLOTS=$([ $be = shm-hostslots ] && echo 0 || echo 1) \
            mpi 2 $B/pretrain_gpt --device cuda --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
            --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size 8 \
            --bf16 --mock-data --vocab-size 50257 --train-iters 20 --log-interval 10 --lr 1e-4 --eval-iters 0 \
            --distributed-backend ${be%-hostslots} --zero-stage $stage
          echo "== exit $?"
        done
        # Pa+cpu's offload, queued behind the compute since 2026-11-26: its cost over plain recompute.
        for zr in "" "--partition-activations --cpu-checkpointing"; do
          echo "== pretrain_gpt 12 x 768 bf16, 2 ranks sharing the GPU, ZeRO 2, --recompute-activations $zr"
          mpi 2 $B/pretrain_gpt --device cuda --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
            --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size 8 \
            --bf16 --mock-data --vocab-size 50257 --train-iters 20 --log-interval 10 --lr 1e-4 --eval-iters 0 --zero-stage 2 \
            --recompute-activations $zr --distributed-backend shm
          echo "== exit $?"
        done
        echo "== shm_backend_e2e on cuda (4 ranks sharing the GPU)"
        MZ_E2E_RUN_TIMEOUT=${MZ_E2E_RUN_TIMEOUT:-120} bounded 600 bash tests/cli/shm_backend_e2e.sh $B/pretrain_gpt \
          configs/gpt_tiny.cfg cuda
        echo "== exit $?"
      } > "$out/zero3.txt" 2>&1
      grep -E "^==|iteration +20/|timers|error|PASSED|FAILED|^all_|^reduce_|shm_backend_e2e" "$out/zero3.txt" | tail -60
      ;;
    *) echo "unknown phase $phase" ;;
  esac
  # A run a timeout ended from outside (its own timeout's process group) may
  # outlive it: nothing of this phase may hold the GPU during the next one.
  pkill -9 -f "^$B/" 2>/dev/null || true
done

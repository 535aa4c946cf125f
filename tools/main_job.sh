#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, prepares the bundled
# corpus (the King James Bible, tokenized with GPT-2's BPE), and trains a small
# GPT on 4 ranks of this machine — TP 2 x DP 2 with ZeRO stage 2 — for a few
# minutes, then reports the validation loss and saves checkpoints to
# runs/main_job/checkpoints. Extra arguments go to pretrain_gpt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
bash tools/setup_data.sh
# One math thread per rank: 4 ranks share this machine's cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p runs
exec mpiexec -n 4 build/examples/pretrain_gpt --config configs/gpt_tiny.cfg \
  --data-path data/corpus/kjv_text_document --tensor-model-parallel-size 2 --zero-stage 2 \
  --metrics-file runs/main_job_metrics.jsonl --save runs/main_job/checkpoints --save-interval 30 "$@"

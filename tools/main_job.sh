#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, and runs a real
# 4-rank job (TP 2 x DP 2) on this machine. Arguments go to the job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
# One math thread per rank: 4 ranks share this machine's cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec mpiexec -n 4 build/examples/megazero-comm-check --tensor-model-parallel-size 2 "$@"

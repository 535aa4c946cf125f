#!/usr/bin/env bash
# The README's test command (and CI's): installs what is missing, builds
# everything (CUDA sources too when the toolkit is present: they compile and
# link even without a GPU), and runs the whole suite. Fails on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
# The bundled corpus and GPT-2's BPE files: the end-to-end training test and
# the tokenizer-vs-reference test use them.
bash tools/setup_data.sh
cd "${BUILD_DIR:-build}"
# Multi-rank tests oversubscribe the cores and are marked RUN_SERIAL; the
# single-process ones (one math thread each) run one a core beside each other.
ctest --output-on-failure --timeout 900 -j"$(nproc)" "$@"

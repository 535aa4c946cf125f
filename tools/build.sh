#!/usr/bin/env bash
# Configures and builds megazero (Release) into ${BUILD_DIR:-build}. Extra
# arguments go to CMake, e.g. tools/build.sh -DMEGAZERO_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" -j"$(nproc)"

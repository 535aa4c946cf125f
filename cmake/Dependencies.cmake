# Every dependency comes from Debian packages (tools/install_deps.sh installs them)
# and is found the CMake way.
find_package(MPI REQUIRED COMPONENTS C)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(dnnl CONFIG REQUIRED)           # oneDNN: CPU GEMM (f32, bf16 on AMX/AVX512 where present)
# OpenBLAS: fp32/fp64 GEMM. Prefer Debian's OpenMP build: it shares one OpenMP
# thread pool with oneDNN and our kernels, where the pthread build's pool spins
# against it (measured: 12% slower GPT steps on 2 cores, docs/PERFORMANCE.md).
find_package(OpenBLAS CONFIG REQUIRED
  HINTS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/cmake/openblas)
if(NOT OpenBLAS_LIBRARIES)
  message(FATAL_ERROR "OpenBLAS found but it sets no OpenBLAS_LIBRARIES; install libopenblas-openmp-dev")
endif()
if(NOT OpenBLAS_LIBRARIES MATCHES "openmp")
  message(WARNING "megazero: using ${OpenBLAS_LIBRARIES}, not the OpenMP build of OpenBLAS; "
                  "install libopenblas-openmp-dev for the thread pool oneDNN shares")
endif()
find_package(Threads REQUIRED)
# Checkpoints: JSON manifests and safetensors headers (nlohmann/json), and
# per-file checksums (xxHash's XXH3, the hash zstd and many storage tools use).
find_package(nlohmann_json 3.10 CONFIG REQUIRED)
find_path(XXHASH_INCLUDE_DIR xxhash.h)
find_library(XXHASH_LIBRARY xxhash)
if(NOT XXHASH_INCLUDE_DIR OR NOT XXHASH_LIBRARY)
  message(FATAL_ERROR "xxHash not found: install libxxhash-dev (tools/install_deps.sh does)")
endif()
add_library(megazero_xxhash INTERFACE)
target_include_directories(megazero_xxhash INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(megazero_xxhash INTERFACE ${XXHASH_LIBRARY})
# SentencePiece (Llama2Tokenizer, GPTSentencePieceTokenizer: --tokenizer-model):
# Debian's package ships a pkg-config file, not a CMake one.
find_package(PkgConfig REQUIRED)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
# Tokenizers: PCRE2 matches the pre-tokenizers' patterns with Unicode classes
# (GPT-2's, tokenizer.json's); utf8proc normalizes text to NFC (Qwen's tokenizer.json).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
# cpp-httplib (Debian libcpp-httplib-dev): the text generation server's HTTP.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
if(MEGAZERO_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# ---- CUDA (optional) ----
set(MEGAZERO_WITH_CUDA OFF)
if(NOT MEGAZERO_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  set(_mz_cuda_missing "")
  if(NOT CMAKE_CUDA_COMPILER)
    list(APPEND _mz_cuda_missing "nvcc")
  else()
    find_package(CUDAToolkit QUIET)
    if(NOT CUDAToolkit_FOUND)
      list(APPEND _mz_cuda_missing "CUDA toolkit")
    else()
      # cuDNN and NCCL live inside the toolkit directory on our machines, in
      # /usr elsewhere; CUDAToolkit knows neither, so look for them here.
      set(_mz_hints ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64 ${CUDAToolkit_LIBRARY_ROOT}/lib)
      find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
      find_library(CUDNN_LIBRARY cudnn HINTS ${_mz_hints})
      find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
      find_library(NCCL_LIBRARY nccl HINTS ${_mz_hints})
      if(NOT TARGET CUDA::cublas)
        list(APPEND _mz_cuda_missing "cuBLAS")
      endif()
      if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
        list(APPEND _mz_cuda_missing "cuDNN")
      endif()
      if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
        list(APPEND _mz_cuda_missing "NCCL")
      endif()
    endif()
  endif()
  if(_mz_cuda_missing STREQUAL "")
    set(MEGAZERO_WITH_CUDA ON)
  elseif(MEGAZERO_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MEGAZERO_CUDA=ON but these were not found: ${_mz_cuda_missing}. "
                        "Install the CUDA toolkit with cuDNN and NCCL, or configure with -DMEGAZERO_CUDA=OFF.")
  else()
    message(STATUS "megazero: CUDA backend off (missing: ${_mz_cuda_missing})")
  endif()
endif()

if(MEGAZERO_WITH_CUDA)
  # The GPU architectures: this machine's GPUs where nvidia-smi lists any
  # ('native', which fails without one); elsewhere (a login node, CI) machine
  # code for Hopper (H100/H200) and PTX for Ampere (A100), which the driver
  # compiles once at the first launch and caches. Each real architecture costs
  # a full device compile (~30 s for the largest file on two cores); PTX only
  # the front end (~7 s). -DCMAKE_CUDA_ARCHITECTURES="80;90" adds A100's code.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE _mz_smi OUTPUT_QUIET ERROR_QUIET)
    if(_mz_smi EQUAL 0)
      set(CMAKE_CUDA_ARCHITECTURES native)
    else()
      set(CMAKE_CUDA_ARCHITECTURES 80-virtual 90-real)
    endif()
    message(STATUS "megazero: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES} (-DCMAKE_CUDA_ARCHITECTURES=... to choose)")
  endif()
  enable_language(CUDA)
  # CMake < 3.26 knows no C++20 flag for nvcc (nvcc has -std=c++20 since 12.0).
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  add_library(megazero_cudnn UNKNOWN IMPORTED)
  set_target_properties(megazero_cudnn PROPERTIES IMPORTED_LOCATION ${CUDNN_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${CUDNN_INCLUDE_DIR})
  add_library(megazero_nccl UNKNOWN IMPORTED)
  set_target_properties(megazero_nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
endif()

# Writes the kernel part of megazero/cuda/flash_attention.cu (everything
# before its "launch" section) for the CPU emulation: shared memory comes from
# the emulated block instead of `extern __shared__`, and the host launchers'
# header is left out. Fails loudly if the file no longer has that shape.
file(READ "${SOURCE}" text)
string(FIND "${text}" "// ------------------------------------------------------------------ launch" cut)
if(cut EQUAL -1)
  message(FATAL_ERROR "${SOURCE}: no '---- launch' marker; update tests/cuda_emulation/extract_kernels.cmake")
endif()
string(SUBSTRING "${text}" 0 ${cut} kernels)
string(REPLACE "#include \"megazero/cuda/flash_attention.h\"" "" kernels "${kernels}")
string(REPLACE "extern __shared__ __align__(128) unsigned char smem[];" "unsigned char* smem = emu_smem;" kernels "${kernels}")
string(FIND "${kernels}" "unsigned char* smem = emu_smem;" found)
if(found EQUAL -1)
  message(FATAL_ERROR "${SOURCE}: no 'extern __shared__' declaration found to emulate")
endif()
# Close the namespaces the launch section would have closed.
file(WRITE "${OUTPUT}" "${kernels}\n}  // namespace\n}  // namespace megazero::cuda\n")

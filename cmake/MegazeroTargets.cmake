# Shared compile settings and the helper that registers tests.

add_library(megazero_warnings INTERFACE)
target_compile_options(megazero_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow,-Wconversion,-Wno-sign-conversion>)

find_program(MEGAZERO_MPIEXEC NAMES ${MPIEXEC_EXECUTABLE} mpiexec REQUIRED)

# mz_add_test(NAME name SOURCES a.cpp ... LIBS ... [RANKS 1 2 4 ...] [TIMEOUT s])
# Multi-rank tests run the same binary under mpiexec once per rank count; the
# MPI test main (tests/mpi_test_main.cpp) fails every rank if any rank fails.
# They run serially because oversubscribed ranks busy-poll both cores.
function(mz_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;RANKS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} megazero_test_main GTest::gtest megazero_warnings)
  # -O1 (after the build type's -O3): a test file is mostly GoogleTest's
  # macros and templates, its work done by the libraries (built at -O3);
  # test_convert_checkpoint.cpp compiles in 17 s instead of 33 on two cores.
  # The results are the same: no -ffast-math, and x86-64's baseline has no FMA
  # to contract into.
  target_compile_options(${T_NAME} PRIVATE -O1)
  if(NOT T_RANKS)
    set(T_RANKS 1)
  endif()
  foreach(n IN LISTS T_RANKS)
    set(test_name ${T_NAME}.np${n})
    add_test(NAME ${test_name}
             COMMAND ${MEGAZERO_MPIEXEC} -n ${n} $<TARGET_FILE:${T_NAME}>)
    set_tests_properties(${test_name} PROPERTIES TIMEOUT ${T_TIMEOUT} RUN_SERIAL TRUE
      ENVIRONMENT "OMP_NUM_THREADS=1;MEGAZERO_NUM_THREADS=1")
  endforeach()
endfunction()

# Test helpers for fourway's own tests. Every test carries one of the labels cpu, gpu, mpi.
#
#   fourway_add_test(NAME n SOURCES a.cpp [LIBS ...] [LABELS ...] [TIMEOUT s])
#       A GoogleTest executable; each TEST becomes one ctest entry (label cpu unless given).
#   fourway_add_cuda_test(NAME n SOURCES a.cu [LIBS ...] [TIMEOUT s])
#       Compiled by nvcc whenever CUDA is enabled (so CI proves it compiles); labelled gpu.
#       Device tests must `GTEST_SKIP() << "no CUDA device"` without a GPU; the executable then
#       exits 77 and ctest reports it as skipped (a failing test is still reported as failed).
#   fourway_add_mpi_test(NAME n SOURCES a.cpp NP 2 4 [LIBS ...])
#       Runs the executable under mpirun -np N for each N (oversubscribed, allowed as root).
#   fourway_add_compile_fail_test(NAME n SOURCE f.cpp EXPECT "fourway: ..." [DEFINES ...])
#       Passes when compiling SOURCE fails with a diagnostic containing EXPECT, and the same
#       file compiles with -DFOURWAY_COMPILE_FAIL_CONTROL (so the failure is the one pinned).
include(GoogleTest)
set(_FOURWAY_TESTING_DIR ${CMAKE_CURRENT_LIST_DIR})
find_package(GTest REQUIRED)

set(FOURWAY_GTEST_SKIP_REGEX "\\[  SKIPPED \\]")

function(fourway_add_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT A_LABELS)
    set(A_LABELS cpu)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE fourway::fourway fourway_project_options
                        GTest::gtest GTest::gtest_main ${A_LIBS})
  gtest_discover_tests(${A_NAME} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
               SKIP_REGULAR_EXPRESSION "${FOURWAY_GTEST_SKIP_REGEX}")
endfunction()

function(fourway_add_cuda_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT TARGET fourway::cuda)
    message(STATUS "fourway: CUDA not found, GPU test ${A_NAME} is not built")
    return()
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  if(NOT TARGET fourway_gpu_test_main)
    add_library(fourway_gpu_test_main STATIC
                ${_FOURWAY_TESTING_DIR}/fourway_gpu_test_main.cpp)
    target_link_libraries(fourway_gpu_test_main PUBLIC GTest::gtest CUDA::cudart)
  endif()
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE fourway::cuda fourway_gpu_test_main ${A_LIBS})
  # One ctest entry per executable (one CUDA context per executable keeps device-check fast).
  # Without a GPU the device tests GTEST_SKIP and the executable exits 77: ctest says Skipped.
  # A failing test exits 1 and is reported as failed, never masked by the skips.
  add_test(NAME ${A_NAME} COMMAND ${A_NAME})
  set_tests_properties(${A_NAME} PROPERTIES LABELS gpu TIMEOUT ${A_TIMEOUT} SKIP_RETURN_CODE 77)
endfunction()

function(fourway_add_mpi_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SOURCES;LIBS;NP" ${ARGN})
  if(NOT TARGET fourway::mpi OR NOT MPIEXEC_EXECUTABLE)
    message(STATUS "fourway: MPI (or mpiexec) not found, skipping MPI test ${A_NAME}")
    return()
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE fourway::mpi fourway_project_options GTest::gtest
                        ${A_LIBS})
  foreach(np IN LISTS A_NP)
    add_test(NAME ${A_NAME}_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              --allow-run-as-root --bind-to none ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${A_NAME}>)
    set_tests_properties(${A_NAME}_np${np} PROPERTIES LABELS mpi TIMEOUT ${A_TIMEOUT}
      PROCESSORS ${np} ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_btl=self,vader,tcp")
  endforeach()
endfunction()

function(fourway_add_compile_fail_test)
  cmake_parse_arguments(A "" "NAME;SOURCE;EXPECT" "DEFINES" ${ARGN})
  set(inc "${PROJECT_SOURCE_DIR}/include")
  add_test(NAME ${A_NAME}
    COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER} -DSRC=${A_SOURCE} -DINC=${inc}
            "-DEXPECT=${A_EXPECT}" "-DDEFINES=${A_DEFINES}"
            -P ${PROJECT_SOURCE_DIR}/cmake/CompileFail.cmake)
  set_tests_properties(${A_NAME} PROPERTIES LABELS "cpu;compile_fail" TIMEOUT 120)
endfunction()

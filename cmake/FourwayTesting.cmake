# Test helpers for fourway's own tests. Every test carries one of the labels cpu, gpu, mpi.
#
#   fourway_add_test(NAME n SOURCES a.cpp [LIBS ...] [LABELS ...] [TIMEOUT s])
#       A GoogleTest executable; each TEST becomes one ctest entry (label cpu unless given).
#   fourway_add_cuda_test(NAME n SOURCES a.cu [LIBS ...] [TIMEOUT s])
#       Compiled by nvcc whenever CUDA is enabled (so CI proves it compiles); labelled gpu.
#       Device tests must `GTEST_SKIP() << "no CUDA device"` without a GPU; the executable then
#       exits 77 and ctest reports it as skipped (a failing test is still reported as failed).
#   fourway_add_mpi_test(NAME n SOURCES a.cpp NP 2 4 [LIBS ...] [RC code EXPECT regex])
#       Runs the executable under mpirun -np N for each N (oversubscribed, allowed as root);
#       with RC, through check_program.cmake (exit status and output). Without MPI, each
#       n_npN is a placeholder that ctest reports as Skipped (label mpi_unavailable).
#   fourway_add_program_test(NAME n COMMAND exe args... RC code EXPECT regex [LOSS_FALLS]
#                            [LABELS ...] [TIMEOUT s])
#       Runs a program (a target name or a path) through tests/support/check_program.cmake: the
#       test passes only when the exit status is RC (a number or `nonzero`) and stdout+stderr
#       match EXPECT (which cannot hold a ';': match it with '.'); LOSS_FALLS also asks the
#       last "loss X" printed to be below the first.
#       (PASS_REGULAR_EXPRESSION alone would ignore the exit status.)
#   fourway_add_compile_fail_test(NAME n SOURCE f.cpp EXPECT "fourway: ..." [DEFINES ...])
#       Passes when compiling SOURCE fails with a diagnostic containing EXPECT, and the same
#       file compiles with -DFOURWAY_COMPILE_FAIL_CONTROL (so the failure is the one pinned).
#   fourway_watch_test_directory()
#       Counts the calling directory's tests per label in the configure summary (every helper
#       above calls it; a directory that registers tests with add_test alone calls it once).
#       .ci/run fails when a label runs fewer tests than the summary registered.
include(GoogleTest)
set(_FOURWAY_TESTING_DIR ${CMAKE_CURRENT_LIST_DIR})
find_package(GTest REQUIRED)

set(FOURWAY_GTEST_SKIP_REGEX "\\[  SKIPPED \\]")

# In a function that parsed its arguments into A_*: label cpu and 300 s unless given, and no
# argument left unparsed (a ';' inside a quoted EXPECT would split it: match it with '.').
macro(_fourway_test_defaults fn)
  if(NOT A_LABELS)
    set(A_LABELS cpu)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  if(A_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "${fn}(${A_NAME}): unexpected '${A_UNPARSED_ARGUMENTS}'"
                        " (a ';' in EXPECT splits it: match it with '.')")
  endif()
endmacro()

# Test programs are compiled at -O1 even in Release: the build is most of CI's time and a
# correctness check gains nothing from more optimization. g++ 12, CPU seconds of one unit:
# tests/parallel/resume_test.cpp 61 at -O3, 43 at -O2; tests/comm/local_world_test.cpp 23.9 at
# -O2, 13.9 at -O1; tests/train/trainer_test.cpp 16.4 at -O2, 11.6 at -O1 (a precompiled
# GoogleTest + std header saved only 0-1.3 s of those: the time is instantiation and
# optimization, not parsing). The examples and benchmarks keep the configuration's flags (-O3 in
# Release): their speed is what gets measured. The last -O wins, and target options come after
# CMAKE_CXX_FLAGS_RELEASE. CUDA test units get host -O1 too (fourway_cuda_optimization; nvcc's -O
# does not touch device code): tests/train/trainer_cuda_test.cu 45.6 CPU s at -O3, 39.1 at -O1.
function(_fourway_test_optimization target)
  target_compile_options(${target} PRIVATE
    $<$<AND:$<CONFIG:Release>,$<COMPILE_LANGUAGE:CXX>>:-O1>)
  fourway_cuda_optimization(${target} 1)
endfunction()

# The labels of a gtest executable's discovered tests. gtest_discover_tests cannot carry a list
# in PROPERTIES (LABELS "cpu;matrix" reaches set_tests_properties split, as `LABELS cpu matrix
# TIMEOUT ...`: label cpu only, and the pairs after it shifted, the timeout lost), so a ctest
# include file that runs after the discovery's sets them on the list it leaves in <target>_TESTS.
# The executable is recorded (FOURWAY_GTEST_UNITS) for the configure summary: each brings at
# least one test to each of its labels.
function(_fourway_label_discovered target labels)
  set(file ${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake)
  file(WRITE ${file} "if(${target}_TESTS)\n"
       "  set_tests_properties(\${${target}_TESTS} PROPERTIES LABELS \"${labels}\")\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${file})
  string(REPLACE ";" "," labels_text "${labels}")
  set_property(GLOBAL APPEND PROPERTY FOURWAY_GTEST_UNITS "${target}:${labels_text}")
endfunction()

function(fourway_add_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  _fourway_test_defaults(fourway_add_test)
  # the sanitizer build runs no `matrix` test (its test preset leaves them to the test workflow):
  # it does not build them either
  if(FOURWAY_SANITIZE AND "matrix" IN_LIST A_LABELS)
    return()
  endif()
  fourway_watch_test_directory()
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE fourway::fourway fourway_project_options
                        GTest::gtest GTest::gtest_main ${A_LIBS})
  _fourway_test_optimization(${A_NAME})
  gtest_discover_tests(${A_NAME} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${A_TIMEOUT} SKIP_REGULAR_EXPRESSION "${FOURWAY_GTEST_SKIP_REGEX}")
  _fourway_label_discovered(${A_NAME} "${A_LABELS}")
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
  fourway_watch_test_directory()
  if(NOT TARGET fourway_gpu_test_main)
    add_library(fourway_gpu_test_main STATIC
                ${_FOURWAY_TESTING_DIR}/fourway_gpu_test_main.cpp)
    target_link_libraries(fourway_gpu_test_main PUBLIC GTest::gtest CUDA::cudart)
  endif()
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE fourway::cuda fourway_gpu_test_main ${A_LIBS})
  _fourway_test_optimization(${A_NAME})
  # One ctest entry per executable (one CUDA context per executable keeps device-check fast).
  # Without a GPU the device tests GTEST_SKIP and the executable exits 77: ctest says Skipped.
  # A failing test exits 1 and is reported as failed, never masked by the skips.
  add_test(NAME ${A_NAME} COMMAND ${A_NAME})
  set_tests_properties(${A_NAME} PROPERTIES LABELS gpu TIMEOUT ${A_TIMEOUT} SKIP_RETURN_CODE 77)
  set_property(GLOBAL APPEND PROPERTY FOURWAY_GPU_TESTS ${A_NAME})
endfunction()

# Every mpirun test is recorded (global property FOURWAY_MPI_TESTS) for the configure summary
# and for .ci/run, which fails when fewer ran. Without MPI each is still registered, labelled
# mpi_unavailable, and reports Skipped with the reason, so nothing vanishes silently.
function(fourway_add_mpi_placeholder name)
  fourway_watch_test_directory()
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -E echo
           "fourway: SKIPPED: ${name} needs MPI (Open MPI's libopenmpi-dev and openmpi-bin); reconfigure once it is installed")
  set_tests_properties(${name} PROPERTIES LABELS mpi_unavailable
                       SKIP_REGULAR_EXPRESSION "fourway: SKIPPED: ")
  set_property(GLOBAL APPEND PROPERTY FOURWAY_MPI_SKIPPED ${name})
endfunction()

# The command line that runs N processes of a program (oversubscribed, allowed as root).
function(fourway_mpirun out np)
  set(${out} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe --allow-run-as-root
      --bind-to none ${MPIEXEC_PREFLAGS} PARENT_SCOPE)
endfunction()

# Labels, timeout, CPU count and environment of an mpirun test, and its record.
function(fourway_mpi_test_properties name np timeout)
  fourway_watch_test_directory()
  set_tests_properties(${name} PROPERTIES LABELS mpi TIMEOUT ${timeout} PROCESSORS ${np}
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_btl=self,vader,tcp")
  set_property(GLOBAL APPEND PROPERTY FOURWAY_MPI_TESTS ${name})
endfunction()

function(fourway_add_mpi_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT;RC;EXPECT" "SOURCES;LIBS;NP" ${ARGN})
  _fourway_test_defaults(fourway_add_mpi_test)
  if(NOT TARGET fourway::mpi OR NOT MPIEXEC_EXECUTABLE)
    foreach(np IN LISTS A_NP)
      fourway_add_mpi_placeholder(${A_NAME}_np${np})
    endforeach()
    return()
  endif()
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE fourway::mpi fourway_project_options GTest::gtest
                        ${A_LIBS})
  _fourway_test_optimization(${A_NAME})
  foreach(np IN LISTS A_NP)
    fourway_mpirun(run ${np})
    if(DEFINED A_RC)  # a program expected to end with status RC and print EXPECT
      list(POP_FRONT run exe)
      list(APPEND run $<TARGET_FILE:${A_NAME}>)
      add_test(NAME ${A_NAME}_np${np}
        COMMAND ${CMAKE_COMMAND} "-DEXE=${exe}" "-DARGS=${run}" "-DRC=${A_RC}"
                "-DEXPECT=${A_EXPECT}" -P ${PROJECT_SOURCE_DIR}/tests/support/check_program.cmake)
    else()
      add_test(NAME ${A_NAME}_np${np} COMMAND ${run} $<TARGET_FILE:${A_NAME}>)
    endif()
    fourway_mpi_test_properties(${A_NAME}_np${np} ${np} ${A_TIMEOUT})
  endforeach()
endfunction()

function(fourway_add_program_test)
  cmake_parse_arguments(A "LOSS_FALLS" "NAME;RC;EXPECT;TIMEOUT" "COMMAND;LABELS" ${ARGN})
  _fourway_test_defaults(fourway_add_program_test)
  fourway_watch_test_directory()
  list(POP_FRONT A_COMMAND exe)
  if(NOT exe MATCHES "[/$]")  # a target name (perhaps defined later, in examples/)
    set(exe $<TARGET_FILE:${exe}>)
  endif()
  add_test(NAME ${A_NAME}
    COMMAND ${CMAKE_COMMAND} "-DEXE=${exe}" "-DARGS=${A_COMMAND}" "-DRC=${A_RC}"
            "-DEXPECT=${A_EXPECT}" "-DLOSS_FALLS=${A_LOSS_FALLS}"
            -P ${PROJECT_SOURCE_DIR}/tests/support/check_program.cmake)
  set_tests_properties(${A_NAME} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT})
endfunction()

function(fourway_add_compile_fail_test)
  cmake_parse_arguments(A "" "NAME;SOURCE;EXPECT" "DEFINES" ${ARGN})
  fourway_watch_test_directory()
  set(inc "${PROJECT_SOURCE_DIR}/include")
  add_test(NAME ${A_NAME}
    COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER} -DSRC=${A_SOURCE} -DINC=${inc}
            "-DEXPECT=${A_EXPECT}" "-DDEFINES=${A_DEFINES}"
            -P ${PROJECT_SOURCE_DIR}/cmake/CompileFail.cmake)
  set_tests_properties(${A_NAME} PROPERTIES LABELS "cpu;compile_fail" TIMEOUT 120)
endfunction()

# The labels of every test, for the configure summary. get_property(TEST) reads only the calling
# directory's tests (before CMake 3.28), so each directory that registers a test through these
# helpers records its own, deferred to its end (after every set_tests_properties in it): one
# entry of FOURWAY_TEST_LABELS per test and label.
function(_fourway_record_directory_labels)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS tests)
    get_property(labels TEST ${t} PROPERTY LABELS)
    set_property(GLOBAL APPEND PROPERTY FOURWAY_TEST_LABELS ${labels})
  endforeach()
endfunction()
function(fourway_watch_test_directory)
  get_property(watched DIRECTORY PROPERTY FOURWAY_LABELS_WATCHED)
  if(NOT watched)
    set_property(DIRECTORY PROPERTY FOURWAY_LABELS_WATCHED ON)
    cmake_language(DEFER CALL _fourway_record_directory_labels)
  endif()
endfunction()

# The configure summary of the test groups, run once the whole tree is read (tests/CMakeLists.txt
# defers it to the end of the top directory, so the examples', benchmarks' and lint tests count).
# Written to <build>/fourway_test_groups.txt, which .ci/run reads: `mpi_tests=N` lines, and one
# `label.L=N` line per label L, the fewest tests a run of every test must report for L (each
# add_test once, each gtest executable at least once: its TESTs are discovered at test time).
function(fourway_test_groups_summary)
  get_property(mpi GLOBAL PROPERTY FOURWAY_MPI_TESTS)
  get_property(mpi_skipped GLOBAL PROPERTY FOURWAY_MPI_SKIPPED)
  get_property(gpu GLOBAL PROPERTY FOURWAY_GPU_TESTS)
  list(LENGTH mpi n_mpi)
  list(LENGTH mpi_skipped n_skipped)
  list(LENGTH gpu n_gpu)
  if(n_mpi GREATER 0)
    set(mpi_line "mpi ON (${n_mpi} mpirun tests, label mpi)")
  else()
    set(mpi_line "mpi OFF (MPI not found: ${n_skipped} tests report Skipped, label mpi_unavailable)")
  endif()
  if(n_gpu GREATER 0)
    set(gpu_line "gpu compiled (${n_gpu} tests, label gpu; Skipped without a device)")
  else()
    set(gpu_line "gpu OFF (no CUDA compiler)")
  endif()
  _fourway_record_directory_labels()  # the calling (top) directory's own tests: lint
  get_property(labels GLOBAL PROPERTY FOURWAY_TEST_LABELS)
  get_property(units GLOBAL PROPERTY FOURWAY_GTEST_UNITS)
  foreach(u IN LISTS units)
    string(REGEX REPLACE "^[^:]*:" "" unit_labels "${u}")
    string(REPLACE "," ";" unit_labels "${unit_labels}")
    list(APPEND labels ${unit_labels})
  endforeach()
  set(_fourway_labels ${labels})
  foreach(l IN LISTS labels)
    if(NOT DEFINED _fourway_label_${l})
      set(_fourway_label_${l} 0)
    endif()
    math(EXPR _fourway_label_${l} "${_fourway_label_${l}} + 1")
  endforeach()
  list(REMOVE_DUPLICATES _fourway_labels)
  list(SORT _fourway_labels)
  set(label_lines "")
  set(label_text "")
  foreach(l IN LISTS _fourway_labels)
    string(APPEND label_lines "label.${l}=${_fourway_label_${l}}\n")
    string(APPEND label_text " ${l}>=${_fourway_label_${l}}")
  endforeach()
  message(STATUS "fourway test groups: cpu ON; ${mpi_line}; ${gpu_line}")
  message(STATUS "fourway test labels (at least, per label):${label_text}")
  file(WRITE ${PROJECT_BINARY_DIR}/fourway_test_groups.txt
       "mpi_tests=${n_mpi}\nmpi_skipped=${n_skipped}\ngpu_tests=${n_gpu}\n${label_lines}")
endfunction()

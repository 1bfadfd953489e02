# Lint tests (labels cpu, lint): they read the source tree, build nothing, take seconds.
#   lint.format  every C++/CUDA file under include/ tests/ examples/ benchmarks/ is formatted;
#   lint.tidy    clang-tidy (.clang-tidy) over config, core, host backend and schedule headers;
#   lint.capability_flags  no `#ifdef FOURWAY_HAS_*` (the flags are always defined, 0 or 1);
#   lint.umbrella  fourway.hpp includes every .hpp, fourway.cuh every .cuh;
#   lint.mode_namespace  code under FOURWAY_CUDA_COMPILATION sits in the mode's inline namespace.
# format and tidy report Skipped (exit 77) where the tool is not installed.
find_program(BASH_EXECUTABLE bash REQUIRED)
add_test(NAME lint.format COMMAND ${BASH_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check-format.sh)
add_test(NAME lint.tidy COMMAND ${BASH_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/run-clang-tidy.sh)
add_test(NAME lint.capability_flags
  COMMAND ${BASH_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check-capability-flags.sh)
add_test(NAME lint.umbrella COMMAND ${BASH_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check-umbrella.sh)
add_test(NAME lint.mode_namespace
  COMMAND ${BASH_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check-mode-namespace.sh)
set_tests_properties(lint.format lint.tidy lint.capability_flags lint.umbrella lint.mode_namespace PROPERTIES
  LABELS "cpu;lint" SKIP_RETURN_CODE 77 TIMEOUT 300)

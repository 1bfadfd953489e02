# Runs scripts/device-check.sh in dry-run mode for one CASE and checks its exit code and output:
#   kit           a minimal kit (the files the script checks) in WORK: exit 0, every step planned
#   missing_kit   no kit: exit 2, a message naming the missing files and how to prepare the kit
#   bad_argument  an unknown flag: exit 2, the flag named
file(REMOVE_RECURSE ${WORK})
set(_kit ${WORK}/kit)
set(_args --dry-run --kit ${_kit} --build ${WORK}/build --jobs 16 --budget 480)
if(CASE STREQUAL "kit")
  foreach(_f googletest/CMakeLists.txt googletest/googletest/include/gtest/gtest.h
             googletest/googletest/src/gtest-all.cc)
    file(WRITE ${_kit}/${_f} "")
  endforeach()
elseif(CASE STREQUAL "bad_argument")
  list(APPEND _args --no-such-flag)
endif()
execute_process(COMMAND ${BASH} ${SCRIPT} ${_args} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                ERROR_VARIABLE _err)
set(_all "${_out}${_err}")
message(STATUS "exit ${_rc}\n${_all}")

function(expect what)
  string(FIND "${_all}" "${what}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "device-check ${CASE}: the output lacks '${what}'")
  endif()
endfunction()

if(CASE STREQUAL "kit")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "device-check --dry-run with a kit exited ${_rc}, expected 0")
  endif()
  foreach(_step kit-build configure build gpu-tests memcheck-kernels memcheck-localworld
                racecheck-kernels racecheck-localworld gpt-step train-cuda-vs-host
                train-vs-pytorch-gpu bench-kernels)
    expect("   ${_step} ")
  endforeach()
  expect("budget 480s, -j 16")
  expect("tp2 pp2 dp2")
  expect("compare_pytorch_gpu.sh: GPT-2 124M bf16 B8 T1024")
  expect("device-check: dry run ok (kit present, 12 steps planned)")
elseif(CASE STREQUAL "missing_kit")
  if(NOT _rc EQUAL 2)
    message(FATAL_ERROR "device-check --dry-run without a kit exited ${_rc}, expected 2")
  endif()
  expect("the device kit is missing or incomplete at ${_kit}")
  expect("googletest/CMakeLists.txt")
  expect("scripts/device-check.sh --prepare")
  expect("carry [\".device-kit\"]")
else()
  if(NOT _rc EQUAL 2)
    message(FATAL_ERROR "device-check with an unknown flag exited ${_rc}, expected 2")
  endif()
  expect("unknown argument '--no-such-flag'")
endif()

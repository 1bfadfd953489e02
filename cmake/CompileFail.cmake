# cmake -DCXX=... -DSRC=... -DINC=... -DEXPECT=... [-DDEFINES=A;B] -P CompileFail.cmake
# Fails unless SRC fails to compile with EXPECT in the diagnostics and compiles with
# -DFOURWAY_COMPILE_FAIL_CONTROL (the control proves the file is otherwise well formed).
# Each refusal first prints one unwrapped line `fourway-compile-fail: <reason>` (reasons:
# compiled, other-message, control-failed) that the harness self-test matches.
set(defs "")
foreach(d IN LISTS DEFINES)
  list(APPEND defs "-D${d}")
endforeach()

macro(refuse reason detail)
  message(NOTICE "fourway-compile-fail: ${reason}")
  message(FATAL_ERROR "${detail}")
endmacro()

execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${INC} ${defs} ${SRC}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  refuse(compiled "${SRC} compiled, but it must fail with: ${EXPECT}")
endif()
string(FIND "${err}${out}" "${EXPECT}" pos)
if(pos EQUAL -1)
  refuse(other-message "${SRC} failed, but without '${EXPECT}'. Diagnostics:\n${err}")
endif()
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${INC} ${defs}
  -DFOURWAY_COMPILE_FAIL_CONTROL ${SRC} RESULT_VARIABLE rc2 ERROR_VARIABLE err2)
if(NOT rc2 EQUAL 0)
  refuse(control-failed
    "control build of ${SRC} (-DFOURWAY_COMPILE_FAIL_CONTROL) failed:\n${err2}")
endif()
message(STATUS "compile-fail ok: ${EXPECT}")

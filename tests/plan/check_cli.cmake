# cmake -DEXE=fourway-plan "-DARGS=--gpus;0" -DRC=2 "-DEXPECT=regex" -P check_cli.cmake
# Runs EXE with ARGS; fails unless it exits with RC and its stdout+stderr match EXPECT.
execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 60)
if(NOT "${rc}" STREQUAL "${RC}")
  message(FATAL_ERROR "fourway-plan ${ARGS}: exit status ${rc}, expected ${RC}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "fourway-plan ${ARGS}: output does not match '${EXPECT}'\nstdout:\n${out}\nstderr:\n${err}")
endif()
message(STATUS "ok: exit ${rc}, output matches '${EXPECT}'")

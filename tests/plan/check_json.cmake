# cmake -DEXE=fourway-plan "-DARGS=..." -DRC=0 -DPYTHON=python3 -P check_json.cmake
# Fails unless EXE exits with status RC and prints one JSON document that Python's json parses.
execute_process(COMMAND ${EXE} ${ARGS}
                COMMAND ${PYTHON} -c "import json,sys; d=json.load(sys.stdin); print('keys', sorted(d))"
                RESULTS_VARIABLE rcs OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
list(GET rcs 0 exe_rc)
list(GET rcs 1 json_rc)
if(NOT "${exe_rc}" STREQUAL "${RC}")
  message(FATAL_ERROR "fourway-plan ${ARGS}: exit status ${exe_rc}, expected ${RC}:\n${out}\n${err}")
endif()
if(NOT json_rc EQUAL 0)
  message(FATAL_ERROR "fourway-plan ${ARGS} did not print valid JSON (${json_rc}):\n${out}\n${err}")
endif()
message(STATUS "${out}")

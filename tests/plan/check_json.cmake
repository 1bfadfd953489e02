# cmake -DEXE=fourway-plan "-DARGS=..." -DPYTHON=python3 -P check_json.cmake
# Fails unless EXE prints one JSON document that Python's json module parses.
execute_process(COMMAND ${EXE} ${ARGS}
                COMMAND ${PYTHON} -c "import json,sys; d=json.load(sys.stdin); print('keys', sorted(d))"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fourway-plan ${ARGS} did not print valid JSON (${rc}):\n${out}\n${err}")
endif()
message(STATUS "${out}")

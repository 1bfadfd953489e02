# Driver of the packaging tests (cmake -P). MODE is one of
#   install          FOURWAY_BINARY_DIR -> PREFIX (component `fourway` only), then checks files;
#   build | run      configures SOURCE in BINARY against PREFIX, builds it, and for `run` runs
#                    the program `consumer`, which must print "fourway consumer ok";
#   configure_fails  configuring must fail with EXPECT in its output.
# Common: GENERATOR, CXX, PREFIX; optional ARGS (a list of -D options for the consumer).
cmake_minimum_required(VERSION 3.25)

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "install")
  file(REMOVE_RECURSE ${PREFIX})
  run_step("cmake --install" ${CMAKE_COMMAND} --install ${FOURWAY_BINARY_DIR} --prefix ${PREFIX}
           --component fourway)
  foreach(f include/fourway/fourway.hpp include/fourway/core/tensor.hpp
            lib/cmake/fourway/fourwayConfig.cmake lib/cmake/fourway/fourwayConfigVersion.cmake
            lib/cmake/fourway/fourwayTargets.cmake)
    if(NOT EXISTS ${PREFIX}/${f})
      message(FATAL_ERROR "install is missing ${PREFIX}/${f}")
    endif()
  endforeach()
  file(GLOB_RECURSE programs ${PREFIX}/bin/*)
  if(programs)
    message(FATAL_ERROR "the library component installed programs: ${programs}")
  endif()
  return()
endif()

file(REMOVE_RECURSE ${BINARY})
set(configure ${CMAKE_COMMAND} -S ${SOURCE} -B ${BINARY} -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DFOURWAY_EXPECTED_PREFIX=${PREFIX} ${ARGS})

if(MODE STREQUAL "configure_fails")
  execute_process(COMMAND ${configure} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "configuring ${SOURCE} with ${ARGS} succeeded; it must fail with: ${EXPECT}")
  endif()
  string(FIND "${out}${err}" "${EXPECT}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "configure failed without '${EXPECT}':\n${out}\n${err}")
  endif()
  message(STATUS "configure failed as expected: ${EXPECT}")
  return()
endif()

run_step("configure ${SOURCE}" ${configure})
run_step("build ${SOURCE}" ${CMAKE_COMMAND} --build ${BINARY} -j 2)
if(MODE STREQUAL "run")
  run_step("run consumer" ${BINARY}/consumer)
  if(NOT step_output MATCHES "fourway consumer ok")
    message(FATAL_ERROR "the consumer did not report success:\n${step_output}")
  endif()
  message(STATUS "${step_output}")
endif()

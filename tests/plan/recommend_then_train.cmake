# What a newcomer does: ask fourway-plan --recommend for a mesh, then run the command it prints.
#   cmake -DPLAN=fourway-plan -DTRAIN=fourway-train "-DARGS=plan flags" -DSTEPS=n
#         [-DEXPECT_MESH=regex] -P recommend_then_train.cmake
# The printed line starts `mpirun -np N fourway-train-cuda --backend nccl` (a GPU cluster); on
# this machine the same flags run on N LocalWorld threads: `fourway-train --ranks N --backend
# local` followed by every flag the line prints, unchanged. Fails unless the plan exits 0 and
# prints the line (matching EXPECT_MESH when given), and the training run exits 0 and reports a
# loss for each of its STEPS steps.
execute_process(COMMAND ${PLAN} ${ARGS} --recommend RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fourway-plan ${ARGS} --recommend exited ${rc}:\n${out}\n${err}")
endif()
if(NOT out MATCHES "train it: mpirun -np ([0-9]+) fourway-train-cuda --backend nccl ([^\n]*)")
  message(FATAL_ERROR "fourway-plan printed no command to train its choice:\n${out}")
endif()
set(ranks ${CMAKE_MATCH_1})
set(flags "${CMAKE_MATCH_2}")
if(DEFINED EXPECT_MESH AND NOT flags MATCHES "${EXPECT_MESH}")
  message(FATAL_ERROR "the chosen mesh '${flags}' does not match '${EXPECT_MESH}'")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
set(cmd ${TRAIN} --ranks ${ranks} --backend local ${flags} --steps ${STEPS})
list(JOIN cmd " " shown)
message(STATUS "running the printed command on LocalWorld: ${shown}")
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 280)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${shown}\nexited ${rc}:\n${out}\n${err}")
endif()
string(REGEX MATCHALL "loss +[0-9]+\\.[0-9]+" losses "${out}")
list(LENGTH losses n)
if(n LESS STEPS)
  message(FATAL_ERROR "${shown}\nreported ${n} losses for ${STEPS} steps:\n${out}")
endif()
message(STATUS "ok: the recommended mesh trained ${STEPS} steps (${n} losses reported)")

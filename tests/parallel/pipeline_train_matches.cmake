# fourway-train --pp S gives the losses and final weights of the one-rank run with the same
# --micro-batches (gradient accumulation), through the program: flags, init, the schedule, --save.
# With MPIEXEC set, the pipeline runs under mpirun (--backend mpi) against LocalWorld's --pp S.
# EXTRA (a list) goes to the pipeline runs only, e.g. --dp;2;--zero;3 (replicas with ZeRO); the
# reference then runs REF_M micro-batches (the replicas' M each, in all).
# With INIT set, every run starts --init-from a file of other weights (another seed) than the
# flags' model, and the pipeline (with EXTRA) must also give that file back bit for bit after
# --steps 0.
# With MPIEXEC and NP, mpirun starts NP processes (default PP) and EXTRA goes to both runs: the
# mesh under MPI against the same mesh on LocalWorld (e.g. --tp;2;--dp;2 with NP 8).
# With DATA (fourway-data), every run also evaluates a validation file (byte ids) every 2 steps,
# and compare_losses holds the validation losses to the same tolerance.
# Arguments: TRAIN, COMPARE, WEIGHTS, PP, M, SCHEDULES, WORK,
#            [MPIEXEC, NPFLAG, NP, EXTRA, REF_M, INIT, DATA].
file(MAKE_DIRECTORY ${WORK})
if(NOT REF_M)
  set(REF_M ${M})
endif()
if(NOT NP)
  set(NP ${PP})
endif()
set(common --heads 4 --seq 16 --batch 8 --grad-clip 1.0 --weight-decay 0.1 --quiet)
include(${CMAKE_CURRENT_LIST_DIR}/val_data.cmake)
fourway_append_val_data(common)  # with DATA: the validation loss too
if(INIT)
  set(init ${WORK}/init.safetensors)
  execute_process(COMMAND ${TRAIN} --layers 5 --dim 32 ${common} --seed 7 --steps 0 --save ${init}
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "writing the initial weights failed: ${rc}")
  endif()
  list(APPEND common --init-from ${init})
  execute_process(COMMAND ${TRAIN} ${common} --steps 0 --micro-batches ${M} --pp ${PP} ${EXTRA}
                          --save ${WORK}/roundtrip.safetensors
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--init-from, --steps 0, --save with --pp ${PP} ${EXTRA} failed: ${rc}\n"
                        "${out}\n${err}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${init} ${WORK}/roundtrip.safetensors
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--pp ${PP} ${EXTRA}: --init-from then --save does not give the file back")
  endif()
else()
  list(APPEND common --layers 5 --dim 32)
endif()
list(APPEND common_steps ${common} --steps 5)
set(ref_log ${WORK}/ref.jsonl)
set(ref_w ${WORK}/ref.safetensors)
if(MPIEXEC)
  execute_process(COMMAND ${TRAIN} ${common_steps} --micro-batches ${M} --pp ${PP} ${EXTRA}
                          --log-json ${ref_log} --save ${ref_w}
                  RESULT_VARIABLE rc OUTPUT_QUIET)
else()
  execute_process(COMMAND ${TRAIN} ${common_steps} --micro-batches ${REF_M} --log-json ${ref_log}
                          --save ${ref_w}
                  RESULT_VARIABLE rc OUTPUT_QUIET)
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the reference run failed: ${rc}")
endif()
foreach(schedule ${SCHEDULES})
  set(log ${WORK}/${schedule}.jsonl)
  set(w ${WORK}/${schedule}.safetensors)
  if(MPIEXEC)
    execute_process(COMMAND ${MPIEXEC} ${NPFLAG} ${NP} --oversubscribe --allow-run-as-root
                            --bind-to none ${TRAIN} ${common_steps} --micro-batches ${M} --backend mpi
                            --pp ${PP} ${EXTRA}
                            --schedule ${schedule} --log-json ${log} --save ${w}
                    RESULT_VARIABLE rc OUTPUT_QUIET)
  else()
    execute_process(COMMAND ${TRAIN} ${common_steps} --micro-batches ${M} --pp ${PP} ${EXTRA}
                            --schedule ${schedule} --log-json ${log} --save ${w}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--pp ${PP} --schedule ${schedule} failed: ${rc}\n${out}\n${err}")
  endif()
  execute_process(COMMAND ${COMPARE} ${log} ${ref_log} 1e-5 RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  message(STATUS "${schedule} losses:\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--pp ${PP} --schedule ${schedule}: losses differ from the reference")
  endif()
  # the key third of attn.c_attn.bias has a zero gradient: held to 2·lr·steps = 3e-3 absolute
  execute_process(COMMAND ${WEIGHTS} ${w} ${ref_w} 1e-5 3e-3 RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message(STATUS "${schedule} weights: ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--pp ${PP} --schedule ${schedule}: final weights differ")
  endif()
endforeach()

# fourway-train --pp S gives the losses and final weights of the one-rank run with the same
# --micro-batches (gradient accumulation), through the program: flags, init, the schedule, --save.
# With MPIEXEC set, the pipeline runs under mpirun (--backend mpi) against LocalWorld's --pp S.
# EXTRA (a list) goes to the pipeline runs only, e.g. --dp;2;--zero;3 (replicas with ZeRO); the
# reference then runs REF_M micro-batches (the replicas' M each, in all).
# Arguments: TRAIN, COMPARE, WEIGHTS, PP, M, SCHEDULES, WORK, [MPIEXEC, NPFLAG, EXTRA, REF_M].
file(MAKE_DIRECTORY ${WORK})
if(NOT REF_M)
  set(REF_M ${M})
endif()
set(common --layers 5 --dim 32 --heads 4 --seq 16 --batch 8 --steps 5 --grad-clip 1.0
           --weight-decay 0.1 --quiet)
set(ref_log ${WORK}/ref.jsonl)
set(ref_w ${WORK}/ref.safetensors)
if(MPIEXEC)
  execute_process(COMMAND ${TRAIN} ${common} --micro-batches ${M} --pp ${PP} --log-json ${ref_log}
                          --save ${ref_w}
                  RESULT_VARIABLE rc OUTPUT_QUIET)
else()
  execute_process(COMMAND ${TRAIN} ${common} --micro-batches ${REF_M} --log-json ${ref_log}
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
    execute_process(COMMAND ${MPIEXEC} ${NPFLAG} ${PP} --oversubscribe --allow-run-as-root
                            --bind-to none ${TRAIN} ${common} --micro-batches ${M} --backend mpi
                            --pp ${PP}
                            --schedule ${schedule} --log-json ${log} --save ${w}
                    RESULT_VARIABLE rc OUTPUT_QUIET)
  else()
    execute_process(COMMAND ${TRAIN} ${common} --micro-batches ${M} --pp ${PP} ${EXTRA}
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

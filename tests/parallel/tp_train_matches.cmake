# fourway-train --tp: the losses and the saved (unsplit) weights of a tensor-parallel run equal a
# reference run's. MODE local: --tp 2 (sequence parallel), --tp 2 --dp 2 --zero 3 and --tp 4 on
# LocalWorld against the one-rank run, and --init-from of the one-rank file round-trips exactly.
# MODE mpi: mpirun -np 4 --backend mpi --tp 2 --dp 2 against LocalWorld's --ranks 4 --tp 2 --dp 2.
# Arguments: TRAIN, COMPARE, WEIGHTS, MODE, WORK (+ MPIEXEC, NPFLAG for mpi).
file(MAKE_DIRECTORY ${WORK})
set(common --layers 2 --dim 48 --heads 4 --vocab 301 --seq 16 --batch 8 --steps 5
           --grad-clip 1.0 --weight-decay 0.1 --quiet)

function(run name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}): ${err}")
  endif()
endfunction()

function(same name a b tol)
  execute_process(COMMAND ${COMPARE} ${a}.jsonl ${b}.jsonl ${tol} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out)
  message(STATUS "${name} losses:\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: losses differ beyond ${tol}")
  endif()
  # the key bias: rounding noise scaled by Adam to <= 2 lr per step (lr 3e-4, 5 steps)
  execute_process(COMMAND ${WEIGHTS} ${a}.safetensors ${b}.safetensors ${tol} 3e-3
                  RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${name} weights: ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: final weights differ beyond ${tol}")
  endif()
endfunction()

if(MODE STREQUAL "local")
  run(one_rank ${TRAIN} ${common} --log-json ${WORK}/one.jsonl --save ${WORK}/one.safetensors)
  foreach(cfg "tp2_sp;--tp;2;--sequence-parallel" "tp2_dp2_z3;--ranks;4;--tp;2;--dp;2;--zero;3;--bucket-mb;0.02"
              "tp4;--tp;4;--vocab-align;8")
    list(GET cfg 0 name)
    list(SUBLIST cfg 1 -1 flags)
    run(${name} ${TRAIN} ${common} ${flags} --log-json ${WORK}/${name}.jsonl
        --save ${WORK}/${name}.safetensors)
    # fp32: partial sums over the tp group round differently from one rank: 1e-5 relative
    same(${name} ${WORK}/${name} ${WORK}/one 1e-5)
  endforeach()
  # --init-from the unsplit file and --save after 0 steps gives the file back bit for bit
  run(roundtrip ${TRAIN} --init-from ${WORK}/one.safetensors --heads 4 --seq 16 --batch 8 --steps 0 --tp 4
      --quiet --save ${WORK}/roundtrip.safetensors)
  execute_process(COMMAND ${WEIGHTS} ${WORK}/roundtrip.safetensors ${WORK}/one.safetensors 0
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  message(STATUS "round trip: ${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--tp 4 --init-from/--save does not round-trip the file")
  endif()
else()
  set(tpdp --tp 2 --dp 2 --bucket-mb 0.02)  # buckets where there are replicas
  run(local ${TRAIN} ${common} ${tpdp} --ranks 4 --log-json ${WORK}/local.jsonl
      --save ${WORK}/local.safetensors)
  run(mpi ${MPIEXEC} ${NPFLAG} 4 --oversubscribe --allow-run-as-root --bind-to none ${TRAIN}
      ${common} ${tpdp} --backend mpi --log-json ${WORK}/mpi.jsonl --save ${WORK}/mpi.safetensors)
  # MPI_Allreduce may sum in another order than LocalWorld: 1e-5 relative
  same(mpi_tp2_dp2 ${WORK}/mpi ${WORK}/local 1e-5)
endif()

# fourway-train --backend mpi under mpirun -np NP gives the losses of --backend local --ranks NP,
# for every --zero stage. Arguments: TRAIN, COMPARE, MPIEXEC, NPFLAG, NP, WORK.
file(MAKE_DIRECTORY ${WORK})
set(common --layers 2 --dim 48 --heads 4 --seq 16 --batch 8 --steps 5 --grad-clip 1.0
           --weight-decay 0.1 --bucket-mb 0.02 --quiet)
foreach(zero 0 1 2 3)
  set(local ${WORK}/local_np${NP}_z${zero}.jsonl)
  set(mpi ${WORK}/mpi_np${NP}_z${zero}.jsonl)
  execute_process(COMMAND ${TRAIN} ${common} --ranks ${NP} --zero ${zero} --log-json ${local}
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fourway-train --backend local --ranks ${NP} --zero ${zero} failed: ${rc}")
  endif()
  execute_process(COMMAND ${MPIEXEC} ${NPFLAG} ${NP} --oversubscribe --allow-run-as-root
                          --bind-to none ${TRAIN} ${common} --backend mpi --zero ${zero}
                          --log-json ${mpi}
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mpirun -np ${NP} fourway-train --backend mpi --zero ${zero} failed: ${rc}")
  endif()
  # fp32; MPI_Allreduce may sum the ranks in another order than LocalWorld: 1e-5 relative.
  execute_process(COMMAND ${COMPARE} ${mpi} ${local} 1e-5 RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  message(STATUS "np ${NP} zero ${zero}:\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "np ${NP} zero ${zero}: MPI losses differ from LocalWorld's")
  endif()
endforeach()

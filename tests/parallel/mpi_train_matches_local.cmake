# fourway-train --backend mpi under MPIRUN (NP processes) against --backend local --ranks NP, for
# every --zero stage: compare_runs checks losses (validation losses with DATA), communication,
# per-rank memory and the saved parameters. Arguments: TRAIN, FAULTY, COMPARE, MPIRUN (the mpirun
# command line), NP, NEGATIVE, WORK, [DATA].
#
# NEGATIVE=ON is the control: the MPI ranks run FAULTY (train_skip_collectives.cpp, a test build
# of the program whose ranks skip their collectives, each alone on its share of the batch), and
# the test passes only when compare_runs reports the runs differ in losses, parameters and
# communication (and in memory where ZeRO shards).
file(MAKE_DIRECTORY ${WORK})
set(common --layers 2 --dim 48 --heads 4 --seq 16 --batch 8 --steps 5 --grad-clip 1.0
           --weight-decay 0.1 --bucket-mb 0.02 --quiet)
include(${CMAKE_CURRENT_LIST_DIR}/val_data.cmake)
fourway_append_val_data(common)  # with DATA: the validation loss too
set(stages 0 1 2 3)
set(mpi_train ${TRAIN})
if(NEGATIVE)
  set(stages 0 3)
  set(mpi_train ${FAULTY})
endif()
foreach(zero IN LISTS stages)
  set(local ${WORK}/local_np${NP}_z${zero})
  set(mpi ${WORK}/mpi_np${NP}_z${zero})
  execute_process(COMMAND ${TRAIN} ${common} --ranks ${NP} --zero ${zero}
                          --log-json ${local}.jsonl --save ${local}.safetensors
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fourway-train --backend local --ranks ${NP} --zero ${zero} failed: ${rc}\n${out}\n${err}")
  endif()
  execute_process(COMMAND ${MPIRUN} ${mpi_train} ${common} --backend mpi --zero ${zero}
                          --log-json ${mpi}.jsonl --save ${mpi}.safetensors
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mpirun -np ${NP} fourway-train --backend mpi --zero ${zero} failed: ${rc}\n${out}\n${err}")
  endif()
  # fp32; MPI_Allreduce may sum the ranks in another order than LocalWorld: 1e-5 relative.
  execute_process(COMMAND ${COMPARE} ${mpi}.jsonl ${local}.jsonl ${mpi}.safetensors
                          ${local}.safetensors 1e-5
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "np ${NP} zero ${zero}:\n${out}${err}")
  if(NOT NEGATIVE AND NOT rc EQUAL 0)
    message(FATAL_ERROR "np ${NP} zero ${zero}: the MPI run differs from LocalWorld's")
  endif()
  if(NEGATIVE)
    set(expect "runs differ in:.* losses.* communication.*parameters")
    if(zero GREATER 0)
      set(expect "runs differ in:.* losses.* communication.* memory.* parameters")
    endif()
    if(NOT rc EQUAL 1 OR NOT out MATCHES "${expect}")
      message(FATAL_ERROR "np ${NP} zero ${zero}: ranks that skipped their collectives were not "
                          "caught (compare_runs exit ${rc}, expected 1 and '${expect}')")
    endif()
  endif()
endforeach()

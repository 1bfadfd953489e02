# The longest sequence that trains under a fixed per-rank memory cap (issue 48): fourway-train
# --memory-cap-gb CAP runs one step of the same model at growing --seq, once on one rank and once
# on a context-parallel mesh of 4 (--cp 4: each rank holds seq/4 tokens of the sequence), and a
# binary search finds the longest --seq (a multiple of 8, so that 4 ranks cut it into 8 chunks)
# that trains on each. The cp4 mesh must reach at least 3.5x the one rank's. A run that fails for
# any reason other than the accountant's out-of-memory error fails the test. The model is deep
# and narrow (12 blocks of width 64) so that the activations, which context parallelism splits,
# outweigh what every rank holds whole and what grows with --seq too: the position table (a
# random model's context is --seq) and the ring's key/value buffers. Measured here: one rank
# 328 tokens, --cp 4 1264 (3.85x) under 0.03 GB.
# Arguments: TRAIN (fourway-train), CAP (GB per rank), [HI] (the search's upper end, tokens).
if(NOT HI)
  set(HI 8192)
endif()
set(model --layers 12 --dim 64 --heads 4 --vocab 512 --batch 1 --steps 1 --quiet
          --memory-cap-gb ${CAP})

# ${out} is TRUE when one step at --seq `seq` trains on `cp` context-parallel ranks.
function(trains cp seq out)
  execute_process(COMMAND ${TRAIN} ${model} --seq ${seq} --cp ${cp}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(rc EQUAL 0)
    set(${out} TRUE PARENT_SCOPE)
  elseif("${o}${e}" MATCHES "out of memory on rank")
    set(${out} FALSE PARENT_SCOPE)
  else()
    message(FATAL_ERROR "--cp ${cp} --seq ${seq} failed other than out of memory (${rc}):\n${o}\n${e}")
  endif()
endfunction()

# ${out}: the longest multiple of 8 in [8, HI] that trains on `cp` ranks (0: none does).
function(longest cp out)
  set(lo 0)  # in units of 8 tokens: lo trains (or is 0), hi + 1 does not
  math(EXPR hi "${HI} / 8")
  trains(${cp} ${HI} ok)
  if(ok)
    message(FATAL_ERROR "--cp ${cp} trains even --seq ${HI}: raise HI or lower CAP")
  endif()
  math(EXPR hi "${hi} - 1")
  while(lo LESS hi)
    math(EXPR mid "(${lo} + ${hi} + 1) / 2")
    math(EXPR seq "${mid} * 8")
    trains(${cp} ${seq} ok)
    if(ok)
      set(lo ${mid})
    else()
      math(EXPR hi "${mid} - 1")
    endif()
  endwhile()
  math(EXPR longest "${lo} * 8")
  set(${out} ${longest} PARENT_SCOPE)
endfunction()

longest(1 one)
longest(4 four)
if(one EQUAL 0)
  message(FATAL_ERROR "no --seq trains on one rank under ${CAP} GB: raise CAP")
endif()
math(EXPR ratio_x100 "${four} * 100 / ${one}")
message(STATUS "longest sequence under ${CAP} GB per rank: one rank ${one} tokens, --cp 4 ${four} "
               "tokens (${ratio_x100}/100 x)")
if(ratio_x100 LESS 350)
  message(FATAL_ERROR "--cp 4 trains ${four} tokens under ${CAP} GB per rank, one rank ${one}: "
                      "${ratio_x100}/100 x, below the 3.5 x context parallelism owes")
endif()

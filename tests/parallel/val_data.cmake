# Included by the program tests' scripts: with DATA (fourway-data) set, writes WORK/bytes_val.bin
# (the byte ids of a licence text's last 600 bytes, `--tokenizer bytes`) and appends to the list
# `var` the flags that evaluate it every 2 steps and after the last (docs/train.md, "Validation").
function(fourway_append_val_data var)
  if(NOT DATA)
    return()
  endif()
  execute_process(COMMAND ${DATA} encode --tokenizer bytes --out ${WORK}/bytes --val-tokens 600
                          /usr/share/common-licenses/GPL-3
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fourway-data encode --tokenizer bytes failed: ${rc}\n${err}")
  endif()
  set(${var} ${${var}} --val-data ${WORK}/bytes_val.bin --eval-every 2 --eval-batches 2
      PARENT_SCOPE)
endfunction()

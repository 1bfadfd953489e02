# The generic runtime names no model (docs/design.md §1): the strategies of train/ and the
# pipeline machinery of parallel/pp/ speak ModelPart and CutCosts (layers/model_part.hpp) and get
# their models from a model family (models/gpt2.hpp registers GPT-2's); checkpoint/ knows slices
# and runs, not a policy's model. Outside comments, a header of
#   train/, parallel/pp/   may not name `models::`, a `Gpt` type, or include layers/gpt.hpp or
#                          models/
#   checkpoint/            may not name a model type (`Gpt<`) or include parallel/ or models/
# Usage: cmake -DROOT=<dir holding fourway/> -P check_model_free.cmake   (fails listing each line)
if(NOT ROOT)
  message(FATAL_ERROR "check_model_free.cmake: pass -DROOT=<directory that holds fourway/>")
endif()
get_filename_component(ROOT "${ROOT}" ABSOLUTE)
set(_generic_code "models::|Gpt")
set(_generic_includes "fourway/layers/gpt\\.hpp|fourway/models/")
set(_checkpoint_code "Gpt<")
set(_checkpoint_includes "fourway/parallel/|fourway/models/")
file(GLOB_RECURSE _headers RELATIVE ${ROOT} ${ROOT}/fourway/train/*.hpp
     ${ROOT}/fourway/parallel/pp/*.hpp ${ROOT}/fourway/checkpoint/*.hpp)
list(SORT _headers)
set(_found "")
set(_checked 0)
foreach(_h IN LISTS _headers)
  if(_h MATCHES "^fourway/checkpoint/")
    set(_code_words "${_checkpoint_code}")
    set(_include_words "${_checkpoint_includes}")
  else()
    set(_code_words "${_generic_code}")
    set(_include_words "${_generic_includes}")
  endif()
  math(EXPR _checked "${_checked} + 1")
  file(STRINGS ${ROOT}/${_h} _lines)
  set(_n 0)
  foreach(_l IN LISTS _lines)
    math(EXPR _n "${_n} + 1")
    string(REGEX REPLACE "//.*$" "" _code "${_l}")  # comments may name a model
    if(_code MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
      set(_words "${_include_words}")  # an include line: the header it names
      set(_code "${CMAKE_MATCH_1}")
    else()
      set(_words "${_code_words}")
    endif()
    if(_code MATCHES "(${_words})")
      list(APPEND _found "${_h}:${_n}: names ${CMAKE_MATCH_1}")
    endif()
  endforeach()
endforeach()
if(_checked EQUAL 0)
  message(FATAL_ERROR "fourway: no header of train/, parallel/pp/ or checkpoint/ under ${ROOT}")
endif()
list(LENGTH _found _count)
if(_count GREATER 0)
  string(REPLACE ";" "\n  " _text "${_found}")
  message(FATAL_ERROR "${_count} line(s) of the generic runtime name a model (a model family in "
                      "models/ supplies it):\n  ${_text}")
endif()
message(STATUS "model-free runtime: ${_checked} headers of train/, parallel/pp/ and "
               "checkpoint/ name no model")

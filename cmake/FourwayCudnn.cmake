# Finding cuDNN and the cudnn-frontend headers for the optional `fourway::cudnn` component
# (docs/building.md, "cuDNN attention"). Script-safe: tests/tools/cudnn_find_check.cmake runs it
# under `cmake -P` against made-up install trees (present, absent, too old).
#
#   fourway_find_cudnn(<prefix> [ONLY_HINTS] [CUDNN_HINTS dir...] [FRONTEND_HINTS dir...])
#
# Looks for cudnn_version.h and libcudnn under CUDNN_HINTS (each dir, its include/ and lib64/ or
# lib/), and cudnn_frontend.h + cudnn_frontend_version.h under FRONTEND_HINTS (each dir and its
# include/; PyPI's nvidia-cudnn-frontend wheel puts them in <site-packages>/include), then in the
# system paths unless ONLY_HINTS (the tests: the machine's own cuDNN must not answer). Sets in the
# caller's scope:
#   <prefix>_FOUND              TRUE when both were found and are new enough
#   <prefix>_SUMMARY            one line: what was found where, or why the component is off
#   <prefix>_VERSION            cuDNN's major.minor.patch ("" when absent)
#   <prefix>_INCLUDE_DIR, <prefix>_LIBRARY, <prefix>_FRONTEND_INCLUDE_DIR, <prefix>_FRONTEND_VERSION
# Nothing is cached (NO_CACHE): a new hint in a later configure is seen.

set(FOURWAY_CUDNN_MIN_VERSION 9.0.0)           # the SDPA graph with its backward: cuDNN 9
set(FOURWAY_CUDNN_FRONTEND_MIN_VERSION 1.0.0)  # the graph API (cudnn_frontend::graph)

# The version "<major>.<minor>.<patch>" a header defines with these three macro names, or "" when
# one is missing.
function(_fourway_header_version header major minor patch out)
  file(READ "${header}" text)
  set(parts "")
  foreach(name ${major} ${minor} ${patch})
    if(NOT text MATCHES "#define[ \t]+${name}[ \t]+([0-9]+)")
      set(${out} "" PARENT_SCOPE)
      return()
    endif()
    list(APPEND parts ${CMAKE_MATCH_1})
  endforeach()
  string(REPLACE ";" "." version "${parts}")
  set(${out} ${version} PARENT_SCOPE)
endfunction()

# Inside fourway_find_cudnn: the component is off; the pieces make the summary line (no ';' in
# them: it would split the macro's arguments).
macro(_fourway_cudnn_off)
  string(CONCAT summary ${ARGN})
  set(${prefix}_SUMMARY "${summary}" PARENT_SCOPE)
  return()
endmacro()

function(fourway_find_cudnn prefix)
  cmake_parse_arguments(A "ONLY_HINTS" "" "CUDNN_HINTS;FRONTEND_HINTS" ${ARGN})
  set(where "")
  if(A_ONLY_HINTS)
    set(where NO_DEFAULT_PATH)
  endif()
  foreach(v SUMMARY VERSION INCLUDE_DIR LIBRARY FRONTEND_INCLUDE_DIR FRONTEND_VERSION)
    set(${prefix}_${v} "" PARENT_SCOPE)
  endforeach()
  set(${prefix}_FOUND FALSE PARENT_SCOPE)

  find_path(_inc cudnn_version.h HINTS ${A_CUDNN_HINTS} PATH_SUFFIXES include NO_CACHE ${where})
  if(NOT _inc)
    string(REPLACE ";" ", " hints "${A_CUDNN_HINTS}")
    if(NOT A_ONLY_HINTS)
      string(APPEND hints ", the system paths")
    endif()
    _fourway_cudnn_off("cudnn_version.h not found (looked in: ${hints}): install cuDNN "
                       "${FOURWAY_CUDNN_MIN_VERSION} or newer, or pass "
                       "-DFOURWAY_CUDNN_ROOT=<dir>")
  endif()
  string(REGEX REPLACE "/$" "" _inc "${_inc}")
  _fourway_header_version("${_inc}/cudnn_version.h" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL
                          version)
  if(version STREQUAL "")
    _fourway_cudnn_off("${_inc}/cudnn_version.h names no CUDNN_MAJOR/MINOR/PATCHLEVEL")
  endif()
  set(${prefix}_VERSION ${version} PARENT_SCOPE)
  if(version VERSION_LESS FOURWAY_CUDNN_MIN_VERSION)
    _fourway_cudnn_off("cuDNN ${version} at ${_inc} is too old: the attention graph needs "
                       "${FOURWAY_CUDNN_MIN_VERSION} or newer")
  endif()
  find_library(_lib cudnn HINTS ${A_CUDNN_HINTS} PATH_SUFFIXES lib64 lib NO_CACHE ${where})
  if(NOT _lib)
    _fourway_cudnn_off("cuDNN ${version} headers at ${_inc} but no libcudnn beside them (pass "
                       "-DFOURWAY_CUDNN_ROOT=<dir> whose lib64/ or lib/ holds it)")
  endif()

  find_path(_fe cudnn_frontend.h HINTS ${A_FRONTEND_HINTS} PATH_SUFFIXES include NO_CACHE ${where})
  if(NOT _fe OR NOT EXISTS "${_fe}/cudnn_frontend_version.h")
    _fourway_cudnn_off("cuDNN ${version} found, but not the cudnn-frontend headers "
                       "(cudnn_frontend.h, cudnn_frontend_version.h): pip install "
                       "nvidia-cudnn-frontend and pass "
                       "-DFOURWAY_CUDNN_FRONTEND_DIR=<site-packages>/include")
  endif()
  string(REGEX REPLACE "/$" "" _fe "${_fe}")
  _fourway_header_version("${_fe}/cudnn_frontend_version.h" CUDNN_FRONTEND_MAJOR_VERSION
                          CUDNN_FRONTEND_MINOR_VERSION CUDNN_FRONTEND_PATCH_VERSION fversion)
  if(fversion STREQUAL "" OR fversion VERSION_LESS FOURWAY_CUDNN_FRONTEND_MIN_VERSION)
    _fourway_cudnn_off("cudnn-frontend ${fversion} at ${_fe} is too old: the graph API needs "
                       "${FOURWAY_CUDNN_FRONTEND_MIN_VERSION} or newer")
  endif()

  set(${prefix}_FOUND TRUE PARENT_SCOPE)
  set(${prefix}_INCLUDE_DIR ${_inc} PARENT_SCOPE)
  set(${prefix}_LIBRARY ${_lib} PARENT_SCOPE)
  set(${prefix}_FRONTEND_INCLUDE_DIR ${_fe} PARENT_SCOPE)
  set(${prefix}_FRONTEND_VERSION ${fversion} PARENT_SCOPE)
  set(${prefix}_SUMMARY "cuDNN ${version} (${_lib}), cudnn-frontend ${fversion} (${_fe})"
      PARENT_SCOPE)
endfunction()

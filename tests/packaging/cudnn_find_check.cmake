# cmake -DCASE=<case> -DWORK=<dir> -DMODULE=<cmake/FourwayCudnn.cmake> -P cudnn_find_check.cmake
# Builds a made-up cuDNN install and cudnn-frontend header folder under WORK as CASE says, runs
# fourway_find_cudnn on them alone (ONLY_HINTS: the machine's own cuDNN must not answer) and
# fails unless it found them, or refused them with the reason, as expected:
#   present            cuDNN 9.1.0 + frontend 1.5.0      found, the versions and paths named
#   absent             nothing                           "cudnn_version.h not found"
#   too_old            cuDNN 8.9.7                       "cuDNN 8.9.7 ... is too old"
#   no_library         cuDNN 9 headers, no libcudnn      "no libcudnn beside them"
#   frontend_missing   cuDNN 9, no frontend headers      "not the cudnn-frontend headers"
#   frontend_too_old   cuDNN 9 + frontend 0.9.1          "cudnn-frontend 0.9.1 ... is too old"
include(${MODULE})
file(REMOVE_RECURSE ${WORK})
set(cudnn ${WORK}/cudnn)
set(fe ${WORK}/site-packages)
file(MAKE_DIRECTORY ${cudnn} ${fe})

function(write_cudnn major minor patch with_lib)
  file(WRITE ${cudnn}/include/cudnn_version.h
       "#define CUDNN_MAJOR ${major}\n#define CUDNN_MINOR ${minor}\n"
       "#define CUDNN_PATCHLEVEL ${patch}\n")
  if(with_lib)
    file(WRITE ${cudnn}/lib64/libcudnn.so "")
  endif()
endfunction()
function(write_frontend major minor patch)
  file(WRITE ${fe}/include/cudnn_frontend.h "#pragma once\n")
  file(WRITE ${fe}/include/cudnn_frontend_version.h
       "#define CUDNN_FRONTEND_MAJOR_VERSION ${major}\n#define CUDNN_FRONTEND_MINOR_VERSION "
       "${minor}\n#define CUDNN_FRONTEND_PATCH_VERSION ${patch}\n")
endfunction()

set(expect_found FALSE)
if(CASE STREQUAL "present")
  write_cudnn(9 1 0 TRUE)
  write_frontend(1 5 0)
  set(expect_found TRUE)
  set(expect "cuDNN 9.1.0 \\(${cudnn}/lib64/libcudnn.so\\), cudnn-frontend 1.5.0 \\(${fe}/include\\)$")
elseif(CASE STREQUAL "absent")
  set(expect "cudnn_version.h not found \\(looked in: ${cudnn}\\): install cuDNN 9.0.0 or newer")
elseif(CASE STREQUAL "too_old")
  write_cudnn(8 9 7 TRUE)
  write_frontend(1 5 0)
  set(expect "cuDNN 8.9.7 at ${cudnn}/include is too old: the attention graph needs 9.0.0")
elseif(CASE STREQUAL "no_library")
  write_cudnn(9 1 0 FALSE)
  write_frontend(1 5 0)
  set(expect "cuDNN 9.1.0 headers at ${cudnn}/include but no libcudnn beside them")
elseif(CASE STREQUAL "frontend_missing")
  write_cudnn(9 1 0 TRUE)
  set(expect "cuDNN 9.1.0 found, but not the cudnn-frontend headers .*pip install nvidia-cudnn-frontend")
elseif(CASE STREQUAL "frontend_too_old")
  write_cudnn(9 1 0 TRUE)
  write_frontend(0 9 1)
  set(expect "cudnn-frontend 0.9.1 at ${fe}/include is too old")
else()
  message(FATAL_ERROR "cudnn_find_check: unknown CASE '${CASE}'")
endif()

fourway_find_cudnn(got ONLY_HINTS CUDNN_HINTS ${cudnn} FRONTEND_HINTS ${fe})
message(STATUS "${CASE}: found=${got_FOUND}: ${got_SUMMARY}")
if(NOT got_FOUND STREQUAL expect_found)
  message(FATAL_ERROR "${CASE}: found=${got_FOUND}, expected ${expect_found}: ${got_SUMMARY}")
endif()
if(NOT got_SUMMARY MATCHES "${expect}")
  message(FATAL_ERROR "${CASE}: the summary '${got_SUMMARY}' does not match '${expect}'")
endif()
if(expect_found AND NOT (got_VERSION STREQUAL "9.1.0" AND got_FRONTEND_VERSION STREQUAL "1.5.0"))
  message(FATAL_ERROR "${CASE}: versions ${got_VERSION} / ${got_FRONTEND_VERSION}")
endif()

# The layer check (DEVELOPERS.md "Shape of the code", README "Architecture"): every #include of a
# lib/ header must point to the including file's own layer or one below it. Run by ctest
# (test `layer_check`) as `cmake -DSOURCE_DIR=<repo> -P cmake/CheckLayers.cmake`; exits non-zero
# listing each offending file:line.
#
# Layers, bottom to top (a folder may include its own and those listed for it):
#   base                      (CPU kernels, non-temporal copies, logging, names)
#   cuda                      base                         (the CUDA runtime seam)
#   store, config             base
#   backend                   base                         (what every backend inherits: BackendBase,
#                                                           OpDispatch, the Supports() checks)
#   gloo, hier, shm           base backend store config    (siblings: never each other)
#   nccl                      base backend store config cuda (a sibling too; the NCCL seam and
#                                                           backend)
#   trace                     base store config
#   core (runtime)            base cuda store config trace, and gloo/nccl/hier/shm only in the
#                             composition root (lib/core/selection/backend_selection.*), the one
#                             code that knows the concrete backends
#   precision                 base cuda store config trace core
#   diag                      base cuda store config nccl trace core precision
# Public headers (include/adaptcomm, and the extension interface include/adaptcomm/ext) include no
# lib/ header and no CUDA, NCCL, Gloo or yaml-cpp header. What a trainer includes
# (include/adaptcomm/*.h) includes no ext/ header: a trainer never compiles the backend interface.
cmake_minimum_required(VERSION 3.22)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "usage: cmake -DSOURCE_DIR=<repository root> -P CheckLayers.cmake")
endif()

set(allowed_base "base")
set(allowed_cuda "base;cuda")
set(allowed_store "base;store")
set(allowed_config "base;config")
set(allowed_backend "base;backend")
set(allowed_gloo "base;backend;store;config;gloo")
set(allowed_nccl "base;backend;cuda;store;config;nccl")
set(allowed_shm "base;backend;store;config;shm")
set(allowed_hier "base;backend;store;config;hier")
set(allowed_trace "base;store;config;trace")
set(allowed_core "base;cuda;store;config;trace;core")
set(allowed_precision "base;cuda;store;config;trace;core;precision")
set(allowed_diag "base;cuda;store;config;nccl;trace;core;precision;diag")
set(composition_root_files "lib/core/selection/backend_selection.cc;lib/core/selection/backend_selection.h")
set(composition_root_may "gloo;nccl;hier;shm")

set(violations "")
file(GLOB_RECURSE sources RELATIVE ${SOURCE_DIR}
     ${SOURCE_DIR}/lib/*.h ${SOURCE_DIR}/lib/*.cc ${SOURCE_DIR}/lib/*.cu)
foreach(file ${sources})
  string(REGEX MATCH "^lib/([a-z_]+)/" _ "${file}")
  set(layer "${CMAKE_MATCH_1}")
  if(NOT DEFINED allowed_${layer})
    list(APPEND violations "${file}: folder lib/${layer}/ is in no layer (add it to cmake/CheckLayers.cmake)")
    continue()
  endif()
  set(allowed ${allowed_${layer}})
  if(file IN_LIST composition_root_files)
    list(APPEND allowed ${composition_root_may})
  endif()
  file(STRINGS ${SOURCE_DIR}/${file} lines REGEX "^#include \"lib/")
  file(STRINGS ${SOURCE_DIR}/${file} all_lines)
  foreach(line ${lines})
    string(REGEX MATCH "^#include \"lib/([a-z_]+)/" _ "${line}")
    set(target "${CMAKE_MATCH_1}")
    if(NOT target IN_LIST allowed)
      list(FIND all_lines "${line}" index)
      math(EXPR line_no "${index} + 1")
      list(APPEND violations "${file}:${line_no}: lib/${layer} may not include lib/${target} (${line})")
    endif()
  endforeach()
endforeach()

file(GLOB_RECURSE public RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/include/adaptcomm/*.h)
foreach(file ${public})
  file(STRINGS ${SOURCE_DIR}/${file} lines
       REGEX "^#include [<\"](lib/|cuda|nccl|gloo/|yaml-cpp/)")
  foreach(line ${lines})
    list(APPEND violations "${file}: a public header includes ${line}")
  endforeach()
  if(NOT file MATCHES "^include/adaptcomm/ext/")
    file(STRINGS ${SOURCE_DIR}/${file} lines REGEX "^#include [<\"]adaptcomm/ext/")
    foreach(line ${lines})
      list(APPEND violations "${file}: a trainer's header includes the extension interface ${line}")
    endforeach()
  endif()
endforeach()

# The runtime's folders, one level down.
include(${CMAKE_CURRENT_LIST_DIR}/CheckCoreLayers.cmake)

if(violations)
  list(LENGTH violations n)
  string(REPLACE ";" "\n  " text "${violations}")
  message(FATAL_ERROR "layer check: ${n} include(s) break the layering:\n  ${text}")
endif()
message(STATUS "layer check: every lib/ include points to its own layer or below")

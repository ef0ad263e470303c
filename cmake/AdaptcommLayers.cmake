# The library's layers as CMake targets (README "Architecture"; cmake/CheckLayers.cmake checks the
# includes). Each lib/<layer>/CMakeLists.txt calls adaptcomm_layer(<layer> <sources>) and then links
# (for usage requirements only: objects never travel through an OBJECT library) the layers below it
# and the third-party libraries it may use. lib/CMakeLists.txt links every layer's objects into the
# installed shared library and into the static adaptcomm_internal.
include_guard(GLOBAL)

# Creates the OBJECT library adaptcomm_<layer>. Its code is compiled with hidden visibility: only
# what include/adaptcomm marks ADAPTCOMM_EXPORT leaves libadaptcomm.so (tests/exports.cmake).
function(adaptcomm_layer layer)
  set(target adaptcomm_${layer})
  add_library(${target} OBJECT ${ARGN})
  set_target_properties(${target} PROPERTIES
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON POSITION_INDEPENDENT_CODE ON)
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                              $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  adaptcomm_warnings(${target})
  set_property(GLOBAL APPEND PROPERTY ADAPTCOMM_LAYER_TARGETS ${target})
endfunction()

# An object library whose objects go into both libraries without being a layer of its own (the
# nvcc-compiled cast kernels of lib/cuda).
function(adaptcomm_layer_objects target)
  set_property(GLOBAL APPEND PROPERTY ADAPTCOMM_LAYER_TARGETS ${target})
endfunction()

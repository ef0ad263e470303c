# CUDA toolkit and NCCL headers for lib/cuda and lib/nccl (and bench/gpu_check).
#
# ADAPTCOMM_WITH_CUDA: AUTO (default: on when the toolkit and nccl.h are found), ON (required),
# OFF. The CUDA runtime is linked statically (CUDA::cudart_static) so that the library needs no
# libcudart at run time; NCCL is never linked: lib/nccl dlopen()s libnccl.so.2 at run time, so the
# same build runs on CPU-only nodes. Only nccl.h (for the ABI's types and constants) is needed here.
# Sets ADAPTCOMM_CUDA_FOUND and ADAPTCOMM_NCCL_INCLUDE_DIR, ADAPTCOMM_NCCL_LIBRARY (informational:
# the default library the loader would find).
include_guard(GLOBAL)

set(ADAPTCOMM_WITH_CUDA "AUTO" CACHE STRING "Build the NCCL backend: AUTO, ON or OFF")
set_property(CACHE ADAPTCOMM_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)

set(ADAPTCOMM_CUDA_FOUND FALSE)
string(TOUPPER "${ADAPTCOMM_WITH_CUDA}" _adaptcomm_with_cuda)
if(NOT _adaptcomm_with_cuda STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  set(_adaptcomm_nccl_hints ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_HOME} $ENV{NCCL_ROOT}
                            /usr/local/cuda /usr/local/nccl /usr)
  find_path(ADAPTCOMM_NCCL_INCLUDE_DIR nccl.h
            HINTS ${_adaptcomm_nccl_hints} PATH_SUFFIXES include)
  find_library(ADAPTCOMM_NCCL_LIBRARY NAMES libnccl.so.2 nccl
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${_adaptcomm_nccl_hints} PATH_SUFFIXES lib64 lib)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cudart_static AND ADAPTCOMM_NCCL_INCLUDE_DIR)
    set(ADAPTCOMM_CUDA_FOUND TRUE)
    message(STATUS "adaptcomm: NCCL backend enabled (CUDA ${CUDAToolkit_VERSION}, nccl.h in "
                   "${ADAPTCOMM_NCCL_INCLUDE_DIR}, run-time default ${ADAPTCOMM_NCCL_LIBRARY})")
  elseif(_adaptcomm_with_cuda STREQUAL "ON")
    message(FATAL_ERROR "ADAPTCOMM_WITH_CUDA=ON but the CUDA toolkit (found: ${CUDAToolkit_FOUND}) "
                        "or nccl.h (found: ${ADAPTCOMM_NCCL_INCLUDE_DIR}) is missing")
  else()
    message(STATUS "adaptcomm: NCCL backend not built (CUDA toolkit or nccl.h not found)")
  endif()
endif()

# The CUDA cast kernels of the device mixed-precision path (lib/cuda/cast_kernels.cu) need nvcc
# working with the host compiler: the CUDA language is enabled only when check_language(CUDA)
# succeeds. Without it (or with ADAPTCOMM_CUDA_KERNELS=OFF) the NCCL backend is still built, and
# the device mixed-precision ops return FailedPrecondition. ADAPTCOMM_CUDA_KERNELS_FOUND says
# which. Architectures: CMAKE_CUDA_ARCHITECTURES (default 80-real;90: A100 and H100/H200 code,
# plus compute_90 PTX that newer GPUs JIT-compile).
option(ADAPTCOMM_CUDA_KERNELS "Build the CUDA cast kernels when nvcc works" ON)
set(ADAPTCOMM_CUDA_KERNELS_FOUND FALSE)
if(ADAPTCOMM_CUDA_FOUND AND ADAPTCOMM_CUDA_KERNELS)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND CUDAToolkit_NVCC_EXECUTABLE)
    set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
  endif()
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX})
    set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
  endif()
  # A cache entry: targets created in other directories see it too.
  set(CMAKE_CUDA_ARCHITECTURES "80-real;90" CACHE STRING "CUDA architectures of the cast kernels")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(ADAPTCOMM_CUDA_KERNELS_FOUND TRUE)
    if(ADAPTCOMM_CCACHE AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env CCACHE_NOHASHDIR=1
                                       ${ADAPTCOMM_CCACHE})
    endif()
    message(STATUS "adaptcomm: CUDA cast kernels enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                   "architectures ${CMAKE_CUDA_ARCHITECTURES})")
  else()
    message(STATUS "adaptcomm: CUDA cast kernels not built (nvcc does not work with "
                   "${CMAKE_CXX_COMPILER}): device mixed precision is unavailable")
  endif()
endif()

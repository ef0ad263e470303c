# GPU check of the NCCL backend (bench/gpu_check.sh builds and runs it). Without a GPU it prints
# "no GPU" and exits 0; it uses adaptcomm's CUDA seam, so it needs no CUDA header itself.
add_executable(gpu_check ${CMAKE_CURRENT_LIST_DIR}/gpu_check.cc
                         ${CMAKE_CURRENT_LIST_DIR}/gpu_check_overhead.cc)
target_include_directories(gpu_check PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(gpu_check PRIVATE adaptcomm_internal absl::strings absl::time)
adaptcomm_warnings(gpu_check)

# Host cost of a stream-ordered device collective against the bare seam calls, on the fake NCCL
# (no GPU needed; the fake is built with the tests).
if(TARGET adaptcomm_fake_nccl)
  add_executable(stream_order_bench ${CMAKE_CURRENT_LIST_DIR}/stream_order_bench.cc)
  target_include_directories(stream_order_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(stream_order_bench PRIVATE adaptcomm_internal adaptcomm_fake_nccl absl::time)
  adaptcomm_warnings(stream_order_bench)
endif()

# Two ranks on one GPU: a communicator aborted mid-allreduce while a consumer kernel on the
# trainer's stream reads the result (bench/gpu_check.sh two-rank-abort; docs/gpu.md). Its kernels
# need nvcc: built where lib/cuda built its own. Not a test: it needs a GPU, CI has none.
if(TARGET adaptcomm_cuda_kernels)
  enable_language(CUDA)
  add_library(gpu_check_abort_kernels STATIC ${CMAKE_CURRENT_LIST_DIR}/gpu_check_abort.cu)
  set_property(TARGET gpu_check_abort_kernels PROPERTY COMPILE_OPTIONS "")
  set_target_properties(gpu_check_abort_kernels PROPERTIES CUDA_STANDARD 17
                                                           CUDA_STANDARD_REQUIRED ON)
  target_include_directories(gpu_check_abort_kernels PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(gpu_check_abort_kernels PRIVATE -Xcompiler=-Wall,-Wextra)
  if(ADAPTCOMM_WERROR)
    target_compile_options(gpu_check_abort_kernels PRIVATE --Werror=all-warnings
                                                           -Xcompiler=-Werror)
  endif()
  add_executable(gpu_check_abort ${CMAKE_CURRENT_LIST_DIR}/gpu_check_abort.cc)
  target_include_directories(gpu_check_abort PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(gpu_check_abort PRIVATE gpu_check_abort_kernels adaptcomm_internal
                                                absl::strings absl::time)
  adaptcomm_warnings(gpu_check_abort)
endif()

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

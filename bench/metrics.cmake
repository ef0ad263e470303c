# What metrics and a flood of scrapes cost a small shm allreduce (bench/metrics_bench.cc); its
# flooder opens raw sockets (open loop), so it needs no HTTP client.
add_executable(metrics_bench ${CMAKE_CURRENT_LIST_DIR}/metrics_bench.cc)
target_include_directories(metrics_bench PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(metrics_bench PRIVATE adaptcomm_internal absl::strings)
adaptcomm_warnings(metrics_bench)

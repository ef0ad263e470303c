# Tracing overhead: allreduce with and without the timeline writer (same run, ranks as threads).
add_executable(trace_bench ${CMAKE_CURRENT_LIST_DIR}/trace_bench.cc)
target_include_directories(trace_bench PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(trace_bench PRIVATE adaptcomm_internal absl::synchronization)
adaptcomm_warnings(trace_bench)

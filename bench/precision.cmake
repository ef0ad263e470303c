# Mixed-precision benchmark: bf16-wire vs fp32 allreduce (forked ranks) and cast throughput vs
# memcpy. Uses the test harness only for PickFreePort.
if(TARGET adaptcomm_test_harness)
  add_executable(precision_bench ${CMAKE_CURRENT_LIST_DIR}/precision_bench.cc)
  target_include_directories(precision_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(precision_bench PRIVATE adaptcomm_internal adaptcomm_test_harness absl::strings)
  adaptcomm_warnings(precision_bench)
endif()

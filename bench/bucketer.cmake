# The gradient bucketer against one allreduce per tensor and one allreduce of the same bytes
# (bench/bucketer_bench.cc). Forks its ranks with the test harness.
if(TARGET adaptcomm_test_harness)
  add_executable(bucketer_bench ${CMAKE_CURRENT_LIST_DIR}/bucketer_bench.cc)
  target_include_directories(bucketer_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(bucketer_bench PRIVATE adaptcomm_internal adaptcomm_test_harness
                                               absl::strings)
  adaptcomm_warnings(bucketer_bench)
endif()

# Elastic shrink's recovery time against the world size (#14): ranks are threads run by the test
# harness (tests/harness.h), a rank vanishes through tests/cuttable_store.h.
if(TARGET adaptcomm_test_harness)
  add_executable(elastic_scaling_bench ${CMAKE_CURRENT_LIST_DIR}/elastic_scaling_bench.cc)
  target_include_directories(elastic_scaling_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(elastic_scaling_bench PRIVATE adaptcomm_internal adaptcomm_test_harness
                                                      absl::strings absl::synchronization)
  adaptcomm_warnings(elastic_scaling_bench)
endif()

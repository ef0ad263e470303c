# Init time of N thread-ranks through the TCP store and through a Redis or etcd server, with the
# store requests each rank makes (bench/RESULTS.md, "Store: init time").
add_executable(store_init_bench ${CMAKE_CURRENT_LIST_DIR}/store_init_bench.cc)
target_include_directories(store_init_bench PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(store_init_bench PRIVATE adaptcomm_internal adaptcomm_test_harness absl::strings
                                               absl::synchronization)
adaptcomm_warnings(store_init_bench)

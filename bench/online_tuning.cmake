# Online tuning's cost during its trial window and its gain after it (bench/online_tuning_bench.cc).
add_executable(online_tuning_bench ${CMAKE_CURRENT_LIST_DIR}/online_tuning_bench.cc)
target_include_directories(online_tuning_bench PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(online_tuning_bench PRIVATE adaptcomm_internal absl::strings)
adaptcomm_warnings(online_tuning_bench)

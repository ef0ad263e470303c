# The shm backend against the Gloo backend, both driven directly (bench/shm_bench.cc).
add_executable(shm_bench ${CMAKE_CURRENT_LIST_DIR}/shm_bench.cc)
target_include_directories(shm_bench PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(shm_bench PRIVATE adaptcomm_internal absl::strings)
adaptcomm_warnings(shm_bench)

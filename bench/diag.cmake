# Diagnostics benchmarks: Karmarkar-Karp sequence balancing against greedy LPT.
if(NOT TARGET benchmark::benchmark)
  find_package(benchmark CONFIG REQUIRED)
endif()
add_executable(balance_bench ${CMAKE_CURRENT_LIST_DIR}/balance_bench.cc)
target_link_libraries(balance_bench PRIVATE adaptcomm_internal benchmark::benchmark)
adaptcomm_warnings(balance_bench)

# Fail-slow detection: the CI test shares its job runner with the 20-run accuracy sweeps and the
# clean 10-minute run (label soak).
target_sources(failslow_test PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/slow_job.cc)
add_executable(failslow_soak failslow_soak.cc slow_job.cc)
target_link_libraries(failslow_soak PRIVATE adaptcomm_test_harness GTest::gtest_main
                                            nlohmann_json::nlohmann_json)
target_include_directories(failslow_soak PRIVATE ${PROJECT_SOURCE_DIR})
adaptcomm_warnings(failslow_soak)
add_test(NAME soak_failslow_sweep COMMAND failslow_soak --gtest_filter=FailSlowSoak.Sweep*)
add_test(NAME soak_failslow_clean_10min COMMAND failslow_soak
                                                --gtest_filter=FailSlowSoak.CleanTenMinutes)
set_tests_properties(soak_failslow_sweep soak_failslow_clean_10min
                     PROPERTIES LABELS soak TIMEOUT 3600 ENVIRONMENT "ADAPTCOMM_LOG_LEVEL=error")

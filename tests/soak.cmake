# Long fault runs: `ctest -L soak` (not part of the default suite, which excludes the label).
add_test(NAME soak_stopped_rank_100_rounds
         COMMAND fault_test --gtest_filter=Fault.StoppedRankRecoversWithCoordinatedRetryBitExact
                 --gtest_repeat=100 --gtest_break_on_failure)
add_test(NAME soak_link_down_100_rounds
         COMMAND netns_fault_test --gtest_repeat=100 --gtest_break_on_failure)
add_test(NAME soak_killed_rank_20_rounds
         COMMAND fault_test --gtest_filter=Fault.KilledRank* --gtest_repeat=20
                 --gtest_break_on_failure)
set_tests_properties(soak_stopped_rank_100_rounds soak_link_down_100_rounds
                     soak_killed_rank_20_rounds
                     PROPERTIES LABELS soak TIMEOUT 7200 ENVIRONMENT "ADAPTCOMM_LOG_LEVEL=error")
# #14: 100 rounds of kill-and-shrink (50 on Gloo, 50 on shared memory), every post-shrink result
# checked element by element.
add_test(NAME soak_elastic_shrink_100_rounds
         COMMAND elastic_test --gtest_filter=Elastic.KilledRankShrinks* --gtest_repeat=50
                 --gtest_break_on_failure)
set_tests_properties(soak_elastic_shrink_100_rounds
                     PROPERTIES LABELS soak TIMEOUT 7200 ENVIRONMENT "ADAPTCOMM_LOG_LEVEL=error")
# The demo trainer across two network-namespace hosts, one link cut for 15 s mid-run: about a
# minute of wall time, most of it waiting out the cut and TCP's retransmission backoff.
add_executable(demo_link_cut_soak demo_link_cut_soak.cc)
target_link_libraries(demo_link_cut_soak PRIVATE adaptcomm_test_harness GTest::gtest_main)
target_include_directories(demo_link_cut_soak PRIVATE ${PROJECT_SOURCE_DIR})
adaptcomm_warnings(demo_link_cut_soak)
add_test(NAME soak_demo_link_cut_15s COMMAND demo_link_cut_soak)
set_tests_properties(soak_demo_link_cut_15s PROPERTIES LABELS soak TIMEOUT 900)
# 256 Gloo ranks as threads created and through a first allreduce within 60 s, with lazy
# connections (docs/scale.md); about 10-30 s on 2 cores.
add_test(NAME soak_lazy_connect_256_ranks
         COMMAND lazy_connect_test --gtest_also_run_disabled_tests
                 --gtest_filter=LazyConnectTest.DISABLED_StartsTwoHundredFiftySixRanks)
set_tests_properties(soak_lazy_connect_256_ranks
                     PROPERTIES LABELS soak TIMEOUT 600 ENVIRONMENT "ADAPTCOMM_LOG_LEVEL=error")

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

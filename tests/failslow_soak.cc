// Fail-slow detection's accuracy with the default window (label soak, `ctest -L soak`): 20 runs
// per scenario (one rank 30% slow, one rank 10% slow, two ranks 30% slow), each counted correct
// when every rank was told of every slowed rank within 30 s and of no other; and a clean
// 10-minute run that must name nobody. Prints the detection latencies.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/slow_job.h"

namespace adaptcomm {
namespace {

using testing::RunSlowJob;
using testing::SlowJobResult;
using testing::SlowJobSpec;

constexpr int kRuns = 20;

// Runs `kRuns` jobs, run i slowing the ranks slowed(i) by `slowdown`; returns how many were
// correct.
int Sweep(const std::string& scenario, double slowdown, const std::string& monitor_yaml,
          const std::function<std::vector<int>(int)>& slowed) {
  int correct = 0;
  std::vector<double> latencies;
  for (int run = 0; run < kRuns; ++run) {
    SlowJobSpec spec;
    spec.name = absl::StrCat("soak_", scenario, "_", run);
    spec.slowdown.assign(4, 0);
    for (int r : slowed(run)) spec.slowdown[static_cast<size_t>(r)] = slowdown;
    spec.monitor_yaml = monitor_yaml;
    spec.bound = absl::Seconds(35);
    const SlowJobResult result = RunSlowJob(spec);
    const std::vector<int> ranks = testing::SlowedRanks(spec);
    const absl::Duration told = testing::TimeAllTold(result, ranks);
    const std::vector<int> wrong = testing::WronglyNamed(result, ranks);
    const bool ok = result.values_ok && told <= absl::Seconds(30) && wrong.empty();
    correct += ok ? 1 : 0;
    if (told != absl::InfiniteDuration()) latencies.push_back(absl::ToDoubleSeconds(told));
    std::printf("%s run %2d: slowed %s, all ranks told after %s, wrongly named %zu, %s\n",
                scenario.c_str(), run, absl::StrJoin(ranks, ",").c_str(),
                absl::FormatDuration(told).c_str(), wrong.size(), ok ? "correct" : "WRONG");
  }
  std::sort(latencies.begin(), latencies.end());
  const auto at = [&latencies](double q) {
    return latencies.empty() ? 0.0
                             : latencies[std::min(latencies.size() - 1,
                                                  static_cast<size_t>(q * latencies.size()))];
  };
  std::printf(
      "%s: %d/%d correct; latency to every rank told: min %.1f s, median %.1f s, "
      "p90 %.1f s, max %.1f s\n",
      scenario.c_str(), correct, kRuns, at(0), at(0.5), at(0.9),
      latencies.empty() ? 0.0 : latencies.back());
  std::fflush(stdout);
  return correct;
}

TEST(FailSlowSoak, SweepOneRankThirtyPercent) {
  EXPECT_GE(Sweep("one_rank_30pct", 0.3, "", [](int run) { return std::vector<int>{run % 4}; }),
            19);
}

// At the default threshold (0.15) a rank 10% slow scores about 0.1 and is not named: the sweep
// runs with the threshold at 0.05.
TEST(FailSlowSoak, SweepOneRankTenPercent) {
  EXPECT_GE(Sweep("one_rank_10pct", 0.1, "    slow_threshold: 0.05\n",
                  [](int run) { return std::vector<int>{run % 4}; }),
            19);
}

TEST(FailSlowSoak, SweepTwoRanksThirtyPercent) {
  EXPECT_GE(Sweep("two_ranks_30pct", 0.3, "",
                  [](int run) {
                    return std::vector<int>{run % 4, (run + 2) % 4};
                  }),
            19);
}

TEST(FailSlowSoak, CleanTenMinutes) {
  SlowJobSpec spec;
  spec.name = "soak_clean";
  spec.slowdown.assign(4, 0);
  spec.bound = absl::Minutes(10);
  spec.keep_running = true;
  const SlowJobResult result = RunSlowJob(spec);
  EXPECT_TRUE(result.values_ok);
  size_t alarms = 0;
  for (const auto& events : result.events) alarms += events.size();
  EXPECT_EQ(alarms, 0u);
  std::printf("clean: %d steps in %s, %zu events; final scores %s\n", result.steps,
              absl::FormatDuration(result.ran).c_str(), alarms,
              absl::StrJoin(result.status_slowness, " ").c_str());
}

}  // namespace
}  // namespace adaptcomm

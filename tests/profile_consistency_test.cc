// Same profile on every rank: ranks as threads over an in-process store.
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "gtest/gtest.h"
#include "lib/config/profile_loader.h"
#include "tests/profile_test_util.h"

namespace adaptcomm {
namespace {

using ::adaptcomm::testing::Registry;

EffectiveConfig WithCollective(const std::string& collective) {
  config::ResolveInputs in;
  in.text = "defaults:\n  timeouts:\n    collective: " + collective +
            "\n    heartbeat: 5000s\ntiers: [{name: t}]\n";
  in.file = "c.yaml";
  in.world_size = 4;
  auto cfg = config::ResolveFromText(in, Registry());
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return *cfg;
}

std::vector<absl::Status> RunRanks(const std::vector<EffectiveConfig>& cfgs,
                                   absl::Duration timeout = absl::Seconds(10)) {
  auto store = CreateHashStore();
  std::vector<absl::Status> results(cfgs.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < cfgs.size(); ++r) {
    threads.emplace_back([&, r] {
      results[r] = CheckSameConfigOnAllRanks(*store, static_cast<int>(r),
                                             static_cast<int>(cfgs.size()), cfgs[r], timeout);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(ProfileConsistency, SameConfigPasses) {
  EffectiveConfig cfg = WithCollective("1200s");
  EXPECT_EQ(cfg.Hash(), WithCollective("20min").Hash());  // same value, other spelling
  for (const absl::Status& s : RunRanks({cfg, cfg, cfg, cfg})) EXPECT_TRUE(s.ok()) << s;
}

TEST(ProfileConsistency, MismatchFailsEveryRankNamingRanksAndKeys) {
  EffectiveConfig a = WithCollective("1200s");
  EffectiveConfig b = WithCollective("2400s");
  ASSERT_NE(a.Hash(), b.Hash());
  std::vector<absl::Status> results = RunRanks({a, a, b, a});
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << r;
    EXPECT_TRUE(absl::StrContains(results[r].message(),
                                  "rank 2 differs from rank 0 on gloo.timeout (2400s vs 1200s), "
                                  "timeouts.collective (2400s vs 1200s), timeouts.collective_base "
                                  "(2400s vs 1200s)"))
        << results[r];
    EXPECT_TRUE(absl::StrContains(results[r].message(), "1 of 4 differ from rank 0")) << results[r];
  }
}

TEST(ProfileConsistency, MissingRankIsBounded) {
  auto store = CreateHashStore();
  EffectiveConfig cfg = WithCollective("1200s");
  absl::Time start = absl::Now();
  absl::Status s = CheckSameConfigOnAllRanks(*store, 0, 2, cfg, absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(CheckSameConfigOnAllRanks(*store, 3, 2, cfg, absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adaptcomm

// The retry vote of FailureCoordinator, rank by rank on one in-process store: the restart point is
// the smallest position, the degrade decision is the OR of every rank's wish (so ranks whose
// clocks see the degrade window differently still build the same backend), and a rank that never
// votes is named.
#include "lib/core/resilience/failure_coordinator.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/counting_store.h"

namespace adaptcomm::internal {
namespace {

using ::testing::HasSubstr;

// A backend that is never run: the vote only needs something to hand back.
class IdleBackend final : public Backend {
 public:
  explicit IdleBackend(int rank) : rank_(rank) {}
  const char* name() const override { return "idle"; }
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  Capabilities capabilities() const override { return {}; }
  absl::Status Supports(const OpDesc&) const override { return absl::OkStatus(); }
  absl::Status Run(const OpDesc&) override { return absl::OkStatus(); }
  void Abort(const absl::Status&) override {}
  absl::Status health() const override { return absl::OkStatus(); }

 private:
  int rank_;
};

struct VoteResult {
  absl::StatusOr<RecoveryPlan> plan = absl::UnknownError("not run");
  int built_generation = -1;
  bool built_degraded = false;
};

// Ranks vote for generation 1 at `positions[r]` with degrade wish `wishes[r]`; a rank whose
// position is 0 does not vote at all.
// `calls` (optional): the store requests each rank made.
std::vector<VoteResult> Vote(const std::vector<uint64_t>& positions,
                             const std::vector<bool>& wishes, std::vector<int>* calls = nullptr,
                             absl::Duration vote_timeout = absl::Milliseconds(500)) {
  const int n = static_cast<int>(positions.size());
  auto shared = CreateHashStore();
  std::vector<std::shared_ptr<testing::CountingStore>> stores;
  std::vector<std::unique_ptr<FailureCoordinator>> coordinators;
  std::vector<VoteResult> results(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    FailureCoordinatorOptions o;
    o.rank = r;
    o.world_size = n;
    o.name = "vote";
    o.max_attempts = 3;
    o.initial_backoff = absl::Milliseconds(1);
    o.vote_timeout = vote_timeout;
    stores.push_back(std::make_shared<testing::CountingStore>(shared));
    coordinators.push_back(std::make_unique<FailureCoordinator>(o, stores.back(), nullptr));
    VoteResult* result = &results[static_cast<size_t>(r)];
    coordinators.back()->Start(
        [](const absl::Status&) {}, [](int) {},
        BackendRebuilder{[wish = wishes[static_cast<size_t>(r)]] { return wish; },
                         [result, r](int generation, bool degrade) {
                           result->built_generation = generation;
                           result->built_degraded = degrade;
                           return absl::StatusOr<std::unique_ptr<Backend>>(
                               std::make_unique<IdleBackend>(r));
                         },
                         {},
                         {}});
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    if (positions[static_cast<size_t>(r)] == 0) continue;
    threads.emplace_back([&, r] {
      results[static_cast<size_t>(r)].plan = coordinators[static_cast<size_t>(r)]->Recover(
          1, positions[static_cast<size_t>(r)], positions[static_cast<size_t>(r)] + r,
          "allreduce f32[8] sum", 1, absl::UnavailableError("injected"));
    });
  }
  for (std::thread& t : threads) t.join();
  for (auto& c : coordinators) c->Stop();
  if (calls != nullptr) {
    for (const auto& st : stores) calls->push_back(st->calls());
  }
  return results;
}

TEST(FailureCoordinatorVote, OneRanksDegradeWishDegradesEveryRank) {
  std::vector<VoteResult> results = Vote({5, 5, 5}, {false, true, false});
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_TRUE(results[r].plan.ok()) << results[r].plan.status();
    EXPECT_EQ(results[r].plan->restart_seq, 5u);
    EXPECT_EQ(results[r].built_generation, 1);
    EXPECT_TRUE(results[r].built_degraded) << "rank " << r;
  }
}

TEST(FailureCoordinatorVote, NoWishNoDegradeAndTheSmallestPositionWins) {
  std::vector<VoteResult> results = Vote({7, 6}, {false, false});
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_TRUE(results[r].plan.ok()) << results[r].plan.status();
    EXPECT_EQ(results[r].plan->restart_seq, 6u);
    // A step's recovery reads the other end: the largest position and last seq issued (rank 1
    // voted 6 + 1).
    EXPECT_EQ(results[r].plan->max_position, 7u);
    EXPECT_EQ(results[r].plan->max_issued, 7u);
    EXPECT_FALSE(results[r].built_degraded) << "rank " << r;
  }
}

TEST(FailureCoordinatorVote, ARankThatNeverVotesIsNamedAndNothingIsBuilt) {
  const absl::Time start = absl::Now();
  std::vector<VoteResult> results = Vote({4, 0}, {true, false});
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(results[0].plan.ok());
  EXPECT_TRUE(absl::IsUnavailable(results[0].plan.status()));
  EXPECT_THAT(std::string(results[0].plan.status().message()), HasSubstr("rank(s) 1 did not vote"));
  EXPECT_EQ(results[0].built_generation, -1);
}

// A failure on a big job: the report names the first 32 silent ranks and counts the rest, so the
// status stays a line however many ranks there are.
TEST(FailureCoordinatorReport, ManySilentRanksAreNamedUpToACountAndCounted) {
  constexpr int kRanks = 40;
  FailureCoordinatorOptions o;
  o.rank = 0;
  o.world_size = kRanks;
  o.name = "report";
  o.report_window = absl::Milliseconds(100);
  // Nobody else listens: the other 39 ranks never acknowledge.
  FailureCoordinator coordinator(o, CreateHashStore(), nullptr);
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.seq = 7;
  const absl::Status s = coordinator.OnOpFailure(op, absl::InternalError("injected"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  const std::string message(s.message());
  EXPECT_THAT(message, HasSubstr("rank(s) 1, 2, 3,"));
  EXPECT_THAT(message, HasSubstr(", 32, and 7 more did not respond within 100ms"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr(", 33")));
  EXPECT_LT(message.size(), 600u) << message;
}

int MedianCalls(int ranks) {
  std::vector<int> calls;
  std::vector<VoteResult> results =
      Vote(std::vector<uint64_t>(static_cast<size_t>(ranks), 3),
           std::vector<bool>(static_cast<size_t>(ranks), false), &calls,
           absl::Seconds(30));  // 32 threads may start far apart (a sanitizer, a loaded host)
  for (const VoteResult& r : results) EXPECT_TRUE(r.plan.ok()) << r.plan.status();
  std::sort(calls.begin(), calls.end());
  return calls[calls.size() / 2];
}

// The votes are gathered (one rank reads them all and publishes them together) and only the first
// two voters wake the others: a typical rank's store requests do not grow with the world.
TEST(FailureCoordinatorVote, StoreRequestsPerRankDoNotGrowWithTheWorld) {
  const int small = MedianCalls(4);
  const int large = MedianCalls(32);
  // Polls of the gathered votes add a few requests where ranks vote far apart (a slow machine,
  // a sanitizer): a bound in the world size, not an equality. Reading every member's vote made it
  // about 6 N (196 at 32 ranks).
  EXPECT_LE(large, 2 * small) << "median store requests per rank: 4 ranks " << small
                              << ", 32 ranks " << large;
  EXPECT_LT(large, 32);
}

}  // namespace
}  // namespace adaptcomm::internal

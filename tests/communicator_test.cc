// Communicator creation, bad input and bounded failure: a clear error, never a crash or a hang.
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "adaptcomm/adaptcomm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::RankEnv;
using testing::RankMode;

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(CommunicatorCreate, RejectsBadWorldAndRank) {
  CommunicatorOptions o;
  o.store = CreateHashStore();
  o.world_size = 0;
  o.rank = 0;
  auto c = Communicator::Create(o);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("world size must be at least 1, got 0"));
  o.world_size = 2;
  o.rank = 2;
  c = Communicator::Create(o);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("rank 2 is out of range for world size 2"));
}

TEST(CommunicatorCreate, StoreThatDoesNotAnswerNamesHostAndPort) {
  CommunicatorOptions o;
  o.rank = 1;  // a client: rank 0 would serve the store itself
  o.world_size = 2;
  o.master_addr = "127.0.0.1";
  o.master_port = testing::PickFreePort();
  o.init_timeout = absl::Seconds(1);
  auto t0 = std::chrono::steady_clock::now();
  auto c = Communicator::Create(o);
  double elapsed = SecondsSince(t0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr(absl::StrCat("127.0.0.1:", *o.master_port)));
  EXPECT_GE(elapsed, 0.9);
  EXPECT_LT(elapsed, 3.0);
}

TEST(CommunicatorCreate, RankThatNeverJoinsFailsOthersWithinTimeout) {
  // Ranks 0 and 1 of 3 join; rank 2 never does.
  auto store = CreateHashStore();
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(2);
  std::vector<double> elapsed(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions o;
      o.rank = r;
      o.world_size = 3;
      o.store = store;
      o.init_timeout = absl::Seconds(2);
      auto t0 = std::chrono::steady_clock::now();
      results[r] = Communicator::Create(o).status();
      elapsed[r] = SecondsSince(t0);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kDeadlineExceeded) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("rank(s) 2 of 3 did not join"));
    EXPECT_LT(elapsed[r], 2.0 + 2.0);
  }
}

TEST(CommunicatorCreate, SecondCommunicatorWithSameNameOnSameStoreIsRefused) {
  testing::RunRanks(RankMode::kThreads, 2, [](const RankEnv& env) {
    auto first = Communicator::Create(env.options);
    ASSERT_TRUE(first.ok()) << first.status();
    auto second = Communicator::Create(env.options);
    ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(second.status().message()),
                HasSubstr("have the same CommunicatorOptions::name"));
    CommunicatorOptions other = env.options;
    other.name = "second";
    auto renamed = Communicator::Create(other);
    ASSERT_TRUE(renamed.ok()) << renamed.status();
    float x = 1.0f + env.rank;
    ASSERT_TRUE((*renamed)->Allreduce(HostView(&x, 1)).Wait().ok());
    EXPECT_EQ(x, 3.0f);
  });
}

TEST(CommunicatorCreate, NameCanBeReusedAfterDestruction) {
  testing::RunRanks(RankMode::kThreads, 2, [](const RankEnv& env) {
    for (int round = 0; round < 3; ++round) {
      auto comm = Communicator::Create(env.options);
      ASSERT_TRUE(comm.ok()) << "round " << round << ": " << comm.status();
      int32_t v = round + env.rank;
      ASSERT_TRUE((*comm)->Allreduce(HostView(&v, 1)).Wait().ok());
      EXPECT_EQ(v, 2 * round + 1);
    }
  });
}

void ExpectInvalid(Work w, const std::string& fragment) {
  EXPECT_EQ(w.state(), WorkState::kFailed);
  absl::Status s = w.Wait(absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));
}

TEST(CommunicatorOps, BadInputFailsAtTheCallWithAClearError) {
  testing::RunRanks(RankMode::kThreads, 2, [](const RankEnv& env) {
    auto comm = Communicator::Create(env.options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    Communicator& c = **comm;
    std::vector<float> a(8), b(8);
    TensorView null_view{nullptr, 4, DType::kF32};
    ExpectInvalid(c.Allreduce(null_view), "input is null but its count is 4");
    ExpectInvalid(c.Allgather(HostView(a.data(), 4), HostView(b.data(), 7)),
                  "must hold 8 elements");
    ExpectInvalid(c.ReduceScatter(HostView(a.data(), 8), HostView(b.data(), 3)),
                  "must hold output count x world size");
    std::vector<int32_t> ints(4);
    ExpectInvalid(c.Allreduce(HostView(ints.data(), 4), {ReduceOp::kAvg}), "avg");
    ExpectInvalid(c.Broadcast(HostView(a.data(), 8), {2}), "root 2 is out of range [0, 2)");
    ExpectInvalid(c.Send(HostView(a.data(), 8), 5), "peer 5 is out of range");
    ExpectInvalid(c.Send(HostView(a.data(), 8), env.rank), "is this rank");
    ExpectInvalid(c.Alltoall(HostView(a.data(), 7), HostView(b.data(), 7)), "not divisible");
    std::vector<double> d(8);
    ExpectInvalid(c.Allgather(HostView(a.data(), 4), HostView(d.data(), 8)), "differ in dtype");
    TensorView on_gpu{a.data(), 8, DType::kF32, Device::Cuda(0)};
    ExpectInvalid(c.Allreduce(on_gpu), "cuda:0");
    // Bad calls did not consume a sequence number or break the communicator.
    float x = 1;
    ASSERT_TRUE(c.Allreduce(HostView(&x, 1)).Wait().ok());
    EXPECT_EQ(x, 2.0f);
    EXPECT_TRUE(c.health().ok());
  });
}

TEST(CommunicatorOps, CollectiveThatOneRankSkipsTimesOutWithinBound) {
  testing::RunRanks(RankMode::kThreads, 2, [](const RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.max_retry_attempts = 1;  // a skipped collective stays skipped: retrying only waits longer
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    if (env.rank == 1) {
      // Rank 1 skips the allreduce; it leaves only after rank 0 has timed out.
      absl::SleepFor(absl::Seconds(3));
      return;
    }
    float x = 1;
    auto t0 = std::chrono::steady_clock::now();
    Work w = (*comm)->Allreduce(HostView(&x, 1), {ReduceOp::kSum, absl::Seconds(1)});
    absl::Status s = w.Wait();
    double elapsed = SecondsSince(t0);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_EQ(w.state(), WorkState::kTimedOut);
    EXPECT_GE(elapsed, 0.9);
    EXPECT_LT(elapsed, 1.0 + 2.0);
    EXPECT_FALSE((*comm)->health().ok());
    // A broken communicator fails later ops fast instead of hanging.
    auto t1 = std::chrono::steady_clock::now();
    EXPECT_FALSE((*comm)->Allreduce(HostView(&x, 1)).Wait().ok());
    EXPECT_LT(SecondsSince(t1), 1.0);
  });
}

TEST(CommunicatorOps, WaitWithShortBoundReturnsWhileOpContinues) {
  testing::RunRanks(RankMode::kThreads, 2, [](const RankEnv& env) {
    auto comm = Communicator::Create(env.options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    float x = 1;
    if (env.rank == 1) absl::SleepFor(absl::Milliseconds(600));
    Work w = (*comm)->Allreduce(HostView(&x, 1));
    if (env.rank == 0) {
      absl::Status early = w.Wait(absl::Milliseconds(100));
      EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
      EXPECT_THAT(std::string(early.message()), HasSubstr("still"));
    }
    ASSERT_TRUE(w.Wait().ok());
    EXPECT_EQ(w.state(), WorkState::kDone);
    EXPECT_EQ(x, 2.0f);
  });
}

TEST(CommunicatorOps, AsyncOpsCompleteInOrder) {
  testing::RunRanks(RankMode::kThreads, 3, [](const RankEnv& env) {
    auto comm = Communicator::Create(env.options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<std::vector<int64_t>> bufs(20, std::vector<int64_t>(1000));
    std::vector<Work> works;
    for (int k = 0; k < 20; ++k) {
      for (auto& v : bufs[k]) v = k + env.rank;
      works.push_back((*comm)->Allreduce(HostView(bufs[k].data(), bufs[k].size())));
    }
    for (int k = 19; k >= 0; --k) {
      ASSERT_TRUE(works[k].Wait().ok());
      EXPECT_EQ(works[k].seq(), static_cast<uint64_t>(k + 1));
      for (auto v : bufs[k]) ASSERT_EQ(v, 3 * k + 3);
    }
  });
}

TEST(CommunicatorOps, AbortFailsPendingWork) {
  testing::RunRanks(RankMode::kThreads, 2, [](const RankEnv& env) {
    auto comm = Communicator::Create(env.options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    if (env.rank == 1) {
      absl::SleepFor(absl::Seconds(2));
      return;
    }
    float x = 1, y = 1;
    Work first = (*comm)->Allreduce(HostView(&x, 1));
    Work second = (*comm)->Allreduce(HostView(&y, 1));
    absl::SleepFor(absl::Milliseconds(200));
    auto t0 = std::chrono::steady_clock::now();
    (*comm)->Abort(absl::AbortedError("test abort"));
    EXPECT_FALSE(first.Wait().ok());
    EXPECT_EQ(second.Wait().code(), absl::StatusCode::kAborted);
    EXPECT_LT(SecondsSince(t0), 2.0);
  });
}

}  // namespace
}  // namespace adaptcomm

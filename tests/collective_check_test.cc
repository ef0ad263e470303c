// check_collectives: ranks that call different collectives (here: the same bytes as f32 on some
// ranks and i32 on another, which would otherwise "succeed" with garbage) fail on every rank,
// before anything is sent, with an error naming each rank's call; matching calls run normally.
#include <stdlib.h>

#include <string>
#include <vector>

#include "adaptcomm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::RankEnv;
using testing::RankMode;

TEST(CheckCollectives, MismatchFailsEveryRankNamingEachCallAndNothingIsSent) {
  constexpr int kWorld = 3;
  std::vector<absl::Status> second(kWorld);
  std::vector<std::vector<float>> after(kWorld);
  testing::RunRanks(RankMode::kThreads, kWorld, [&](const RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.check_collectives = true;
    o.timeout = absl::Seconds(10);
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> a(1000, 1.0f);
    ASSERT_TRUE((*comm)->Allreduce(HostView(a.data(), a.size())).Wait().ok());
    for (float v : a) ASSERT_EQ(v, 3.0f);
    // Rank 2 reduces the same bytes as int32.
    const absl::Time t0 = absl::Now();
    second[env.rank] = env.rank == 2
                           ? (*comm)->Allreduce(TensorView{a.data(), a.size(), DType::kI32}).Wait()
                           : (*comm)->Allreduce(HostView(a.data(), a.size())).Wait();
    EXPECT_LT(absl::Now() - t0, absl::Seconds(5)) << "rank " << env.rank;
    after[env.rank] = a;
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(second[r])) << "rank " << r << ": " << second[r];
    EXPECT_THAT(std::string(second[r].message()),
                HasSubstr("mismatched collectives at #2 of communicator 'test' "
                          "(check_collectives): ranks 0,1 called allreduce f32[1000] sum; rank 2 "
                          "called allreduce i32[1000] sum; nothing was sent"))
        << second[r];
    for (float v : after[r]) ASSERT_EQ(v, 3.0f) << "rank " << r << ": a buffer was touched";
  }
}

TEST(CheckCollectives, EnvironmentTurnsItOnAndMatchingCallsRunNormally) {
  setenv("ADAPTCOMM_CHECK_COLLECTIVES", "1", 1);
  testing::RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    auto comm = Communicator::Create(env.options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> in(8, static_cast<float>(env.rank + 1)), out(16);
    for (int step = 0; step < 20; ++step) {
      ASSERT_TRUE((*comm)->Allreduce(HostView(in.data(), in.size())).Wait().ok());
      ASSERT_TRUE((*comm)
                      ->Allgather(HostView(in.data(), in.size()), HostView(out.data(), out.size()))
                      .Wait()
                      .ok());
      ASSERT_EQ(out[0], out[8]);
    }
    // A mismatch in root only is still a mismatch.
    BroadcastOptions bo;
    bo.root = env.rank;
    absl::Status s = (*comm)->Broadcast(HostView(in.data(), in.size()), bo).Wait();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("root=1"));
  });
  unsetenv("ADAPTCOMM_CHECK_COLLECTIVES");
}

}  // namespace
}  // namespace adaptcomm

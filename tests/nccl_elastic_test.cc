// Elastic membership on the NCCL path (#14 items 2 and 6), end to end through the internal factory
// with each rank's fault-injecting fake CUDA runtime and NCCL (ranks are threads; "device"
// buffers are host memory the fake reports as CUDA memory). A rank "dies": its link to the store
// goes down (it cannot vote) and it launches nothing more, so the survivors' collective hangs on
// it until their op timeout; they agree on the loss and rebuild NCCL for 3 ranks, with
// ncclCommShrink where the fake NCCL advertises it, else with ncclCommAbort and a fresh init.
// Teardown: destroying or aborting a communicator whose NCCL peer is dead or stuck returns within
// the abort bound.
#include <stdlib.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/nccl/nccl_api.h"
#include "tests/cuttable_store.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"
#include "tests/sanitizer_build.h"

namespace adaptcomm {
namespace {

using testing::CuttableStore;
using ::testing::ElementsAre;
using testing::FakeNcclApi;
using testing::FakeNcclFaults;

constexpr int kWorld = 4;
constexpr int kVictim = 2;
constexpr absl::Duration kAbortBound = absl::Seconds(3);
// What teardown may take past the abort bound: thread start-up and scheduling on a loaded machine
// (and TSan's slowdown: 7.3 s in all there).
constexpr absl::Duration kSlack = absl::Seconds(testing::kUnderSanitizer ? 6 : 2);

std::string WriteProfile() {
  char dir[] = "/tmp/adaptcomm_nccl_elastic_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  const std::string path = absl::StrCat(dir, "/profile.yaml");
  // A dead NCCL peer shows as a collective that never completes: its timeout is retryable here.
  std::ofstream(path) << "schema: 1\n"
                      << "defaults:\n"
                      << "  timeouts:\n"
                      << "    abort: " << absl::ToInt64Seconds(kAbortBound) << "s\n"
                      << "  retry:\n"
                      << "    max_attempts: 3\n"
                      << "    initial_backoff: 100ms\n"
                      << "    retryable: unavailable,aborted,deadline_exceeded\n"
                      << "  flight_recorder:\n"
                      << "    dump_dir: " << dir << "\n"
                      << "tiers:\n"
                      << "  - name: test\n"
                      << "    params: any\n";
  return path;
}

internal::CommunicatorDeps Seams(const std::shared_ptr<FakeNcclApi>& fake) {
  internal::CommunicatorDeps deps;
  deps.use_given_apis = true;
  deps.cuda = fake;
  deps.nccl = fake;
  return deps;
}

// Small integers: float sums are exact.
float Input(int initial, int step, size_t i) {
  return static_cast<float>((initial + 1) * (step + 1) + static_cast<int>(i % 13));
}

TensorView DeviceView(std::vector<float>& v) {
  return TensorView{v.data(), v.size(), DType::kF32, Device::Cuda(0)};
}

struct ShrinkRun {
  std::vector<std::shared_ptr<FakeNcclApi>> apis;
  std::vector<Membership> final_membership = std::vector<Membership>(kWorld);
  std::vector<std::string> backend = std::vector<std::string>(kWorld);
};

// Steps of one device allreduce each; the victim dies before its op of kKillStep. Every survivor's
// op of that step completes on the 3 left, and so does every later one, element by element.
ShrinkRun KillOneOfFour(bool fake_has_comm_shrink) {
  constexpr int kSteps = 6, kKillStep = 3;
  ShrinkRun run;
  auto world = testing::MakeFakeNcclWorld();
  for (int r = 0; r < kWorld; ++r) {
    FakeNcclFaults f;
    f.has_comm_shrink = fake_has_comm_shrink;
    run.apis.push_back(std::make_shared<FakeNcclApi>(world, f));
  }
  const std::string profile = WriteProfile();
  absl::Notification survivors_done;
  std::atomic<int> survivors_left{kWorld - 1};
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        auto store = std::make_shared<CuttableStore>(env.options.store);
        CommunicatorOptions o = env.options;
        o.store = store;
        if (!profile.empty()) o.profile_file = profile;
        o.backend = BackendChoice::kNccl;
        o.fallback = Fallback::kDeny;
        o.timeout = absl::Seconds(1);  // how long the survivors wait for the dead rank's part
        o.failure_report_window = absl::Seconds(2);
        o.elastic.on_loss = LossPolicy::kShrink;
        o.elastic.loss_window = absl::Seconds(1);
        o.elastic.min_world_size = 2;
        auto comm = internal::CreateCommunicatorWith(o, Seams(run.apis[env.rank]));
        ASSERT_TRUE(comm.ok()) << comm.status();
        ASSERT_STREQ((*comm)->backend_name(), "nccl");
        for (int step = 0; step < kSteps; ++step) {
          if (env.rank == kVictim && step == kKillStep) {
            // Dead: no vote, no launch. Its communicator goes only after the survivors finished.
            store->Cut();
            survivors_done.WaitForNotificationWithTimeout(absl::Seconds(60));
            const absl::Time start = absl::Now();
            comm->reset();
            EXPECT_LT(absl::Now() - start, kAbortBound + kSlack) << "the dead rank's teardown";
            return;
          }
          std::vector<float> buf(500 + 31 * static_cast<size_t>(step));
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = Input(env.rank, step, i);
          absl::Status s = (*comm)->Allreduce(DeviceView(buf)).Synchronize();
          ASSERT_TRUE(s.ok()) << "rank " << env.rank << " step " << step << ": " << s;
          const Membership m = (*comm)->membership();
          ASSERT_EQ(m.world_size, step < kKillStep ? kWorld : kWorld - 1) << "step " << step;
          for (size_t i = 0; i < buf.size(); ++i) {
            float want = 0;
            for (int initial : m.initial_ranks) want += Input(initial, step, i);
            ASSERT_EQ(buf[i], want) << "rank " << env.rank << " step " << step << " i " << i;
          }
        }
        run.final_membership[static_cast<size_t>(env.rank)] = (*comm)->membership();
        run.backend[static_cast<size_t>(env.rank)] = (*comm)->backend_name();
        if (survivors_left.fetch_sub(1) == 1) survivors_done.Notify();
        comm->reset();
      },
      absl::Seconds(90));
  return run;
}

void ExpectSurvivorsOnThree(const ShrinkRun& run) {
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    const Membership& m = run.final_membership[static_cast<size_t>(r)];
    EXPECT_EQ(run.backend[static_cast<size_t>(r)], "nccl") << "rank " << r;
    EXPECT_EQ(m.world_size, 3) << "rank " << r;
    EXPECT_EQ(m.rank, r < kVictim ? r : r - 1) << "rank " << r;
    EXPECT_THAT(m.lost_ranks, ElementsAre(kVictim)) << "rank " << r;
    EXPECT_THAT(m.initial_ranks, ElementsAre(0, 1, 3)) << "rank " << r;
  }
}

TEST(NcclElastic, DeadRankShrinksWithNcclCommShrinkWhereNcclHasIt) {
  ShrinkRun run = KillOneOfFour(/*fake_has_comm_shrink=*/true);
  ExpectSurvivorsOnThree(run);
  for (int r = 0; r < kWorld; ++r) {
    const FakeNcclApi& api = *run.apis[static_cast<size_t>(r)];
    if (r == kVictim) {
      EXPECT_EQ(api.shrink_calls(), 0);
      continue;
    }
    // One ncclCommShrink, with NCCL_SHRINK_ABORT (the parent's allreduce was stuck on the dead
    // rank); no second init. The parent communicator was aborted after the shrink.
    EXPECT_EQ(api.shrink_calls(), 1) << "rank " << r;
    EXPECT_THAT(api.last_shrink_flags(), ElementsAre(nccl::kShrinkAbort)) << "rank " << r;
    EXPECT_EQ(api.init_calls(), 1) << "rank " << r;
    EXPECT_GE(api.abort_calls(), 1) << "rank " << r;
  }
}

TEST(NcclElastic, DeadRankShrinksWithAbortAndFreshInitWithoutNcclCommShrink) {
  ShrinkRun run = KillOneOfFour(/*fake_has_comm_shrink=*/false);
  ExpectSurvivorsOnThree(run);
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    const FakeNcclApi& api = *run.apis[static_cast<size_t>(r)];
    EXPECT_EQ(api.shrink_calls(), 0) << "rank " << r;
    EXPECT_EQ(api.init_calls(), 2) << "rank " << r;  // creation, then the 3-rank communicator
    EXPECT_GE(api.abort_calls(), 1) << "rank " << r;
  }
}

// The real loader resolves ncclCommShrink where the NCCL it loads has it (2.27+), and loading an
// older NCCL does not fail for it (the symbol is optional).
TEST(NcclElastic, LoaderResolvesNcclCommShrinkWhereTheLoadedNcclHasIt) {
  absl::StatusOr<std::shared_ptr<nccl::NcclApi>> api = nccl::LoadNcclApi();
  if (!api.ok()) GTEST_SKIP() << "no NCCL here: " << api.status();
  int version = 0;
  ASSERT_EQ((*api)->GetVersion(&version), nccl::NcclResult::kSuccess);
  EXPECT_EQ((*api)->has_comm_shrink(), nccl::NormalizeNcclVersion(version) >= 22700)
      << (*api)->library_path() << " NCCL " << nccl::NcclVersionString(version);
}

// Teardown matrix on NCCL (#14 item 6): every rank but the peer is inside an allreduce that
// cannot complete (op timeout far away) because the peer is dead (no launch, store link down) or
// stuck (its launch never completes); then each of them destroys or aborts its communicator.
// kDestroy: the op fails first (its timeout; no retry can agree with a dead or stuck peer), then
// the communicator is destroyed. kDestroyInFlight: destroyed while the op is in flight: the
// executor's shutdown gives it half the abort bound, then aborts it (it used to wait out the op's
// timeout, 60 s here).
enum class Peer { kDead, kStuck };
enum class Teardown { kDestroy, kDestroyInFlight, kAbort };

void TearDownWithBadPeer(Peer peer, Teardown how) {
  constexpr int kRanks = 3, kBad = 1;
  auto world = testing::MakeFakeNcclWorld();
  std::vector<std::shared_ptr<FakeNcclApi>> apis;
  for (int r = 0; r < kRanks; ++r) {
    FakeNcclFaults f;
    if (peer == Peer::kStuck && r == kBad) f.hang_at_launch = 2;  // its second op
    apis.push_back(std::make_shared<FakeNcclApi>(world, f));
  }
  const std::string profile = WriteProfile();
  absl::Notification others_done;
  std::atomic<int> others_left{kRanks - 1};
  testing::RunRanks(
      testing::RankMode::kThreads, kRanks,
      [&](const testing::RankEnv& env) {
        auto store = std::make_shared<CuttableStore>(env.options.store);
        CommunicatorOptions o = env.options;
        o.store = store;
        if (!profile.empty()) o.profile_file = profile;
        o.backend = BackendChoice::kNccl;
        o.fallback = Fallback::kDeny;
        o.timeout = how == Teardown::kDestroy ? absl::Seconds(1) : absl::Seconds(60);
        auto comm = internal::CreateCommunicatorWith(o, Seams(apis[env.rank]));
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<float> buf(256, static_cast<float>(env.rank + 1));
        ASSERT_TRUE((*comm)->Allreduce(DeviceView(buf)).Synchronize().ok());
        for (float x : buf) ASSERT_EQ(x, 6.0f);
        if (peer == Peer::kDead && env.rank == kBad) {
          store->Cut();
          others_done.WaitForNotificationWithTimeout(absl::Seconds(60));
          comm->reset();
          return;
        }
        Work work = (*comm)->Allreduce(DeviceView(buf));
        absl::Status s;
        if (how == Teardown::kDestroy) s = work.Synchronize(absl::Seconds(30));
        absl::SleepFor(
            absl::Milliseconds(300));  // kAbort, kDestroyInFlight: the op waits on the peer
        const absl::Time start = absl::Now();
        if (how == Teardown::kDestroy) {
          comm->reset();
        } else if (how == Teardown::kAbort) {
          (*comm)->Abort(absl::CancelledError("test teardown"));
          s = work.Synchronize(kAbortBound + kSlack);
          comm->reset();
        } else {
          comm->reset();  // with the op still in flight
          s = work.Synchronize(absl::Seconds(1));
        }
        const absl::Duration took = absl::Now() - start;
        if (how == Teardown::kDestroy && s.ok()) {
          // A stuck peer's op is retried on a rebuilt communicator, where it completes.
          for (float x : buf) ASSERT_EQ(x, 18.0f) << "rank " << env.rank;
        } else {
          EXPECT_FALSE(s.ok()) << "rank " << env.rank << ": the op cannot have completed";
        }
        EXPECT_LT(took, kAbortBound + kSlack) << "rank " << env.rank;
        std::fprintf(stderr, "rank %d: teardown took %s (%s)\n", env.rank,
                     absl::FormatDuration(took).c_str(), s.ToString().c_str());
        if (others_left.fetch_sub(1) == 1) others_done.Notify();
      },
      absl::Seconds(60));
}

TEST(NcclTeardown, DestroyWithDeadPeerEndsWithinAbortBound) {
  TearDownWithBadPeer(Peer::kDead, Teardown::kDestroy);
}
TEST(NcclTeardown, AbortWithDeadPeerEndsWithinAbortBound) {
  TearDownWithBadPeer(Peer::kDead, Teardown::kAbort);
}
TEST(NcclTeardown, DestroyWithStuckPeerEndsWithinAbortBound) {
  TearDownWithBadPeer(Peer::kStuck, Teardown::kDestroy);
}
TEST(NcclTeardown, DestroyDuringOpWithDeadPeerEndsWithinAbortBound) {
  TearDownWithBadPeer(Peer::kDead, Teardown::kDestroyInFlight);
}
TEST(NcclTeardown, DestroyDuringOpWithStuckPeerEndsWithinAbortBound) {
  TearDownWithBadPeer(Peer::kStuck, Teardown::kDestroyInFlight);
}
TEST(NcclTeardown, AbortWithStuckPeerEndsWithinAbortBound) {
  TearDownWithBadPeer(Peer::kStuck, Teardown::kAbort);
}

}  // namespace
}  // namespace adaptcomm

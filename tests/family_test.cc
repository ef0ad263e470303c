// Failure semantics of a Split family: a member that breaks fails the parent and every sibling on
// every rank within the failure-report window (never their op timeout), a coordinated retry that
// recovers breaks nothing, an elastic membership change fails the whole family, and the members
// may be destroyed in any order.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/grid.h"
#include "adaptcomm/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::RankEnv;
using testing::RankMode;

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

std::string FreshDir(const std::string& name) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/", name, "_", getpid());
  std::string cmd = absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

double SecondsSince(const std::string& file) {
  int64_t t = 0;
  std::ifstream(file) >> t;
  return static_cast<double>(NowMicros() - t) / 1e6;
}

// Polls until `comm` is broken, at most `bound`; returns how long it took (bound if never).
absl::Duration UntilBroken(const Communicator& comm, absl::Duration bound) {
  const absl::Time start = absl::Now();
  while (comm.health().ok() && absl::Now() - start < bound) absl::SleepFor(absl::Milliseconds(5));
  return absl::Now() - start;
}

// A new op on a broken member fails at once, with the family's status.
void ExpectNextOpFailsNaming(Communicator& comm, const std::string& what, int rank) {
  float x = 1;
  const absl::Time start = absl::Now();
  absl::Status s = comm.Allreduce(HostView(&x, 1)).Wait(absl::Seconds(5));
  EXPECT_FALSE(s.ok()) << "rank " << rank;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "rank " << rank << ": " << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(what)) << "rank " << rank;
}

// Rank 3's process is killed: rank 2 sees its own child fail (its peer is gone), and ranks 0 and
// 1, whose child has no dead member, see theirs fail too, naming the child that broke on rank 2,
// within the report window and far from the 30 s op timeout. The parent fails on every survivor.
TEST(Family, KilledRankFailsParentAndSiblingOnEverySurvivorPromptly) {
  const std::string dir = FreshDir("family_kill");
  constexpr absl::Duration kTimeout = absl::Seconds(30);
  constexpr absl::Duration kWindow = absl::Seconds(2);
  std::vector<int> status = testing::RunRankProcesses(
      4,
      [&](const RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.name = "fam";
        o.timeout = kTimeout;
        o.failure_report_window = kWindow;
        o.max_retry_attempts = 1;
        auto parent = Communicator::Create(o);
        ASSERT_TRUE(parent.ok()) << parent.status();
        SplitOptions so;
        so.backend = BackendChoice::kGloo;  // a dead peer breaks its TCP links at once
        so.name = env.rank < 2 ? "fam/A" : "fam/B";
        auto child = (*parent)->Split(env.rank / 2, env.rank, so);
        ASSERT_TRUE(child.ok()) << child.status();
        float x = 1;
        ASSERT_TRUE((*parent)->Allreduce(HostView(&x, 1)).Wait(absl::Seconds(20)).ok());
        ASSERT_TRUE((*child)->Allreduce(HostView(&x, 1)).Wait(absl::Seconds(20)).ok());
        if (env.rank == 3) {
          std::ofstream(dir + "/killed_at") << NowMicros();
          raise(SIGKILL);
        }
        absl::Status s;
        for (int i = 0; i < 100000 && s.ok(); ++i) {
          x = 1;
          s = (*child)->Allreduce(HostView(&x, 1)).Wait(kTimeout + absl::Seconds(10));
          if (s.ok()) absl::SleepFor(absl::Milliseconds(2));
        }
        const double seconds = SecondsSince(dir + "/killed_at");
        std::printf("rank %d: its child failed %.2f s after the kill: %s\n", env.rank, seconds,
                    std::string(s.message()).c_str());
        std::fflush(stdout);
        EXPECT_FALSE(s.ok());
        EXPECT_LT(seconds, absl::ToDoubleSeconds(kWindow) + 3) << "rank " << env.rank;
        if (env.rank < 2) {
          EXPECT_THAT(std::string(s.message()), HasSubstr("'fam/B' (child of 'fam') broke"));
        }
        ExpectNextOpFailsNaming(**parent, "fam/B", env.rank);
        std::ofstream(absl::StrCat(dir, "/done.", env.rank)) << seconds;
      },
      absl::Seconds(90));
  ASSERT_EQ(status.size(), 4u);
  EXPECT_TRUE(WIFSIGNALED(status[3]) && WTERMSIG(status[3]) == SIGKILL);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
  }
}

// Rank 3 aborts its child: the parent and both children fail on every other rank (threads), with
// a status naming the aborted child, within the report window.
TEST(Family, AbortedChildFailsParentAndSiblingsOnEveryRank) {
  std::atomic<int> warm{0};
  testing::RunRanks(
      RankMode::kThreads, 4,
      [&](const RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.name = "fam";
        o.timeout = absl::Seconds(30);
        o.failure_report_window = absl::Seconds(2);
        auto parent = Communicator::Create(o);
        ASSERT_TRUE(parent.ok()) << parent.status();
        SplitOptions so;
        so.name = env.rank < 2 ? "fam/A" : "fam/B";
        auto child = (*parent)->Split(env.rank / 2, env.rank, so);
        ASSERT_TRUE(child.ok()) << child.status();
        float x = 1;
        ASSERT_TRUE((*child)->Allreduce(HostView(&x, 1)).Wait(absl::Seconds(20)).ok());
        warm.fetch_add(1);
        while (warm.load() < 4) absl::SleepFor(absl::Milliseconds(1));
        if (env.rank == 3) {
          (*child)->Abort(absl::CancelledError("trainer gave up on its pipeline stage"));
        }
        const absl::Duration parent_took = UntilBroken(**parent, absl::Seconds(10));
        const absl::Duration child_took = UntilBroken(**child, absl::Seconds(10));
        std::printf("rank %d: parent broken after %s, child after %s\n", env.rank,
                    absl::FormatDuration(parent_took).c_str(),
                    absl::FormatDuration(child_took).c_str());
        EXPECT_LT(parent_took, absl::Seconds(4)) << "rank " << env.rank;
        EXPECT_LT(child_took, absl::Seconds(4)) << "rank " << env.rank;
        ExpectNextOpFailsNaming(**parent, "'fam/B' (child of 'fam') broke", env.rank);
        if (env.rank != 3) ExpectNextOpFailsNaming(**child, "'fam/B' (child of 'fam') broke", 0);
        warm.fetch_add(1);  // nobody tears down before every rank has looked
        while (warm.load() < 8) absl::SleepFor(absl::Milliseconds(1));
      },
      absl::Seconds(90));
}

// A child's op times out because its peer issues it late, the ranks vote and the retry recovers:
// that is no break, and the parent and the sibling go on.
TEST(Family, ChildRecoveredByCoordinatedRetryBreaksNothing) {
  testing::RunRanks(
      RankMode::kThreads, 4,
      [&](const RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.name = "fam";
        o.timeout = absl::Seconds(1);
        o.failure_report_window = absl::Seconds(3);
        o.max_retry_attempts = 3;
        o.replay = ReplayMode::kCopy;
        auto parent = Communicator::Create(o);
        ASSERT_TRUE(parent.ok()) << parent.status();
        auto child = (*parent)->Split(env.rank / 2, env.rank);
        ASSERT_TRUE(child.ok()) << child.status();
        // Rank 1 comes 1.5 s late to its child's op: rank 0's times out and starts a retry.
        if (env.rank == 1) absl::SleepFor(absl::Milliseconds(1500));
        float x = static_cast<float>(env.rank);
        absl::Status s = (*child)->Allreduce(HostView(&x, 1)).Wait(absl::Seconds(20));
        ASSERT_TRUE(s.ok()) << "rank " << env.rank << ": " << s;
        EXPECT_EQ(x, env.rank < 2 ? 1.0f : 5.0f);
        if (env.rank < 2) {
          EXPECT_GE((*child)->membership().generation, 1) << "no retry happened";
        }
        float y = 1;
        ASSERT_TRUE((*parent)->Allreduce(HostView(&y, 1)).Wait(absl::Seconds(20)).ok());
        EXPECT_EQ(y, 4.0f);
        float z = 1;
        ASSERT_TRUE((*child)->Allreduce(HostView(&z, 1)).Wait(absl::Seconds(20)).ok());
        EXPECT_EQ(z, 2.0f);
        EXPECT_TRUE((*parent)->health().ok()) << (*parent)->health();
        EXPECT_TRUE((*child)->health().ok()) << (*child)->health();
        // Every rank's last op is done before anyone tears down.
        ASSERT_TRUE((*parent)->Barrier().Wait(absl::Seconds(20)).ok());
      },
      absl::Seconds(90));
}

// Destruction is not a break: children destroyed before the parent, or after it (the store is not
// the parent's), leave the others working; a member destroyed early is skipped when the family
// breaks later; and an abort arriving while another thread issues ops ends that thread's loop.
TEST(Family, MembersDestroyedInAnyOrderAndAbortWhileIssuing) {
  std::atomic<int> phase{0};
  testing::RunRanks(
      RankMode::kThreads, 4,
      [&](const RankEnv& env) {
        auto sync = [&](int n) {
          phase.fetch_add(1);
          while (phase.load() < 4 * n) absl::SleepFor(absl::Milliseconds(1));
        };
        CommunicatorOptions o = env.options;
        o.name = "fam";
        o.failure_report_window = absl::Seconds(2);
        auto parent = Communicator::Create(o);
        ASSERT_TRUE(parent.ok()) << parent.status();
        auto a = (*parent)->Split(env.rank / 2, env.rank);
        auto b = (*parent)->Split(env.rank % 2, env.rank);
        ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
        // The parent goes first: its children keep working.
        parent->reset();
        float x = 1;
        ASSERT_TRUE((*a)->Allreduce(HostView(&x, 1)).Wait(absl::Seconds(20)).ok());
        EXPECT_EQ(x, 2.0f);
        EXPECT_TRUE((*b)->health().ok());
        sync(1);
        // A child destroyed before its sibling breaks: the sibling's break reaches only the living.
        b->reset();
        sync(2);
        a->reset();
        sync(3);

        // Again with a thread issuing ops on a child while the parent is aborted.
        CommunicatorOptions o2 = o;
        o2.name = "fam2";
        auto parent2 = Communicator::Create(o2);
        ASSERT_TRUE(parent2.ok()) << parent2.status();
        auto c = (*parent2)->Split(env.rank / 2, env.rank);
        auto d = (*parent2)->Split(env.rank % 2, env.rank);
        ASSERT_TRUE(c.ok() && d.ok()) << c.status() << " " << d.status();
        d->reset();  // gone before the break
        std::atomic<bool> issuing_failed{false};
        std::thread issuer([&] {
          for (int i = 0; i < 1000000; ++i) {
            float y = 1;
            if (!(*c)->Allreduce(HostView(&y, 1)).Wait(absl::Seconds(20)).ok()) {
              issuing_failed.store(true);
              return;
            }
          }
        });
        absl::SleepFor(absl::Milliseconds(100));
        if (env.rank == 0) (*parent2)->Abort(absl::CancelledError("test aborts the parent"));
        EXPECT_LT(UntilBroken(**c, absl::Seconds(10)), absl::Seconds(4)) << "rank " << env.rank;
        issuer.join();
        EXPECT_TRUE(issuing_failed.load());
        // Its own failed op may have broken it first (its peer's aborted): any status, but fast.
        ExpectNextOpFailsNaming(**c, "", env.rank);
        sync(4);
        // The children go after the parent here, the other way round on odd ranks.
        if (env.rank % 2 == 0) {
          parent2->reset();
          c->reset();
        } else {
          c->reset();
          parent2->reset();
        }
      },
      absl::Seconds(90));
}

// A child split from a parent whose family already broke is aborted as it is created, naming the
// break, rather than handed out as a healthy communicator of a dead family.
TEST(Family, ChildSplitFromABrokenFamilyIsBornAborted) {
  testing::RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.name = "fam";
    auto parent = Communicator::Create(o);
    ASSERT_TRUE(parent.ok()) << parent.status();
    (*parent)->Abort(absl::CancelledError("trainer stopped"));
    auto child = (*parent)->Split(0, env.rank);
    ASSERT_TRUE(child.ok()) << child.status();
    EXPECT_THAT(std::string((*child)->health().message()),
                HasSubstr("communicator 'fam' broke: trainer stopped"));
    ExpectNextOpFailsNaming(**child, "trainer stopped", env.rank);
  });
}

// The grid: rank 5 aborts its world communicator; every other rank's tensor, pipeline and data
// groups fail within the report window.
TEST(Family, GridGroupsAllFailWhenOneRankAborts) {
  std::atomic<int> phase{0};
  testing::RunRanks(
      RankMode::kThreads, 8,
      [&](const RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.name = "grid";
        o.failure_report_window = absl::Seconds(2);
        auto world = Communicator::Create(o);
        ASSERT_TRUE(world.ok()) << world.status();
        GridOptions g;
        g.tensor = 2;
        g.pipeline = 2;
        absl::StatusOr<Grid> grid = CreateGrid(**world, g);
        ASSERT_TRUE(grid.ok()) << grid.status();
        phase.fetch_add(1);
        while (phase.load() < 8) absl::SleepFor(absl::Milliseconds(1));
        if (env.rank == 5) (*world)->Abort(absl::AbortedError("rank 5 dies"));
        absl::Duration worst;
        for (Communicator* c : {grid->tensor.get(), grid->pipeline.get(), grid->data.get()}) {
          worst = std::max(worst, UntilBroken(*c, absl::Seconds(10)));
        }
        std::printf("rank %d: tensor, pipeline and data groups all broken within %s\n", env.rank,
                    absl::FormatDuration(worst).c_str());
        EXPECT_LT(worst, absl::Seconds(4)) << "rank " << env.rank;
        ExpectNextOpFailsNaming(*grid->data, "rank 5 dies", env.rank);
        phase.fetch_add(1);
        while (phase.load() < 16) absl::SleepFor(absl::Milliseconds(1));
      },
      absl::Seconds(120));
}

// Elastic shrink of a parent that has children: rank 3's process is killed, the parent shrinks on
// the survivors, and the whole family fails with FailedPrecondition naming the change, parent
// included (its groups no longer describe the job).
TEST(Family, ShrinkOfAParentWithChildrenFailsTheFamily) {
  const std::string dir = FreshDir("family_shrink");
  std::vector<int> status = testing::RunRankProcesses(
      4,
      [&](const RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.name = "fam";
        o.timeout = absl::Seconds(10);
        o.failure_report_window = absl::Seconds(2);
        o.elastic.on_loss = LossPolicy::kShrink;
        o.elastic.loss_window = absl::Seconds(1);
        auto parent = Communicator::Create(o);
        ASSERT_TRUE(parent.ok()) << parent.status();
        SplitOptions so;
        so.backend = BackendChoice::kGloo;
        auto child = (*parent)->Split(env.rank / 2, env.rank, so);
        ASSERT_TRUE(child.ok()) << child.status();
        float x = 1;
        ASSERT_TRUE((*parent)->Allreduce(HostView(&x, 1)).Wait(absl::Seconds(20)).ok());
        if (env.rank == 3) {
          std::ofstream(dir + "/killed_at") << NowMicros();
          raise(SIGKILL);
        }
        absl::Status s;
        for (int i = 0; i < 100000 && s.ok(); ++i) {
          x = 1;
          s = (*parent)->Allreduce(HostView(&x, 1)).Wait(absl::Seconds(40));
          if (s.ok()) absl::SleepFor(absl::Milliseconds(2));
        }
        const double seconds = SecondsSince(dir + "/killed_at");
        std::printf("rank %d: parent failed %.2f s after the kill: %s\n", env.rank, seconds,
                    s.ToString().c_str());
        std::fflush(stdout);
        EXPECT_TRUE(absl::IsAborted(s)) << s;  // the interrupted op; health() says more
        EXPECT_FALSE(IsMembershipChanged(s)) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr("changed membership (rank(s) 3 of 4 lost"));
        EXPECT_THAT(std::string(s.message()), HasSubstr("rebuild the groups with Split"));
        EXPECT_LT(UntilBroken(**child, absl::Seconds(5)), absl::Seconds(1)) << "rank " << env.rank;
        EXPECT_THAT(std::string((*child)->health().message()), HasSubstr("changed membership"));
        EXPECT_TRUE(absl::IsFailedPrecondition((*parent)->health())) << (*parent)->health();
        EXPECT_LT(seconds, 15.0) << "rank " << env.rank;
      },
      absl::Seconds(90));
  ASSERT_EQ(status.size(), 4u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
  }
}

}  // namespace
}  // namespace adaptcomm

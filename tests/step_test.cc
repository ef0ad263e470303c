// Step-level recovery (Communicator::BeginStep / CommitStep): a failure anywhere in a step makes
// every rank's CommitStep ask for a redo, the communicator keeps working, and the redone step's
// results are exact; steps take no replay record; misuse is named.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::RankEnv;
using testing::RankMode;

float Input(int rank, int step, size_t i) {
  return static_cast<float>((rank + 1) * 1000 + step * 10) + static_cast<float>(i % 7) * 0.25f;
}

TEST(Steps, FailureInAStepIsRedoneOnEveryRankWithExactResults) {
  constexpr int kWorld = 2, kSteps = 4, kOps = 3, kFaultStep = 1;
  constexpr size_t kCount = 4096;
  std::atomic<int> redo_commits{0};
  testing::RunRanks(RankMode::kThreads, kWorld, [&](const RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.timeout = absl::Seconds(1);
    o.failure_report_window = absl::Seconds(2);
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ((*comm)->config().retry.replay, ReplayMode::kAuto);
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(kCount));
    for (int step = 0; step < kSteps; ++step) {
      for (int attempt = 0;; ++attempt) {
        ASSERT_LT(attempt, 3) << "rank " << env.rank << " step " << step;
        ASSERT_TRUE((*comm)->BeginStep().ok());
        std::vector<Work> works;
        for (int k = 0; k < kOps; ++k) {
          // Rank 1 stalls past the op timeout in the middle of the fault step's first attempt,
          // after rank 0 issued every op of it (so the ranks gave different numbers of ops a
          // sequence number before they learnt of the failure).
          if (env.rank == 1 && step == kFaultStep && attempt == 0 && k == 1) {
            absl::SleepFor(absl::Milliseconds(2500));
          }
          for (size_t i = 0; i < kCount; ++i) bufs[k][i] = Input(env.rank, step * kOps + k, i);
          works.push_back((*comm)->Allreduce(HostView(bufs[k].data(), kCount)));
        }
        int redo_ops = 0;
        for (Work& w : works) {
          absl::Status s = w.Wait();
          if (!s.ok()) {
            EXPECT_TRUE(IsStepRedo(s)) << "rank " << env.rank << ": " << s;
            ++redo_ops;
          }
        }
        absl::Status commit = (*comm)->CommitStep();
        if (step == kFaultStep && attempt == 0) {
          ASSERT_TRUE(IsStepRedo(commit)) << "rank " << env.rank << ": " << commit;
          EXPECT_THAT(std::string(commit.message()), HasSubstr("redo the step"));
          EXPECT_GT(redo_ops, 0) << "rank " << env.rank;
          redo_commits.fetch_add(1);
          continue;
        }
        ASSERT_TRUE(commit.ok()) << "rank " << env.rank << " step " << step << ": " << commit;
        EXPECT_EQ(redo_ops, 0);
        break;
      }
      for (int k = 0; k < kOps; ++k) {
        for (size_t i = 0; i < kCount; ++i) {
          float want = 0;
          for (int r = 0; r < kWorld; ++r) want += Input(r, step * kOps + k, i);
          ASSERT_EQ(bufs[k][i], want) << "rank " << env.rank << " step " << step << " op " << k;
        }
      }
    }
    EXPECT_TRUE((*comm)->health().ok()) << (*comm)->health();
    EXPECT_GE((*comm)->membership().generation, 1);
    // Sequence numbers realigned: an op after the steps still matches across the ranks.
    float x = 1;
    ASSERT_TRUE((*comm)->Allreduce(HostView(&x, 1)).Wait().ok());
    EXPECT_EQ(x, kWorld);
  });
  EXPECT_EQ(redo_commits.load(), kWorld);
}

// Explain() says which ops are protected and how; what it prints is what runs.
TEST(Steps, ExplainStatesTheProtectionInEffect) {
  testing::RunRanks(RankMode::kThreads, 2, [](const RankEnv& env) {
    CommunicatorOptions o = env.options;
    const bool copy = env.rank == 0;  // each rank its own communicator's view (names differ)
    o.name = copy ? "copy" : "auto";
    o.world_size = 1;
    o.rank = 0;
    if (copy) o.replay = ReplayMode::kCopy;
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    const std::string text = (*comm)->Explain();
    EXPECT_EQ((*comm)->config().retry.replay, copy ? ReplayMode::kCopy : ReplayMode::kAuto);
    EXPECT_THAT(text, HasSubstr(copy ? "retry.replay                        copy"
                                     : "retry.replay                        auto"));
    EXPECT_THAT(text, HasSubstr("protection: steps (BeginStep/CommitStep)"));
    EXPECT_THAT(
        text, HasSubstr(copy ? "every op's input is copied first" : "other ops are not protected"));
    // An in-place op outside a step: counted as unprotected without copies, not with them.
    float x = 1;
    ASSERT_TRUE((*comm)->Allreduce(HostView(&x, 1)).Wait().ok());
    EXPECT_THAT((*comm)->Explain(), HasSubstr(copy ? "; 0 op(s) outside a step ran unprotected"
                                                   : "; 1 op(s) outside a step ran unprotected"));
  });
}

TEST(Steps, UnknownReplayModeIsRefusedWithFileAndLine) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/replay_mode_", getpid(), ".yaml");
  std::ofstream(path) << "schema: 1\n"
                      << "defaults:\n"
                      << "  retry:\n"
                      << "    replay: always\n"
                      << "tiers:\n"
                      << "  - name: test\n"
                      << "    params: any\n";
  CommunicatorOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.store = CreateHashStore();
  if (!path.empty()) o.profile_file = path;
  auto comm = Communicator::Create(o);
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(comm.status())) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr(absl::StrCat(path, ":4:13: retry.replay: must be one of auto, copy")));
}

TEST(Steps, MisuseIsNamedOnTheCallingRank) {
  testing::RunRanks(RankMode::kThreads, 2, [](const RankEnv& env) {
    auto comm = Communicator::Create(env.options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    absl::Status commit = (*comm)->CommitStep();
    EXPECT_TRUE(absl::IsFailedPrecondition(commit)) << commit;
    EXPECT_THAT(std::string(commit.message()), HasSubstr("CommitStep without BeginStep"));
    ASSERT_TRUE((*comm)->BeginStep().ok());
    absl::Status nested = (*comm)->BeginStep();
    EXPECT_TRUE(absl::IsFailedPrecondition(nested)) << nested;
    EXPECT_THAT(std::string(nested.message()), HasSubstr("steps do not nest"));
    // The open step is unharmed by the refused call.
    float x = static_cast<float>(env.rank + 1);
    ASSERT_TRUE((*comm)->Allreduce(HostView(&x, 1)).Wait().ok());
    EXPECT_EQ(x, 3.0f);
    EXPECT_TRUE((*comm)->CommitStep().ok());
    EXPECT_TRUE(absl::IsFailedPrecondition((*comm)->CommitStep()));
  });
}

// The commit compares the number of ops each rank issued in the step. Ranks whose steps differ
// (an op issued inside the step on one rank, after its commit on the other) get the same named
// error, or the error of the op that paired with the other's commit, on every rank within the op
// timeout plus a recovery; never a hang or a silent success.
void ExpectAnOpAfterTheCommitOnOneRankIsNamed(BackendChoice backend) {
  testing::RunRanks(
      RankMode::kThreads, 2,
      [backend](const RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.backend = backend;
        o.timeout = absl::Seconds(1);
        o.failure_report_window = absl::Seconds(2);
        auto comm = Communicator::Create(o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        const absl::Time start = absl::Now();
        std::vector<float> x(3, static_cast<float>(env.rank + 1));
        ASSERT_TRUE((*comm)->BeginStep().ok());
        ASSERT_TRUE((*comm)->Allreduce(HostView(x.data(), x.size())).Wait().ok());
        absl::Status late = absl::OkStatus();
        if (env.rank == 0) {
          late = (*comm)->Allreduce(HostView(x.data(), x.size())).Wait();
        }
        absl::Status commit = (*comm)->CommitStep();
        if (env.rank == 1) late = (*comm)->Allreduce(HostView(x.data(), x.size())).Wait();
        EXPECT_FALSE(commit.ok() && late.ok()) << "rank " << env.rank << " saw no error";
        if (absl::IsFailedPrecondition(commit)) {
          // Rank 0's late allreduce ran against rank 1's commit.
          EXPECT_THAT(std::string(commit.message()),
                      HasSubstr("rank(s) 0 ran another op against this rank's commit"));
        }
        EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "rank " << env.rank;
      },
      absl::Seconds(60));
}

TEST(Steps, AnOpAfterTheCommitOnOneRankIsNamedOnGloo) {
  ExpectAnOpAfterTheCommitOnOneRankIsNamed(BackendChoice::kGloo);
}
TEST(Steps, AnOpAfterTheCommitOnOneRankIsNamedOnShm) {
  ExpectAnOpAfterTheCommitOnOneRankIsNamed(BackendChoice::kShm);
}

// When every rank's commit pairs up but their steps held different numbers of ops (a rank that
// issued an op of no elements, which moves no data, where the other issued none), every rank gets
// the same named error and the communicator is broken rather than left with sequences that no
// longer line up.
TEST(Steps, DifferentOpCountsInAStepAreNamedOnEveryRank) {
  testing::RunRanks(RankMode::kThreads, 2, [](const RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.backend = BackendChoice::kShm;  // pairs ops by order (Gloo's tags would time out instead)
    o.timeout = absl::Seconds(5);
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    float x = 1;
    ASSERT_TRUE((*comm)->BeginStep().ok());
    ASSERT_TRUE((*comm)->Allreduce(HostView(&x, 1)).Wait().ok());
    // A zero-element op is refused before it runs: it takes a number on rank 0 only.
    if (env.rank == 0) (void)(*comm)->Allreduce(HostView(&x, 0)).Wait();
    absl::Status commit = (*comm)->CommitStep();
    EXPECT_TRUE(absl::IsFailedPrecondition(commit)) << "rank " << env.rank << ": " << commit;
    EXPECT_THAT(std::string(commit.message()),
                HasSubstr("issued different numbers of ops in it (rank 0: 2, rank 1: 1)"));
    EXPECT_FALSE((*comm)->health().ok());
  });
}

// A step begun on one rank only: that rank's commit barrier has no partner. Both ranks get a
// named error within the op timeout plus the recovery, never a hang or a silent success.
TEST(Steps, StepBegunOnOneRankOnlyFailsOnBothWithinBound) {
  testing::RunRanks(
      RankMode::kThreads, 2,
      [](const RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.timeout = absl::Seconds(1);
        o.failure_report_window = absl::Seconds(2);
        auto comm = Communicator::Create(o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        const absl::Time start = absl::Now();
        float x = 1;
        if (env.rank == 0) {
          ASSERT_TRUE((*comm)->BeginStep().ok());
          EXPECT_TRUE((*comm)->Allreduce(HostView(&x, 1)).Wait().ok());
          absl::Status commit = (*comm)->CommitStep();
          EXPECT_FALSE(commit.ok());
          EXPECT_TRUE(IsStepRedo(commit) || absl::IsFailedPrecondition(commit) ||
                      absl::IsUnavailable(commit))
              << commit;
        } else {
          EXPECT_TRUE((*comm)->Allreduce(HostView(&x, 1)).Wait().ok());
          // Rank 1 never commits: rank 0's recovery reaches it idle, and finds it past an op that
          // it cannot re-run.
          absl::SleepFor(absl::Seconds(5));
          absl::Status health = (*comm)->health();
          EXPECT_FALSE(health.ok());
          EXPECT_THAT(std::string(health.message()), HasSubstr("cannot re-run")) << health;
        }
        EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "rank " << env.rank;
      },
      absl::Seconds(60));
}

// A rank stopped in a step past the vote's bound: the retry cannot agree, and the other rank's
// CommitStep says so (the recovery's verdict, naming the rank that did not vote), not the op's
// own timeout.
TEST(Steps, AFailedRecoveryIsWhatCommitStepReports) {
  std::vector<int> status = testing::RunRankProcesses(
      2,
      [](const RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.timeout = absl::Seconds(1);
        o.failure_report_window = absl::Seconds(1);  // the vote waits 2 s
        auto comm = Communicator::Create(o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        ASSERT_TRUE((*comm)->BeginStep().ok());
        if (env.rank == 1) {
          const pid_t self = getpid();
          if (fork() == 0) {
            usleep(5000 * 1000);
            kill(self, SIGCONT);
            _exit(0);
          }
          raise(SIGSTOP);
          return;  // stopped past the vote: the other rank's verdict is what is checked
        }
        float x = 1;
        (void)(*comm)->Allreduce(HostView(&x, 1)).Wait();
        absl::Status commit = (*comm)->CommitStep();
        EXPECT_TRUE(absl::IsUnavailable(commit)) << commit;
        EXPECT_FALSE(IsStepRedo(commit)) << commit;
        EXPECT_THAT(std::string(commit.message()), HasSubstr("rank(s) 1 did not vote")) << commit;
        EXPECT_THAT(std::string(commit.message()), HasSubstr("first error here")) << commit;
      },
      absl::Seconds(60));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
  }
}

}  // namespace
}  // namespace adaptcomm

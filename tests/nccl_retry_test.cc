// Coordinated retry and degrade on the NCCL path, end to end through Communicator::Create's
// internal factory (internal::CreateCommunicatorWith) with each rank's fault-injecting fake CUDA
// runtime and NCCL injected (ranks are threads; "device" buffers are host memory the fake reports
// as CUDA memory). A rank's NCCL communicator fails asynchronously mid-stream; every rank agrees on
// the retry, rebuilds (on Gloo with staging after K failures, or on NCCL again when the policy
// forbids degrading), restores the failed op's device input from the replay log, and the stream of
// allreduces ends with every result exact.
#include <stdlib.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator/communicator_factory.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;

using testing::FakeNcclApi;
using testing::FakeNcclFaults;

constexpr int kWorld = 2;
constexpr int kOps = 10;
constexpr int kFailingRank = 1;
// The failing rank's communicator breaks at its 6th launch. A rebuilt NCCL communicator counts
// launches afresh and runs only the 5 remaining ops: the fault does not recur.
constexpr int kFaultAtLaunch = 6;

// `retry_timeouts`: an op past its timeout is retried too (a device that never finishes it).
// `record_bytes`: retry.record_bytes, if not empty.
std::string WriteProfile(const std::string& fallback, bool retry_timeouts = false,
                         const std::string& record_bytes = "") {
  char dir[] = "/tmp/adaptcomm_nccl_retry_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  const std::string path = absl::StrCat(dir, "/profile.yaml");
  std::ofstream(path)
      << "schema: 1\n"
      << "defaults:\n"
      << "  retry:\n"
      << "    max_attempts: 3\n"
      << "    replay: copy\n"
      << "    initial_backoff: 100ms\n"
      << "    max_backoff: 1s\n"
      << (retry_timeouts ? "    retryable: unavailable,aborted,deadline_exceeded\n" : "")
      << (record_bytes.empty() ? "" : absl::StrCat("    record_bytes: ", record_bytes, "\n"))
      << "  backend:\n"
      << "    fallback: " << fallback << "\n"
      << "    degrade_after_failures: 1\n"
      << "    degrade_window: 10min\n"
      << "  flight_recorder:\n"
      << "    dump_dir: " << dir << "\n"
      << "tiers:\n"
      << "  - name: test\n"
      << "    params: any\n";
  return path;
}

float Input(int rank, int op, size_t i) {
  return static_cast<float>((rank + 1) * 1000 + op * 10 + static_cast<int>(i % 7));
}

// This rank's fake as its CUDA runtime and its NCCL, for creation and every rebuild.
internal::CommunicatorDeps Seams(const std::shared_ptr<FakeNcclApi>& fake) {
  internal::CommunicatorDeps deps;
  deps.use_given_apis = true;
  deps.cuda = fake;
  deps.nccl = fake;
  return deps;
}

// One fake per rank of one fake world; rank kFailingRank's injects `failing`.
std::vector<std::shared_ptr<FakeNcclApi>> FakesWithFailingRank(const FakeNcclFaults& failing) {
  auto world = testing::MakeFakeNcclWorld();
  std::vector<std::shared_ptr<FakeNcclApi>> fakes;
  for (int r = 0; r < kWorld; ++r) {
    fakes.push_back(
        std::make_shared<FakeNcclApi>(world, r == kFailingRank ? failing : FakeNcclFaults{}));
  }
  return fakes;
}

CommunicatorOptions RankOptions(const testing::RankEnv& env, const std::string& profile,
                                BackendChoice backend) {
  CommunicatorOptions o = env.options;
  if (!profile.empty()) o.profile_file = profile;
  o.backend = backend;
  return o;
}

// Runs `body(env, comm)` on every rank, each with its communicator on its fake (a 1 s op timeout,
// timeouts retried, no degrading), where rank kFailingRank's fake has `faults`. Returns the fakes,
// for their counts. `record_bytes`: the profile's retry.record_bytes (empty: its default).
template <typename Body>
std::vector<std::shared_ptr<FakeNcclApi>> RunWithFaultyDevice(
    const FakeNcclFaults& faults, Body body, const std::string& record_bytes = "") {
  const std::vector<std::shared_ptr<FakeNcclApi>> fakes = FakesWithFailingRank(faults);
  const std::string profile = WriteProfile("deny", /*retry_timeouts=*/true, record_bytes);
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = RankOptions(env, profile, BackendChoice::kNccl);
        o.timeout = absl::Seconds(1);
        o.failure_report_window = absl::Seconds(2);
        auto comm = internal::CreateCommunicatorWith(o, Seams(fakes[env.rank]));
        ASSERT_TRUE(comm.ok()) << comm.status();
        body(env, **comm);
      },
      absl::Seconds(90));
  return fakes;
}

// RunWithFaultyDevice where rank kFailingRank's device never finishes its `hang_at_launch`-th
// launch (counted per NCCL communicator).
template <typename Body>
std::vector<std::shared_ptr<FakeNcclApi>> RunWithHangingDevice(
    int hang_at_launch, Body body, const std::string& record_bytes = "") {
  return RunWithFaultyDevice(FakeNcclFaults{.hang_at_launch = hang_at_launch}, std::move(body),
                             record_bytes);
}

struct StreamRun {
  std::vector<std::shared_ptr<FakeNcclApi>> apis;
  std::vector<std::string> final_backend = std::vector<std::string>(kWorld);
};

// Every rank runs kOps device allreduces and checks each result element by element.
StreamRun RunStream(const std::string& fallback) {
  StreamRun run;
  run.apis = FakesWithFailingRank(FakeNcclFaults{.async_error_at_launch = kFaultAtLaunch});
  const std::string profile = WriteProfile(fallback);
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = RankOptions(env, profile, BackendChoice::kAuto);
        o.timeout = absl::Seconds(10);
        o.failure_report_window = absl::Seconds(5);
        auto comm = internal::CreateCommunicatorWith(o, Seams(run.apis[env.rank]));
        ASSERT_TRUE(comm.ok()) << comm.status();
        ASSERT_STREQ((*comm)->backend_name(), "nccl");
        for (int op = 0; op < kOps; ++op) {
          std::vector<float> buf(1000 + 37 * static_cast<size_t>(op));
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = Input(env.rank, op, i);
          absl::Status s =
              (*comm)
                  ->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)})
                  .Synchronize();
          ASSERT_TRUE(s.ok()) << "rank " << env.rank << " op " << op << ": " << s;
          for (size_t i = 0; i < buf.size(); ++i) {
            float want = 0;
            for (int r = 0; r < kWorld; ++r) want += Input(r, op, i);
            ASSERT_EQ(buf[i], want) << "rank " << env.rank << " op " << op << " element " << i;
          }
        }
        run.final_backend[static_cast<size_t>(env.rank)] = (*comm)->backend_name();
      },
      absl::Seconds(60));
  return run;
}

TEST(NcclRetry, AgreedFailureDegradesEveryRankToStagedGlooWithExactResults) {
  StreamRun run = RunStream("allow");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(run.final_backend[static_cast<size_t>(r)], "gloo+staged") << "rank " << r;
    // The NCCL communicator of generation 0 was aborted, and none was made after it.
    EXPECT_GE(run.apis[static_cast<size_t>(r)]->abort_calls(), 1) << "rank " << r;
    EXPECT_EQ(run.apis[static_cast<size_t>(r)]->init_calls(), 1) << "rank " << r;
  }
}

TEST(NcclRetry, PolicyThatForbidsDegradingRebuildsOnNcclWithExactResults) {
  StreamRun run = RunStream("deny");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(run.final_backend[static_cast<size_t>(r)], "nccl") << "rank " << r;
    EXPECT_EQ(run.apis[static_cast<size_t>(r)]->init_calls(), 2) << "rank " << r;
  }
}

// Rank 1's device never finishes the first collective of any communicator: every rebuild
// relaunches the op and the device hangs on it again. The retries of that op are counted across
// those device failures, so it fails after max_attempts (3: the first run and two rebuilds) with
// the watchdog's error, instead of rebuilding for ever.
TEST(NcclRetry, OpThatFailsOnTheDeviceAfterEveryRebuildFailsAfterMaxAttempts) {
  // Counted per communicator: the first launch of each.
  const std::vector<std::shared_ptr<FakeNcclApi>> fakes =
      RunWithHangingDevice(1, [](const testing::RankEnv& env, Communicator& comm) {
        std::vector<float> buf(64, static_cast<float>(env.rank + 1));
        const absl::Time start = absl::Now();
        absl::Status s = comm.Allreduce(TensorView{buf.data(), 64, DType::kF32, Device::Cuda(0)})
                             .Synchronize(absl::Seconds(40));
        EXPECT_FALSE(s.ok()) << "rank " << env.rank;
        EXPECT_EQ(s.message().find("wait bound"), absl::string_view::npos)
            << "rank " << env.rank << " still retrying after 40 s: " << s;
        EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "rank " << env.rank << ": " << s;
      });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(fakes[static_cast<size_t>(r)]->init_calls(), 3) << "rank " << r;
  }
}

// An op whose retry record would take the device records past retry.record_bytes runs without
// one: when rank 1's device never finishes it, it fails with the watchdog's error on every rank,
// and no rank rebuilds its communicator for a re-run it could not make exactly. With the default
// budget the same op is retried (OpThatFailsOnTheDeviceAfterEveryRebuildFailsAfterMaxAttempts).
TEST(NcclRetry, OpWhoseRecordIsOverTheBudgetFailsWithoutARebuild) {
  const std::vector<std::shared_ptr<FakeNcclApi>> fakes = RunWithHangingDevice(
      1,
      [](const testing::RankEnv& env, Communicator& comm) {
        std::vector<float> buf(512, static_cast<float>(env.rank + 1));  // 2 KiB
        const absl::Time start = absl::Now();
        absl::Status s =
            comm.Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)})
                .Synchronize(absl::Seconds(40));
        EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << "rank " << env.rank << ": " << s;
        EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << "rank " << env.rank << ": " << s;
      },
      "1KiB");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(fakes[static_cast<size_t>(r)]->init_calls(), 1) << "rank " << r;
  }
}

// Rank 1's device hangs on the collective after its first `in_flight` + 1 while the next
// `in_flight` - 1 are queued behind it (within the default window, retry.in_flight 8); the rebuilt
// communicator, which counts its launches afresh, runs fewer than that, so the hang does not recur.
// Each op's retry record is taken on the communicator's stream right before its collective, so the
// records of the ops behind the hung one are taken only once it ends (the abort ends it). The
// rebuilt communicator re-runs them all from their records, in order, with exact results; each
// restore waits on the new stream for the end of the op's first launch on the old one (where its
// record was taken), so it cannot read a record that stream has not taken yet.
void ExpectOpsBehindAHungOneReRunFromTheirRecords(int in_flight) {
  const int kFirst = in_flight + 1, kInFlight = in_flight;
  const std::vector<std::shared_ptr<FakeNcclApi>> fakes =
      RunWithHangingDevice(kFirst + 1, [&](const testing::RankEnv& env, Communicator& comm) {
        std::vector<std::vector<float>> bufs(kFirst + kInFlight, std::vector<float>(256));
        std::vector<Work> works;
        for (int op = 0; op < kFirst + kInFlight; ++op) {
          std::vector<float>& buf = bufs[static_cast<size_t>(op)];
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = Input(env.rank, op, i);
          works.push_back(
              comm.Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)}));
          // The ops behind the hung one are not waited for: a Wait would let the caller's stream
          // at their buffers, and such an op is never re-run in place (the next tests).
          if (op < kFirst) {
            absl::Status s = works.back().Synchronize(absl::Seconds(10));
            ASSERT_TRUE(s.ok()) << "rank " << env.rank << " op " << op << ": " << s;
          }
        }
        for (int op = 0; op < kFirst + kInFlight; ++op) {
          absl::Status s = works[static_cast<size_t>(op)].Synchronize(absl::Seconds(30));
          ASSERT_TRUE(s.ok()) << "rank " << env.rank << " op " << op << ": " << s;
          for (size_t i = 0; i < bufs[static_cast<size_t>(op)].size(); ++i) {
            float want = 0;
            for (int r = 0; r < kWorld; ++r) want += Input(r, op, i);
            ASSERT_EQ(bufs[static_cast<size_t>(op)][i], want)
                << "rank " << env.rank << " op " << op << " element " << i;
          }
        }
      });
  for (int r = 0; r < kWorld; ++r) {
    const FakeNcclApi& fake = *fakes[static_cast<size_t>(r)];
    EXPECT_EQ(fake.init_calls(), 2) << "rank " << r << " rebuilt once";
    // A restore: a copy on a communicator's stream right after it waited for the issue point and
    // for an event recorded on another communicator's stream (the first launch's end).
    std::vector<testing::FakeCall> calls = fake.calls();
    int restores = 0;
    for (size_t i = 2; i < calls.size(); ++i) {
      if (calls[i].name != "MemcpyAsync" || calls[i - 2].name != "StreamWaitEvent" ||
          calls[i - 1].name != "StreamWaitEvent") {
        continue;
      }
      for (size_t j = 0; j < i; ++j) {
        if (calls[j].name == "EventRecord" && calls[j].event == calls[i - 1].event &&
            calls[j].stream != nullptr && calls[j].stream != calls[i].stream) {
          ++restores;
        }
      }
    }
    EXPECT_EQ(restores, kInFlight) << "rank " << r;
  }
}

// How many collectives this rank's fake was asked to launch.
int AllreduceLaunches(const FakeNcclApi& fake) {
  int n = 0;
  for (const testing::FakeCall& c : fake.calls()) n += c.name == "AllReduce" ? 1 : 0;
  return n;
}

// The hazard of a relaunch in place: Wait let the caller's stream go on past the ops (a consumer
// kernel may read the result, or the trainer reuse the buffer), then the device failed. With
// copies on, the old recovery re-ran them in place (restore, re-run) under that consumer; now none
// is launched again, and outside a step the failing rank reports DataLoss.
TEST(NcclRetry, OpWhoseWaitReleasedTheStreamIsNeverRelaunchedInPlace) {
  constexpr int kOps = 3;  // rank 1's device never finishes the first
  // The buffers outlive the communicators: the fake device still holds the hung collective (with
  // pointers into them) until its communicator goes.
  std::vector<std::vector<std::vector<float>>> storage(
      kWorld, std::vector<std::vector<float>>(kOps, std::vector<float>(256)));
  const std::vector<std::shared_ptr<FakeNcclApi>> fakes =
      RunWithHangingDevice(2, [&](const testing::RankEnv& env, Communicator& comm) {
        std::vector<std::vector<float>>& bufs = storage[static_cast<size_t>(env.rank)];
        std::vector<Work> works;
        for (int op = 0; op < kOps; ++op) {
          std::vector<float>& buf = bufs[static_cast<size_t>(op)];
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = Input(env.rank, op, i);
          works.push_back(
              comm.Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)}));
          ASSERT_TRUE(works.back().Wait(absl::Seconds(10)).ok());
        }
        // The hung op and those behind it fail; the first names the loss here, or in the report of
        // the peer that saw it first (both devices stop: the fake's collective needs both ranks).
        size_t hung = 0;
        while (hung < works.size() && works[hung].Synchronize(absl::Seconds(30)).ok()) ++hung;
        ASSERT_LT(hung, works.size()) << "rank " << env.rank << ": every op completed";
        const absl::Status first = works[hung].Synchronize(absl::Seconds(10));
        EXPECT_TRUE(absl::IsDataLoss(first) || absl::IsAborted(first)) << first;
        EXPECT_THAT(first.message(), HasSubstr("not re-run in place"));
        for (size_t k = hung; k < works.size(); ++k) {
          EXPECT_FALSE(works[k].Synchronize(absl::Seconds(10)).ok()) << "op " << k;
        }
        EXPECT_FALSE(comm.health().ok());
      });
  for (int r = 0; r < kWorld; ++r) {
    const FakeNcclApi& fake = *fakes[static_cast<size_t>(r)];
    EXPECT_EQ(fake.init_calls(), 1) << "rank " << r << ": no rebuild, nothing may be re-run";
    EXPECT_EQ(AllreduceLaunches(fake), kOps) << "rank " << r << ": nothing launched again";
  }
}

// The same fault inside a step (the second of two; the profile asks for copies, which steps do
// not take): the released ops are not re-run alone; the step is redone on every rank
// (IsStepRedo) on the rebuilt communicator, and every step's sums are exact.
TEST(NcclRetry, ReleasedOpsOfAFailedStepAreRedoneWithTheStep) {
  constexpr int kOps = 3, kSteps = 2;
  std::atomic<int> redone{0};
  // Creation's launch, then step 0's ops (and commit): the hang lands in step 1. The rebuilt
  // communicator counts afresh and the redo stays below it.
  const std::vector<std::shared_ptr<FakeNcclApi>> fakes =
      RunWithHangingDevice(kOps + 3, [&](const testing::RankEnv& env, Communicator& comm) {
        std::vector<std::vector<float>> bufs(kOps, std::vector<float>(256));
        for (int step = 0; step < kSteps; ++step) {
          for (int attempt = 0;; ++attempt) {
            ASSERT_LT(attempt, 2) << "rank " << env.rank << " step " << step;
            ASSERT_TRUE(comm.BeginStep().ok());
            std::vector<Work> works;
            for (int op = 0; op < kOps; ++op) {
              std::vector<float>& buf = bufs[static_cast<size_t>(op)];
              for (size_t i = 0; i < buf.size(); ++i) buf[i] = Input(env.rank, step * kOps + op, i);
              works.push_back(
                  comm.Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)}));
              (void)works.back().Wait(absl::Seconds(10));  // releases the stream
            }
            absl::Status commit = comm.CommitStep();
            if (IsStepRedo(commit)) {
              EXPECT_EQ(step, 1) << "rank " << env.rank;
              redone.fetch_add(1);
              continue;
            }
            ASSERT_TRUE(commit.ok()) << "rank " << env.rank << ": " << commit;
            break;
          }
          for (int op = 0; op < kOps; ++op) {
            for (size_t i = 0; i < bufs[static_cast<size_t>(op)].size(); ++i) {
              float want = 0;
              for (int r = 0; r < kWorld; ++r) want += Input(r, step * kOps + op, i);
              ASSERT_EQ(bufs[static_cast<size_t>(op)][i], want)
                  << "rank " << env.rank << " step " << step << " op " << op << " element " << i;
            }
          }
        }
      });
  EXPECT_EQ(redone.load(), kWorld);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(fakes[static_cast<size_t>(r)]->init_calls(), 2) << "rank " << r << " rebuilt once";
    // Steps take no record: no device copy of any input (retry.replay copy would take one per op).
    EXPECT_EQ(fakes[static_cast<size_t>(r)]->memcpy_calls(), 0) << "rank " << r;
  }
}

TEST(NcclRetry, OpQueuedBehindAHungOneIsReRunFromItsRecordExactly) {
  ExpectOpsBehindAHungOneReRunFromTheirRecords(2);
}

TEST(NcclRetry, WindowOfOpsBehindAHungOneIsReRunFromTheirRecordsExactly) {
  ExpectOpsBehindAHungOneReRunFromTheirRecords(7);
}

// Rank 1 loses the completion of op #2 after its data moved: rank 0 completed it, so the vote
// restarts at #2 and rank 0 re-runs it for rank 1 from its record, into scratch. That scratch copy
// is queued on the communicator's stream behind the op's position; the re-run must be queued there
// behind it (Launch), not on the caller's stream (Run), where it read the scratch before the copy
// and rank 1 received its own input (2000) as the sum. Both ranks end with the exact sums.
TEST(NcclRetry, OpAPeerCompletedIsReRunForItBehindItsScratchCopy) {
  constexpr int kOpsHere = 4;
  const std::vector<std::shared_ptr<FakeNcclApi>> fakes = RunWithFaultyDevice(
      FakeNcclFaults{.completion_lost_at_launch = 2},
      [&](const testing::RankEnv& env, Communicator& comm) {
        std::vector<std::vector<float>> bufs(kOpsHere, std::vector<float>(256));
        for (int op = 0; op < kOpsHere; ++op) {
          std::vector<float>& buf = bufs[static_cast<size_t>(op)];
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = Input(env.rank, op, i);
          absl::Status s =
              comm.Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)})
                  .Synchronize(absl::Seconds(10));
          ASSERT_TRUE(s.ok()) << "rank " << env.rank << " op " << op << ": " << s;
          for (size_t i = 0; i < buf.size(); ++i) {
            float want = 0;
            for (int r = 0; r < kWorld; ++r) want += Input(r, op, i);
            ASSERT_EQ(buf[i], want) << "rank " << env.rank << " op " << op << " element " << i;
          }
        }
      });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(fakes[static_cast<size_t>(r)]->init_calls(), 2) << "rank " << r << " rebuilt once";
  }
  // Rank 0's re-run: its scratch copy and then its collective, both on the rebuilt communicator's
  // stream (the caller's stream here is the legacy default stream, null).
  const std::vector<testing::FakeCall> calls = fakes[0]->calls();
  void* rebuilt_stream = nullptr;
  for (size_t i = 2; i < calls.size() && rebuilt_stream == nullptr; ++i) {
    if (calls[i].name == "MemcpyAsync" && calls[i - 1].name == "StreamWaitEvent" &&
        calls[i - 2].name == "StreamWaitEvent") {
      rebuilt_stream = calls[i].stream;
      ASSERT_LT(i + 1, calls.size());
      EXPECT_EQ(calls[i + 1].name, "AllReduce");
      EXPECT_EQ(calls[i + 1].stream, rebuilt_stream) << "the re-run is not behind its copy";
    }
  }
  EXPECT_NE(rebuilt_stream, nullptr) << "rank 0 re-ran nothing from scratch";
}

// NCCL init fails on rank 1 at the first attempt only; with fallback deny the whole creation
// fails there, and every rank retries it together. `inits`: each rank's NCCL init calls.
std::vector<absl::StatusOr<std::string>> CreateWithFlakyInit(int max_retry_attempts,
                                                             std::vector<int>* inits) {
  const std::vector<std::shared_ptr<FakeNcclApi>> fakes =
      FakesWithFailingRank(FakeNcclFaults{.init_fails_first = 1});
  const std::string profile = WriteProfile("deny");
  std::vector<absl::StatusOr<std::string>> outcome(kWorld, absl::UnknownError("not run"));
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = RankOptions(env, profile, BackendChoice::kNccl);
        o.max_retry_attempts = max_retry_attempts;
        o.init_timeout = absl::Seconds(4);
        auto comm = internal::CreateCommunicatorWith(o, Seams(fakes[env.rank]));
        if (!comm.ok()) {
          outcome[static_cast<size_t>(env.rank)] = comm.status();
          return;
        }
        std::vector<float> buf(64, static_cast<float>(env.rank + 1));
        absl::Status s = (*comm)
                             ->Allreduce(TensorView{buf.data(), 64, DType::kF32, Device::Cuda(0)})
                             .Synchronize();
        ASSERT_TRUE(s.ok()) << s;
        for (float v : buf) ASSERT_EQ(v, 3.0f);
        outcome[static_cast<size_t>(env.rank)] = std::string((*comm)->backend_name());
      },
      absl::Seconds(60));
  inits->clear();
  for (const auto& fake : fakes) inits->push_back(fake->init_calls());
  return outcome;
}

TEST(NcclRetry, InitFailureOnOneRankIsRetriedByEveryRank) {
  std::vector<int> inits;
  std::vector<absl::StatusOr<std::string>> outcome = CreateWithFlakyInit(3, &inits);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(outcome[static_cast<size_t>(r)].ok()) << outcome[static_cast<size_t>(r)].status();
    EXPECT_EQ(*outcome[static_cast<size_t>(r)], "nccl");
    EXPECT_EQ(inits[static_cast<size_t>(r)], 2) << "rank " << r << " attempts";
  }
}

TEST(NcclRetry, InitFailureWithRetriesOffFailsEveryRankNamingTheRank) {
  std::vector<int> inits;
  std::vector<absl::StatusOr<std::string>> outcome = CreateWithFlakyInit(1, &inits);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_FALSE(outcome[static_cast<size_t>(r)].ok()) << "rank " << r;
    EXPECT_TRUE(absl::IsUnavailable(outcome[static_cast<size_t>(r)].status()));
    EXPECT_NE(outcome[static_cast<size_t>(r)].status().message().find("rank 1: "),
              absl::string_view::npos)
        << outcome[static_cast<size_t>(r)].status();
    EXPECT_EQ(inits[static_cast<size_t>(r)], 1);
  }
}

}  // namespace
}  // namespace adaptcomm

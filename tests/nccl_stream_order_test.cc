// Stream-ordered device collectives (adaptcomm/ext/backend.h, StreamOrdered), end to end through
// Communicator::Create's internal factory (internal::CreateCommunicatorWith) with each rank's fake
// CUDA runtime and NCCL. HoldStreams(true) models a GPU that has not run
// anything yet: a collective issued and waited for must come back to the caller anyway (Wait only
// makes the caller's stream wait), in issue order on the communicator's stream, and the results
// appear once the "device" runs (Synchronize). The watchdog catches a collective the device
// never finishes; an abort fails Synchronize at once; a view whose stream is on another device
// is refused at the call.
#include <stdlib.h>

#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/block_recycler.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/nccl/stream_order.h"
#include "nlohmann/json.hpp"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"
#include "tests/sanitizer_build.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;

constexpr int kWorld = 2;

// One fake per rank, of one fake world; Create() builds a rank's communicator on its fake (which
// backend selection then finds NCCL-capable).
class FakeRanks {
 public:
  explicit FakeRanks(const std::vector<FakeNcclFaults>& faults) {
    auto world = testing::MakeFakeNcclWorld();
    for (const FakeNcclFaults& f : faults) apis_.push_back(std::make_shared<FakeNcclApi>(world, f));
  }
  FakeNcclApi& api(int rank) { return *apis_[static_cast<size_t>(rank)]; }
  absl::StatusOr<std::unique_ptr<Communicator>> Create(int rank, const CommunicatorOptions& o) {
    internal::CommunicatorDeps deps;
    deps.use_given_apis = true;
    deps.cuda = apis_[static_cast<size_t>(rank)];
    deps.nccl = apis_[static_cast<size_t>(rank)];
    return internal::CreateCommunicatorWith(o, deps);
  }

 private:
  std::vector<std::shared_ptr<FakeNcclApi>> apis_;
};

CommunicatorOptions Options(const testing::RankEnv& env, int retries, absl::Duration timeout) {
  CommunicatorOptions o = env.options;
  o.backend = BackendChoice::kAuto;
  o.max_retry_attempts = retries;
  o.replay = ReplayMode::kCopy;  // these tests check the copies and their order
  o.timeout = timeout;
  o.failure_report_window = absl::Seconds(2);
  return o;
}

float Input(int rank, int op, size_t i) {
  return static_cast<float>((rank + 1) * 100000 + op * 8 + static_cast<int>(i));
}

// A rank whose fake device holds every collective (HoldStreams) until the test lets it run, its
// communicator (coordinated retry: `retries` attempts) and a stream of the caller's; the fake's
// call log starts after them.
struct HeldRank {
  FakeNcclApi* fake = nullptr;
  std::unique_ptr<Communicator> comm;
  cuda::CudaStream caller = nullptr;
};
// `profile`: the profile file (empty: the default one).
absl::StatusOr<HeldRank> StartHeld(FakeRanks& fakes, const testing::RankEnv& env, int retries,
                                   const std::string& profile = "") {
  HeldRank held;
  held.fake = &fakes.api(env.rank);
  held.fake->HoldStreams(true);
  CommunicatorOptions o = Options(env, retries, absl::Seconds(30));
  if (!profile.empty()) o.profile_file = profile;
  auto comm = fakes.Create(env.rank, o);
  if (!comm.ok()) return comm.status();
  held.comm = *std::move(comm);
  if (held.fake->StreamCreateNonBlocking(&held.caller) != cuda::kCudaSuccess) {
    return absl::InternalError("the fake refused a stream");
  }
  held.fake->ClearCalls();
  return held;
}

// A profile whose coordinated retry keeps `in_flight` device ops in flight (retry.in_flight).
std::string WindowProfile(int in_flight) {
  char dir[] = "/tmp/adaptcomm_stream_order_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  const std::string path = absl::StrCat(dir, "/profile.yaml");
  std::ofstream(path) << "schema: 1\ndefaults:\n  retry:\n    in_flight: " << in_flight
                      << "\ntiers:\n  - name: test\n    params: any\n";
  return path;
}

int CallsNamed(const std::vector<testing::FakeCall>& calls, const std::string& name) {
  int n = 0;
  for (const testing::FakeCall& c : calls) n += c.name == name ? 1 : 0;
  return n;
}

// Fills `buf` with this rank's input of op `op` and issues its allreduce on `caller`.
Work IssueAllreduce(Communicator& comm, std::vector<float>& buf, int rank, int op,
                    cuda::CudaStream caller) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = Input(rank, op, i);
  return comm.Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0), caller});
}

// Issues one allreduce per buffer (op i fills bufs[i]) and waits on the first `waited` of them.
std::vector<Work> IssueAll(Communicator& comm, std::vector<std::vector<float>>& bufs, int rank,
                           cuda::CudaStream caller, size_t waited) {
  std::vector<Work> works;
  for (size_t op = 0; op < bufs.size(); ++op) {
    works.push_back(IssueAllreduce(comm, bufs[op], rank, static_cast<int>(op), caller));
    if (op < waited) {
      absl::Status s = works.back().Wait(absl::Seconds(5));
      EXPECT_TRUE(s.ok()) << "rank " << rank << " op " << op << ": " << s;
    }
  }
  return works;
}

// Synchronizes every op and checks its result element by element.
void ExpectSums(std::vector<Work>& works, const std::vector<std::vector<float>>& bufs, int rank) {
  for (size_t op = 0; op < works.size(); ++op) {
    ASSERT_TRUE(works[op].Synchronize(absl::Seconds(10)).ok()) << "op " << op;
    for (size_t i = 0; i < bufs[op].size(); ++i) {
      float want = 0;
      for (int r = 0; r < kWorld; ++r) want += Input(r, static_cast<int>(op), i);
      ASSERT_EQ(bufs[op][i], want) << "rank " << rank << " op " << op << " element " << i;
    }
  }
}

// 1,000 allreduces issued back to back: every issue + Wait() returns before the device ran any of
// them, the calls reached the fake in stream order, and the results are exact once it runs.
TEST(StreamOrder, ThousandAllreducesReturnBeforeTheDeviceRunsAny) {
  constexpr int kOps = 1000;
  constexpr size_t kCount = 8;
  FakeRanks fakes{std::vector<FakeNcclFaults>(kWorld)};
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        absl::StatusOr<HeldRank> held = StartHeld(fakes, env, 1);
        ASSERT_TRUE(held.ok()) << held.status();
        ASSERT_STREQ(held->comm->backend_name(), "nccl");
        FakeNcclApi& fake = *held->fake;
        Communicator& comm = *held->comm;
        const cuda::CudaStream caller = held->caller;

        std::vector<std::vector<float>> bufs(kOps, std::vector<float>(kCount));
        const absl::Time start = absl::Now();
        std::vector<Work> works = IssueAll(comm, bufs, env.rank, caller, kOps);
        const absl::Duration issued = absl::Now() - start;
        EXPECT_EQ(fake.collectives_started(), 0);
        EXPECT_EQ(bufs[0][0], Input(env.rank, 0, 0));  // nothing ran
        EXPECT_FALSE(works.back().completed());
        // Issue bound: far below one host round trip per op (a blocking path needs the peers).
        EXPECT_LT(issued, absl::Seconds(10));

        // Per op, in order: the caller's position, the communicator's stream waiting for it, the
        // collective there, the event after it; Wait() then makes the caller's stream wait.
        std::vector<testing::FakeCall> calls = fake.calls();
        ASSERT_GE(calls.size(), 5u);
        EXPECT_EQ(calls[0].name, "EventRecord");
        EXPECT_EQ(calls[0].stream, caller);
        void* comm_stream = calls[1].stream;
        EXPECT_EQ(calls[1].name, "StreamWaitEvent");
        EXPECT_EQ(calls[1].event, calls[0].event);
        EXPECT_NE(comm_stream, caller);
        EXPECT_EQ(calls[2].name, "AllReduce");
        EXPECT_EQ(calls[2].stream, comm_stream);
        EXPECT_EQ(calls[3].name, "EventRecord");
        EXPECT_EQ(calls[3].stream, comm_stream);
        EXPECT_EQ(calls[4].name, "StreamWaitEvent");
        EXPECT_EQ(calls[4].stream, caller);
        EXPECT_EQ(calls[4].event, calls[3].event);
        int collectives = 0;
        for (const auto& c : calls) {
          if (c.name == "AllReduce") {
            EXPECT_EQ(c.stream, comm_stream);
            ++collectives;
          }
        }
        EXPECT_EQ(collectives, kOps);

        fake.HoldStreams(false);
        ASSERT_TRUE(works.back().Synchronize(absl::Seconds(30)).ok());
        ExpectSums(works, bufs, env.rank);
        EXPECT_EQ(fake.collectives_started(), kOps);
      },
      absl::Seconds(120));
}

// An op's events object (its issue and end events, MarkIssue) lives in a recycled block: when the
// last holder lets go, the events go back to the pool and the block to
// ProcessBlocks<NcclOpEvents>(), and the next op's object is made in that block.
TEST(StreamOrder, OpEventsGoBackToThePoolAndTheirBlockIsReused) {
  if (testing::kUnderAddressSanitizer) GTEST_SKIP() << "nothing is kept under ASan";
  auto fake = std::make_shared<FakeNcclApi>(testing::MakeFakeNcclWorld(), FakeNcclFaults{});
  auto shared = std::make_shared<nccl::OpEventsShared>(fake, 0, fake, nullptr);
  nccl::EventPool& pool = shared->pool;
  cuda::CudaEvent issued = nullptr, done = nullptr;
  ASSERT_TRUE(pool.TakeTwo(&issued, &done).ok());
  std::shared_ptr<nccl::NcclOpEvents> events =
      MakeRecycled<nccl::NcclOpEvents>(shared, issued, done, nccl::LaunchedOp{});
  const nccl::NcclOpEvents* const where = events.get();
  const size_t kept = ProcessBlocks<nccl::NcclOpEvents>().kept();
  events.reset();
  EXPECT_EQ(ProcessBlocks<nccl::NcclOpEvents>().kept(), kept + 1);
  cuda::CudaEvent again_issued = nullptr, again_done = nullptr;
  ASSERT_TRUE(pool.TakeTwo(&again_issued, &again_done).ok());
  // The pool's last two: the ones given back together.
  EXPECT_THAT((std::vector<cuda::CudaEvent>{again_issued, again_done}),
              ::testing::UnorderedElementsAre(issued, done));
  events = MakeRecycled<nccl::NcclOpEvents>(shared, again_issued, again_done, nccl::LaunchedOp{});
  EXPECT_EQ(events.get(), where);
}

// Runs `body(env, held)` on every rank, each with its held rank (StartHeld, coordinated retry on,
// `profile`).
template <typename Body>
void RunHeldRanks(const std::string& profile, Body body) {
  FakeRanks fakes{std::vector<FakeNcclFaults>(kWorld)};
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        absl::StatusOr<HeldRank> held = StartHeld(fakes, env, 3, profile);
        ASSERT_TRUE(held.ok()) << held.status();
        body(env, *held);
      },
      absl::Seconds(60));
}

// With coordinated retry on, each op's input is recorded by a device copy on the communicator's
// stream, after that stream waited for the op's issue point and before the collective that
// overwrites the input; on the caller's stream it would run behind the issue point, where the
// collective (which waits only for that point) may already have overwritten the input.
TEST(StreamOrder, RetryRecordIsCopiedOnTheCommunicatorStreamAheadOfTheCollective) {
  constexpr int kOps = 2;  // within the in-flight window with retries on: none waits for the device
  constexpr size_t kCount = 16;
  RunHeldRanks("", [&](const testing::RankEnv& env, HeldRank& held) {
    FakeNcclApi& fake = *held.fake;
    Communicator& comm = *held.comm;
    const cuda::CudaStream caller = held.caller;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(kCount));
    std::vector<Work> works = IssueAll(comm, bufs, env.rank, caller, kOps);
    std::vector<testing::FakeCall> calls = fake.calls();
    int copies = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].name != "MemcpyAsync") continue;
      ++copies;
      ASSERT_GE(i, 2u);
      ASSERT_LT(i + 1, calls.size());
      // The issue point on the caller's stream, the communicator's stream waiting for it, the
      // copy there, the issue point recorded again behind the copy (so that a restore on another
      // stream waits for the record), then the collective on the same stream (which already
      // waits).
      ASSERT_LT(i + 2, calls.size());
      EXPECT_EQ(calls[i - 2].name, "EventRecord") << i;
      EXPECT_EQ(calls[i - 2].stream, caller) << i;
      EXPECT_EQ(calls[i - 1].name, "StreamWaitEvent") << i;
      EXPECT_EQ(calls[i - 1].event, calls[i - 2].event) << i;
      EXPECT_NE(calls[i].stream, caller) << "copy " << copies << " on the caller's stream";
      EXPECT_EQ(calls[i].stream, calls[i - 1].stream) << i;
      EXPECT_EQ(calls[i + 1].name, "EventRecord") << i;
      EXPECT_EQ(calls[i + 1].event, calls[i - 2].event) << i;
      EXPECT_EQ(calls[i + 1].stream, calls[i].stream) << i;
      EXPECT_EQ(calls[i + 2].name, "AllReduce") << i;
      EXPECT_EQ(calls[i + 2].stream, calls[i].stream) << i;
    }
    EXPECT_EQ(copies, kOps);
    fake.HoldStreams(false);
    ExpectSums(works, bufs, env.rank);
  });
}

// With coordinated retry on, the profile's retry.in_flight ops are queued on the device at once:
// each one's Wait() returns while the device has run none of them. The next op waits in the
// executor's queue (its bounded Wait() times out) until one of them ends; then every sum is exact.
TEST(StreamOrder, RetryWindowFromTheProfileIsQueuedOnTheDeviceAtOnce) {
  constexpr int kWindow = 5;
  constexpr size_t kCount = 16;
  RunHeldRanks(WindowProfile(kWindow), [&](const testing::RankEnv& env, HeldRank& held) {
    FakeNcclApi& fake = *held.fake;
    std::vector<std::vector<float>> bufs(kWindow + 1, std::vector<float>(kCount));
    std::vector<Work> works = IssueAll(*held.comm, bufs, env.rank, held.caller, kWindow);
    EXPECT_EQ(CallsNamed(fake.calls(), "AllReduce"), kWindow);
    EXPECT_EQ(CallsNamed(fake.calls(), "MemcpyAsync"), kWindow) << "one record per op";
    const absl::Status beyond = works.back().Wait(absl::Milliseconds(100));
    EXPECT_TRUE(absl::IsDeadlineExceeded(beyond)) << beyond;
    EXPECT_EQ(CallsNamed(fake.calls(), "AllReduce"), kWindow);
    EXPECT_EQ(fake.collectives_started(), 0) << "the device ran an op while held";
    fake.HoldStreams(false);
    ExpectSums(works, bufs, env.rank);
    EXPECT_EQ(CallsNamed(fake.calls(), "AllReduce"), kWindow + 1);
  });
}

// An op issued while the in-flight window is full (coordinated retry on, retry.in_flight 2) waits
// for the worker to launch it; it still runs at the point of the caller's stream where it was
// issued, not behind work the trainer queued on that stream after issuing it (here a cast kernel).
TEST(StreamOrder, OpQueuedBehindAFullWindowRunsAtItsIssuePoint) {
  constexpr int kOps = 3;
  constexpr size_t kCount = 16;
  RunHeldRanks(WindowProfile(kOps - 1), [&](const testing::RankEnv& env, HeldRank& held) {
    FakeNcclApi& fake = *held.fake;
    Communicator& comm = *held.comm;
    const cuda::CudaStream caller = held.caller;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(kCount));
    // The last one is not waited for: the trainer queues its next kernel first.
    std::vector<Work> works = IssueAll(comm, bufs, env.rank, caller, kOps - 1);
    // The trainer's next kernel on the same stream, queued while the last op waits its turn.
    std::vector<float> later_in(kCount, 1.5f);
    std::vector<uint16_t> later_out(kCount);
    ASSERT_EQ(fake.LaunchCast(cuda::CastDirection::kF32ToBF16, later_in.data(), later_out.data(),
                              kCount, 1.0f, caller, nullptr),
              cuda::kCudaSuccess);
    fake.HoldStreams(false);
    ASSERT_TRUE(works.back().Wait(absl::Seconds(10)).ok());
    ASSERT_TRUE(works.back().Synchronize(absl::Seconds(10)).ok());

    std::vector<testing::FakeCall> calls = fake.calls();
    size_t cast = 0, last_collective = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].name == "LaunchCast") cast = i;
      if (calls[i].name == "AllReduce") last_collective = i;
    }
    ASSERT_GT(cast, 0u);
    ASSERT_GT(last_collective, cast) << "the last op was launched before the trainer's kernel";
    // What the communicator's stream last waited for before the last collective (before its
    // retry record's copy): an event recorded on the caller's stream before the trainer's
    // kernel.
    size_t wait = last_collective;
    while (wait > cast && !(calls[wait].name == "StreamWaitEvent" &&
                            calls[wait].stream == calls[last_collective].stream)) {
      --wait;
    }
    ASSERT_EQ(calls[wait].name, "StreamWaitEvent");
    ASSERT_EQ(calls[wait + 1].name, "MemcpyAsync");  // the record, then the collective
    // The issue point moves behind the record's copy (a restore on another stream waits for it).
    ASSERT_EQ(calls[wait + 2].name, "EventRecord");
    EXPECT_EQ(calls[wait + 2].event, calls[wait].event);
    EXPECT_EQ(calls[wait + 2].stream, calls[last_collective].stream);
    ASSERT_EQ(wait + 3, last_collective);
    void* awaited = calls[wait].event;
    size_t recorded = calls.size();  // where MarkIssue recorded it: its first record
    for (size_t i = 0; i < calls.size() && recorded == calls.size(); ++i) {
      if (calls[i].name == "EventRecord" && calls[i].event == awaited) recorded = i;
    }
    ASSERT_LT(recorded, calls.size());
    EXPECT_EQ(calls[recorded].stream, caller);
    EXPECT_LT(recorded, cast) << "the op waits for work queued after it was issued";
    ExpectSums(works, bufs, env.rank);
  });
}

// An op queued behind a full window (retry.in_flight 1) is launched by the worker once the device
// finishes the one ahead of it; a caller already blocked in its Wait() then wakes (a launch is
// published without the Work's lock, and takes it only to wake such a waiter) and returns long
// before its bound, while the device still holds the op (nothing else ends its wait).
TEST(StreamOrder, CallerWaitingForAQueuedOpWakesWhenTheWorkerLaunchesIt) {
  constexpr size_t kCount = 16;
  constexpr absl::Duration kDeviceHeld = absl::Milliseconds(300);
  RunHeldRanks(WindowProfile(1), [&](const testing::RankEnv& env, HeldRank& held) {
    std::vector<std::vector<float>> bufs(2, std::vector<float>(kCount));
    // The first is launched and waited for; the second waits in the queue for its slot.
    std::vector<Work> works = IssueAll(*held.comm, bufs, env.rank, held.caller, /*waited=*/1);
    std::thread device([&] {
      absl::SleepFor(kDeviceHeld);
      EXPECT_EQ(held.fake->StepHeldDevice(), 1);  // the first op only
    });
    const absl::Time start = absl::Now();
    const absl::Status waited = works[1].Wait(absl::Seconds(30));
    const absl::Duration took = absl::Now() - start;
    device.join();
    ASSERT_TRUE(waited.ok()) << waited;
    EXPECT_GE(took, kDeviceHeld - absl::Milliseconds(50)) << "returned before it was launched";
    EXPECT_LT(took, absl::Seconds(10)) << "the launch did not wake the waiter";
    EXPECT_EQ(works[1].state(), WorkState::kRunning);  // still on the held device
    held.fake->HoldStreams(false);
    ExpectSums(works, bufs, env.rank);
  });
}

// The device never finishes one of rank 0's collectives (its 4th launch, counting the one of
// creation): Wait() still returns for every op (they are queued), and the watchdog fails that op
// past its timeout (and the ops behind it), naming it; Synchronize returns that within its own
// bound.
TEST(StreamOrder, CollectiveTheDeviceNeverFinishesIsCaughtByTheWatchdog) {
  std::vector<FakeNcclFaults> faults(kWorld);
  faults[0].hang_at_launch = 4;
  FakeRanks fakes(faults);
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        auto comm = fakes.Create(env.rank, Options(env, 1, absl::Seconds(1)));
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<std::vector<float>> bufs(5, std::vector<float>(16, 1.0f));
        std::vector<Work> works;
        for (auto& buf : bufs) {
          works.push_back(
              (*comm)->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)}));
          ASSERT_TRUE(works.back().Wait(absl::Seconds(5)).ok());
        }
        ASSERT_TRUE(works[0].Synchronize(absl::Seconds(5)).ok());
        size_t hung = 1;
        absl::Status first;
        const absl::Time start = absl::Now();
        for (; hung < works.size(); ++hung) {
          first = works[hung].Synchronize(absl::Seconds(20));
          if (!first.ok()) break;
        }
        EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << first;
        ASSERT_LT(hung, works.size()) << "every op completed";
        EXPECT_GE(hung, 1u);
        if (env.rank == 0) {
          EXPECT_TRUE(absl::IsDeadlineExceeded(first)) << first;
          EXPECT_THAT(first.message(), HasSubstr(absl::StrCat("allreduce #", hung + 1)));
          EXPECT_THAT(first.message(), HasSubstr("did not complete on the device within"));
        }
        for (size_t k = hung + 1; k < works.size(); ++k) {
          EXPECT_FALSE(works[k].Synchronize(absl::Seconds(10)).ok()) << "op " << k + 1;
        }
      },
      absl::Seconds(60));
}

// After Abort(), Synchronize on ops still on the device returns the abort's status at once.
TEST(StreamOrder, SynchronizeAfterAbortReturnsTheAbortAtOnce) {
  FakeRanks fakes{std::vector<FakeNcclFaults>(kWorld)};
  // A rank's abort reaches its peer through the store: no rank may abort before every rank has
  // issued its op, or the peer's op fails at issue instead of on the device.
  absl::Mutex mu;
  int issued = 0;
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        fakes.api(env.rank).HoldStreams(true);
        auto comm = fakes.Create(env.rank, Options(env, 1, absl::Seconds(30)));
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<float> buf(64, 1.0f);
        Work work =
            (*comm)->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)});
        ASSERT_TRUE(work.Wait(absl::Seconds(5)).ok());
        {
          absl::MutexLock lock(&mu);
          ++issued;
          const auto all_issued = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return issued == kWorld; };
          ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_issued), absl::Seconds(10)));
        }
        (*comm)->Abort(absl::CancelledError("trainer stopping"));
        const absl::Time start = absl::Now();
        absl::Status s = work.Synchronize(absl::Seconds(20));
        EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
        EXPECT_TRUE(absl::IsAborted(s) || absl::IsCancelled(s)) << s;
        EXPECT_THAT(s.message(), HasSubstr("trainer stopping"));
        fakes.api(env.rank).HoldStreams(false);
      },
      absl::Seconds(60));
}

// A device op launched at its issue (the inline path, which reads the clock once, without
// absl::Now()) is stamped on the wall clock every other record uses: its flight-record times lie
// between readings of absl::Now() taken around it.
TEST(StreamOrder, DeviceOpTimesInTheFlightRecordAreWallClockTimes) {
  FakeRanks fakes{std::vector<FakeNcclFaults>(kWorld)};
  const std::string dir = ::testing::TempDir() + "/stream_order_flight";
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = Options(env, 1, absl::Seconds(30));
        o.flight_recorder_dir = dir;
        auto comm = fakes.Create(env.rank, o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<float> buf(16, 1.0f);
        const int64_t before_us = absl::ToUnixMicros(absl::Now());
        Work work =
            (*comm)->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)});
        const int64_t issued_us = absl::ToUnixMicros(absl::Now());
        ASSERT_TRUE(work.Synchronize(absl::Seconds(10)).ok());
        absl::StatusOr<std::string> path = (*comm)->DumpFlightRecord("test");
        ASSERT_TRUE(path.ok()) << path.status();
        std::ifstream in(*path);
        const nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
        ASSERT_FALSE(doc.is_discarded()) << *path;
        const nlohmann::json* op = nullptr;
        for (const nlohmann::json& e : doc["entries"]) {
          if (e["op"] == "allreduce") op = &e;
        }
        ASSERT_NE(op, nullptr) << doc.dump(1);
        const int64_t enqueue_us = (*op)["enqueue_us"].get<int64_t>();
        EXPECT_GE(enqueue_us, before_us);
        EXPECT_LE(enqueue_us, issued_us);
        EXPECT_EQ((*op)["start_us"].get<int64_t>(), enqueue_us);  // launched as it was issued
      },
      absl::Seconds(60));
}

// The watchdog asks the device about the ops in flight without the executor's lock, which the
// issuing thread takes for every op: a slow cudaEventQuery (300 ms here; about a microsecond on an
// H200, where holding the lock through one per op kept the trainer's thread blocked for 60% of its
// time) delays no issue. Holding the lock, the second op's issue would wait out the query.
TEST(StreamOrder, WatchdogAsksTheDeviceWithoutHoldingUpTheIssuingThread) {
  FakeNcclFaults slow_query;
  slow_query.event_query_takes = absl::Milliseconds(300);
  FakeRanks fakes{std::vector<FakeNcclFaults>(kWorld, slow_query)};
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        auto comm = fakes.Create(env.rank, Options(env, 1, absl::Seconds(30)));
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<float> buf(16, 1.0f);
        const TensorView view{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)};
        ASSERT_TRUE((*comm)->Allreduce(view).Wait(absl::Seconds(5)).ok());
        absl::SleepFor(absl::Milliseconds(50));  // the watchdog's next poll is in its query
        const absl::Time start = absl::Now();
        Work last;
        for (int i = 0; i < 4; ++i) {
          last = (*comm)->Allreduce(view);
          ASSERT_TRUE(last.Wait(absl::Seconds(5)).ok());
        }
        const absl::Duration issued = absl::Now() - start;
        EXPECT_LT(issued, absl::Milliseconds(150)) << "4 issues + Wait behind a 300 ms query";
        ASSERT_TRUE(last.Synchronize(absl::Seconds(20)).ok());
        EXPECT_EQ(buf[0], 32.0f);  // five allreduces in place over two ranks: 1 * 2^5
      },
      absl::Seconds(60));
}

// Ops end in launch order, so the watchdog asks the newest op in flight first: 300 ops the device
// finished are retired after one query of 10 ms, where asking each in turn would take 3 s.
TEST(StreamOrder, WatchdogRetiresFinishedOpsWithAFewQueries) {
  FakeNcclFaults slow_query;
  slow_query.event_query_takes = absl::Milliseconds(10);
  FakeRanks fakes{std::vector<FakeNcclFaults>(1, slow_query)};  // no peer to wait for
  testing::RunRanks(
      testing::RankMode::kThreads, 1,
      [&](const testing::RankEnv& env) {
        FakeNcclApi& api = fakes.api(env.rank);
        auto comm = fakes.Create(env.rank, Options(env, 1, absl::Seconds(30)));
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<float> buf(16, 1.0f);
        const TensorView view{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)};
        api.HoldStreams(true);
        std::vector<Work> works;
        for (int i = 0; i < 300; ++i) {
          works.push_back((*comm)->Allreduce(view));
          ASSERT_TRUE(works.back().Wait(absl::Seconds(5)).ok());
        }
        const absl::Time released = absl::Now();
        api.HoldStreams(false);  // the device runs them all once asked about one
        // A host op runs once the watchdog has retired every op in flight.
        ASSERT_TRUE((*comm)->Barrier().Wait(absl::Seconds(20)).ok());
        EXPECT_LT(absl::Now() - released, absl::Milliseconds(1500));
        for (Work& w : works) EXPECT_TRUE(w.completed());
      },
      absl::Seconds(60));
}

// In-place alltoalls issued back to back (grouped sends and receives, which the fake starts at
// once, each waiting for its peer): each sends from a copy of its input taken on the
// communicator's stream behind its issue point, all three through the one staging buffer (stream
// order keeps a copy behind the sends of the op before); every result is exact.
TEST(StreamOrder, InPlaceAlltoallsInFlightShareTheStagingBuffer) {
  FakeRanks fakes{std::vector<FakeNcclFaults>(kWorld)};
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        absl::StatusOr<HeldRank> held = StartHeld(fakes, env, 1);
        ASSERT_TRUE(held.ok()) << held.status();
        constexpr size_t kBlock = 6;
        std::vector<std::vector<int32_t>> bufs(3, std::vector<int32_t>(kBlock * kWorld));
        std::vector<Work> works;
        for (size_t op = 0; op < bufs.size(); ++op) {
          for (size_t i = 0; i < bufs[op].size(); ++i) {
            bufs[op][i] = static_cast<int32_t>(env.rank * 10000 + op * 100 + i);
          }
          const TensorView view{bufs[op].data(), bufs[op].size(), DType::kI32, Device::Cuda(0),
                                held->caller};
          works.push_back(held->comm->Alltoall(view, view));
          ASSERT_TRUE(works.back().Wait(absl::Seconds(5)).ok());
        }
        held->fake->HoldStreams(false);
        for (size_t op = 0; op < bufs.size(); ++op) {
          ASSERT_TRUE(works[op].Synchronize(absl::Seconds(10)).ok()) << "op " << op;
          for (size_t i = 0; i < bufs[op].size(); ++i) {
            const auto from = static_cast<int32_t>(i / kBlock);
            ASSERT_EQ(bufs[op][i], static_cast<int32_t>(from * 10000 + op * 100 +
                                                        env.rank * kBlock + i % kBlock))
                << "rank " << env.rank << " op " << op << " element " << i;
          }
        }
        EXPECT_EQ(CallsNamed(held->fake->calls(), "MemcpyAsync"), 3);
      },
      absl::Seconds(60));
}

// A CUDA view whose stream belongs to another device is refused at the call, naming the view.
TEST(StreamOrder, ViewWhoseStreamIsOnAnotherDeviceIsInvalidArgument) {
  std::vector<FakeNcclFaults> faults(kWorld);
  for (auto& f : faults) f.device_count = 2;
  FakeRanks fakes(faults);
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = Options(env, 1, absl::Seconds(10));
        auto comm = fakes.Create(env.rank, o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        FakeNcclApi& fake = fakes.api(env.rank);
        cuda::CudaStream other = nullptr;
        ASSERT_EQ(fake.SetDevice(1), cuda::kCudaSuccess);
        ASSERT_EQ(fake.StreamCreateNonBlocking(&other), cuda::kCudaSuccess);
        ASSERT_EQ(fake.SetDevice(0), cuda::kCudaSuccess);
        std::vector<float> buf(8, 1.0f);
        absl::Status s =
            (*comm)
                ->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0), other})
                .Wait(absl::Seconds(5));
        EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
        EXPECT_THAT(s.message(), HasSubstr("output view's stream belongs to cuda:1"));
        // The refusal took no sequence number: the next op still runs on every rank.
        Work ok =
            (*comm)->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)});
        ASSERT_TRUE(ok.Synchronize(absl::Seconds(10)).ok());
        EXPECT_EQ(buf[0], static_cast<float>(kWorld));
      },
      absl::Seconds(60));
}

}  // namespace
}  // namespace adaptcomm

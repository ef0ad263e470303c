// Device timing of the NCCL backend's stream-ordered ops (lib/nccl/device_timing.h) on the fake
// CUDA runtime and NCCL: the time is read once the device finished the op, from timing events
// nothing waits for, with queries that never block; one op in `every` is timed, the same seqs on
// every rank; nothing is timed under capture; an aborted op leaves no event behind; and the
// communicator's metrics count the device time as the op's execution time.
#include <stdlib.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/nccl/device_timing.h"
#include "lib/nccl/nccl_backend.h"
#include "lib/trace/metrics.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"
#include "tests/metric_sample.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;

constexpr int kWorld = 2;

// kWorld NCCL backends on fakes of one world, each timing one op in `every`.
struct Ranks {
  std::vector<std::shared_ptr<FakeNcclApi>> apis;
  std::vector<std::unique_ptr<Backend>> backends;
};
Ranks Create(int every, const FakeNcclFaults& faults = {}) {
  Ranks r;
  auto world = testing::MakeFakeNcclWorld();
  auto store = CreateHashStore();
  r.backends.resize(kWorld);
  for (int i = 0; i < kWorld; ++i) r.apis.push_back(std::make_shared<FakeNcclApi>(world, faults));
  std::vector<std::thread> threads;
  for (int i = 0; i < kWorld; ++i) {
    threads.emplace_back([&, i] {
      nccl::NcclBackendOptions o;
      o.rank = i;
      o.size = kWorld;
      o.store = store;
      o.init_timeout = absl::Seconds(10);
      o.abort_timeout = absl::Milliseconds(500);
      o.device_timing_every = every;
      auto b = nccl::CreateNcclBackend(r.apis[i], r.apis[i], o);
      EXPECT_TRUE(b.ok()) << b.status();
      if (b.ok()) r.backends[i] = *std::move(b);
    });
  }
  for (auto& t : threads) t.join();
  return r;
}

OpDesc DeviceAllreduce(std::vector<float>& buf, uint64_t seq) {
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.input = op.output = TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0), nullptr};
  op.seq = seq;
  op.timeout = absl::Seconds(10);
  return op;
}

// Issues and launches `op` on `b` as the executor does (MarkIssue, then Launch).
absl::StatusOr<std::shared_ptr<DeviceCompletion>> IssueAndLaunch(Backend& b, OpDesc op) {
  StreamOrdered* ordered = b.stream_ordered();
  if (ordered == nullptr) return absl::InternalError("not stream-ordered");
  absl::StatusOr<std::shared_ptr<const StreamPosition>> at = ordered->MarkIssue(op);
  if (!at.ok()) return at.status();
  op.issued_at = *std::move(at);
  return ordered->Launch(op);
}

// Issues and launches an allreduce of bufs[i] (seq 1) on every rank i, from this thread (the fake
// starts a collective once every rank launched it); each rank's completion, or none on a failure.
std::vector<std::shared_ptr<DeviceCompletion>> LaunchOnEveryRank(
    Ranks& r, std::vector<std::vector<float>>& bufs) {
  std::vector<std::shared_ptr<DeviceCompletion>> completions;
  for (int i = 0; i < kWorld; ++i) {
    auto c = IssueAndLaunch(*r.backends[i], DeviceAllreduce(bufs[i], 1));
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    completions.push_back(*c);
  }
  return completions;
}

// Polls `c` until the device finished it (or 10 s passed).
bool PollUntilDone(DeviceCompletion& c) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    absl::StatusOr<bool> done = c.Poll();
    if (!done.ok()) return false;
    if (*done) return true;
    absl::SleepFor(absl::Microseconds(200));
  }
  return false;
}

// On every rank at once: launches allreduces seq 1..n (each polled to the end before the next)
// and returns each op's DeviceTime (rank 0's).
std::vector<std::optional<absl::Duration>> RunTimed(Ranks& r, int n) {
  std::vector<std::optional<absl::Duration>> times(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < kWorld; ++i) {
    threads.emplace_back([&, i] {
      std::vector<float> buf(8, 1.0f);
      for (int seq = 1; seq <= n; ++seq) {
        auto c = IssueAndLaunch(*r.backends[i], DeviceAllreduce(buf, static_cast<uint64_t>(seq)));
        ASSERT_TRUE(c.ok()) << c.status();
        ASSERT_TRUE(PollUntilDone(**c)) << "seq " << seq;
        if (i == 0) times[static_cast<size_t>(seq - 1)] = (*c)->DeviceTime();
      }
    });
  }
  for (auto& t : threads) t.join();
  return times;
}

int CallsNamed(const std::vector<testing::FakeCall>& calls, const std::string& name) {
  int n = 0;
  for (const testing::FakeCall& c : calls) n += c.name == name ? 1 : 0;
  return n;
}

// A sampled op's time is there once the device finished it, not before: while the device holds
// the op, asking reads nothing (and never asks cudaEventElapsedTime about events not complete).
// The timing events are recorded on the communicator's stream around the NCCL call, and no
// stream waits for them.
TEST(DeviceTiming, TimeIsReadOnceTheDeviceFinishedTheOp) {
  FakeNcclFaults faults;
  faults.event_elapsed_ms = 1.5f;
  Ranks r = Create(/*every=*/1, faults);
  for (auto& api : r.apis) {
    api->HoldStreams(true);
    api->ClearCalls();
  }
  std::vector<std::vector<float>> bufs(kWorld, std::vector<float>(8, 1.0f));
  std::vector<std::shared_ptr<DeviceCompletion>> completions = LaunchOnEveryRank(r, bufs);
  ASSERT_EQ(completions.size(), static_cast<size_t>(kWorld));
  for (int i = 0; i < kWorld; ++i) {
    absl::StatusOr<bool> done = completions[i]->Poll();
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_FALSE(*done) << "the held device ran the op";
    EXPECT_EQ(completions[i]->DeviceTime(), std::nullopt);
    EXPECT_EQ(r.apis[i]->elapsed_calls(), 0) << "elapsed time asked before the events completed";
  }
  for (auto& api : r.apis) api->HoldStreams(false);
  std::vector<std::thread> pollers;
  for (int i = 0; i < kWorld; ++i) {
    pollers.emplace_back([&, i] { EXPECT_TRUE(PollUntilDone(*completions[i])); });
  }
  for (auto& t : pollers) t.join();
  for (int i = 0; i < kWorld; ++i) {
    EXPECT_EQ(completions[i]->DeviceTime(), absl::Microseconds(1500)) << "rank " << i;
    EXPECT_EQ(bufs[i][0], 2.0f);
    FakeNcclApi& api = *r.apis[i];
    EXPECT_EQ(api.timing_events_created(), 2);
    EXPECT_EQ(api.elapsed_not_ready(), 0);
    // On the communicator's stream: the issue wait, the start event, the allreduce, the end
    // event, the done event; nothing waits on a timing event.
    const std::vector<testing::FakeCall> calls = api.calls();
    std::vector<std::string> launch;
    void* comm_stream = nullptr;
    for (const testing::FakeCall& c : calls) {
      if (c.name == "AllReduce") comm_stream = c.stream;
    }
    ASSERT_NE(comm_stream, nullptr);
    std::vector<void*> recorded;
    for (const testing::FakeCall& c : calls) {
      if (c.stream != comm_stream) continue;
      launch.push_back(c.name);
      if (c.name == "EventRecord") recorded.push_back(c.event);
    }
    EXPECT_THAT(launch, ::testing::ElementsAre("StreamWaitEvent", "EventRecord", "AllReduce",
                                               "EventRecord", "EventRecord"));
    ASSERT_EQ(recorded.size(), 3u);
    for (const testing::FakeCall& c : calls) {
      if (c.name == "StreamWaitEvent") {
        EXPECT_NE(c.event, recorded[0]) << "a stream waits on the start timing event";
        EXPECT_NE(c.event, recorded[1]) << "a stream waits on the end timing event";
      }
    }
  }
}

// One op in `every` is timed, chosen by its seq alone: the same ops on every rank (both ranks'
// choices are DeviceTimingSampled's), about 1/every of them, none with 0.
TEST(DeviceTiming, SamplingRateIsHonoured) {
  constexpr int kOps = 96;
  Ranks sampled = Create(/*every=*/4);
  const std::vector<std::optional<absl::Duration>> times = RunTimed(sampled, kOps);
  int timed = 0;
  for (int seq = 1; seq <= kOps; ++seq) {
    const bool want = nccl::DeviceTimingSampled(static_cast<uint64_t>(seq), 4);
    EXPECT_EQ(times[static_cast<size_t>(seq - 1)].has_value(), want) << "seq " << seq;
    timed += want;
  }
  EXPECT_GE(timed, kOps / 4 / 2);
  EXPECT_LE(timed, kOps / 4 * 2);
  // The pool recycles timing events: a couple of them serve every timed op.
  EXPECT_LE(sampled.apis[0]->timing_events_created(), 4);
  EXPECT_EQ(sampled.apis[0]->elapsed_calls(), timed);
  EXPECT_EQ(sampled.apis[1]->elapsed_calls(), 0);  // only rank 0 asked (RunTimed)

  Ranks off = Create(/*every=*/0);
  for (const std::optional<absl::Duration>& t : RunTimed(off, 8)) EXPECT_EQ(t, std::nullopt);
  EXPECT_EQ(off.apis[0]->timing_events_created(), 0);
  EXPECT_EQ(CallsNamed(off.apis[0]->calls(), "EventElapsedTime"), 0);

  Ranks all = Create(/*every=*/1);
  for (const std::optional<absl::Duration>& t : RunTimed(all, 8)) EXPECT_TRUE(t.has_value());

  // The choice spreads over residues: no trainer period of 16 samples one bucket only.
  int hits[16] = {};
  for (uint64_t seq = 1; seq <= 16 * 256; ++seq)
    hits[seq % 16] += nccl::DeviceTimingSampled(seq, 16);
  for (int h : hits) {
    EXPECT_GT(h, 4);
    EXPECT_LT(h, 40);
  }
}

// A runtime without timing events runs every op untimed (asked once), never failing an op.
TEST(DeviceTiming, RuntimeWithoutTimingEventsRunsOpsUntimed) {
  FakeNcclFaults faults;
  faults.timing_events_unsupported = true;
  Ranks r = Create(/*every=*/1, faults);
  for (const std::optional<absl::Duration>& t : RunTimed(r, 4)) EXPECT_EQ(t, std::nullopt);
  EXPECT_EQ(r.apis[0]->elapsed_calls(), 0);
}

// Under CUDA graph capture (the caller's stream capturing): the op is refused at issue, and no
// timing event is created or recorded (one recorded into the graph could never be read).
TEST(DeviceTiming, NoTimingUnderCapture) {
  Ranks r = Create(/*every=*/1);
  FakeNcclApi& fake = *r.apis[0];
  cuda::CudaStream graph = nullptr;
  ASSERT_EQ(fake.StreamCreateNonBlocking(&graph), cuda::kCudaSuccess);
  fake.ClearCalls();
  std::vector<float> buf(8, 1.0f);
  OpDesc op = DeviceAllreduce(buf, 1);
  op.input.stream = op.output.stream = graph;
  fake.BeginCapture(graph);
  auto c = IssueAndLaunch(*r.backends[0], op);
  EXPECT_TRUE(absl::IsFailedPrecondition(c.status())) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("is capturing a CUDA graph"));
  EXPECT_EQ(fake.timing_events_created(), 0);
  EXPECT_EQ(CallsNamed(fake.calls(), "EventRecord"), 0);
  EXPECT_EQ(fake.EndCapture(graph), cuda::kCudaSuccess);
  EXPECT_TRUE(r.backends[0]->health().ok());
}

// An op aborted while the device runs it: it fails, its time is never read, and once the backend
// and the op's completion are gone every event (timing ones included) was destroyed.
TEST(DeviceTiming, AbortedOpLeavesNoEventBehind) {
  FakeNcclFaults hang;
  hang.hang_at_launch = 1;  // the first op never completes
  Ranks r = Create(/*every=*/1, hang);
  std::vector<std::vector<float>> bufs(kWorld, std::vector<float>(8, 1.0f));
  std::vector<std::shared_ptr<DeviceCompletion>> completions = LaunchOnEveryRank(r, bufs);
  ASSERT_EQ(completions.size(), static_cast<size_t>(kWorld));
  for (int i = 0; i < kWorld; ++i) {
    EXPECT_EQ(r.apis[i]->timing_events_created(), 2) << "the op was not timed: test is moot";
    absl::StatusOr<bool> done = completions[i]->Poll();
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_FALSE(*done) << "the hung op finished";
    r.backends[i]->Abort(absl::CancelledError("test aborts the hung op"));
    done = completions[i]->Poll();
    EXPECT_FALSE(done.ok()) << "an aborted op passed as done";
    EXPECT_EQ(r.apis[i]->elapsed_calls(), 0);
  }
  for (int i = 0; i < kWorld; ++i) {
    EXPECT_GT(r.apis[i]->events_alive(), 0);
    completions[i] = nullptr;
    r.backends[i] = nullptr;
    EXPECT_EQ(r.apis[i]->events_alive(), 0) << "rank " << i << ": events left behind";
  }
}

constexpr auto Sample = testing::MetricSample;

// End to end through the communicator and its watchdog: with the profile's
// metrics.device_timing_every at 1 every device allreduce is timed on the device, and the
// execution-time histogram holds the device's times (the fake's 2 s each, which no host time of
// this test comes near); the watchdog read them without any blocking synchronize.
TEST(DeviceTiming, MetricsCountTheDeviceTime) {
  constexpr int kOps = 5;
  char dir[] = "/tmp/adaptcomm_device_timing_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string profile = absl::StrCat(dir, "/profile.yaml");
  std::ofstream(profile) << "schema: 1\ndefaults:\n  metrics:\n    device_timing_every: 1\n"
                         << "tiers:\n  - name: test\n    params: any\n";
  FakeNcclFaults faults;
  faults.event_elapsed_ms = 2000.0f;
  auto world = testing::MakeFakeNcclWorld();
  std::vector<std::shared_ptr<FakeNcclApi>> apis;
  for (int r = 0; r < kWorld; ++r) apis.push_back(std::make_shared<FakeNcclApi>(world, faults));
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.name = "device_timed";
        o.backend = BackendChoice::kAuto;
        if (!profile.empty()) o.profile_file = profile;
        o.timeout = absl::Seconds(30);
        auto comm = internal::CreateCommunicatorWith(
            o, testing::FakeSeams(apis[static_cast<size_t>(env.rank)]));
        ASSERT_TRUE(comm.ok()) << comm.status();
        ASSERT_STREQ((*comm)->backend_name(), "nccl");
        FakeNcclApi& fake = *apis[static_cast<size_t>(env.rank)];
        fake.ClearCalls();
        std::vector<float> buf(16, 1.0f);
        const TensorView view{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)};
        Work last;
        for (int i = 0; i < kOps; ++i) {
          last = (*comm)->Allreduce(view);
          ASSERT_TRUE(last.Wait(absl::Seconds(10)).ok());
        }
        const std::vector<std::string> series = {"comm_name=\"device_timed\"",
                                                 absl::StrCat("rank=\"", env.rank, "\""),
                                                 "collective=\"allreduce\"", "backend=\"nccl\""};
        // The watchdog ends the ops (and tells the metrics) as it finds them done.
        const absl::Time deadline = absl::Now() + absl::Seconds(10);
        std::string text;
        while (absl::Now() < deadline) {
          text = trace::RenderMetrics(false);
          if (Sample(text, "adaptcomm_ops_total", series) == kOps) break;
          absl::SleepFor(absl::Milliseconds(5));
        }
        ASSERT_EQ(Sample(text, "adaptcomm_ops_total", series), kOps) << text;
        EXPECT_EQ(Sample(text, "adaptcomm_collective_exec_time_microseconds_sum", series),
                  kOps * 2000000.0);
        std::vector<std::string> le_1s = series, le_2s = series;
        le_1s.push_back("le=\"1000000\"");
        le_2s.push_back("le=\"2000000\"");
        EXPECT_EQ(Sample(text, "adaptcomm_collective_exec_time_microseconds_bucket", le_1s), 0);
        EXPECT_EQ(Sample(text, "adaptcomm_collective_exec_time_microseconds_bucket", le_2s), kOps);
        EXPECT_EQ(fake.elapsed_calls(), kOps);
        EXPECT_EQ(fake.elapsed_not_ready(), 0);
        EXPECT_EQ(CallsNamed(fake.calls(), "StreamSynchronize"), 0)
            << "a blocking synchronize on the op path";
        EXPECT_EQ(buf[0], 32.0f);  // five allreduces in place over two ranks: 1 * 2^5
      },
      absl::Seconds(60));
}

}  // namespace
}  // namespace adaptcomm

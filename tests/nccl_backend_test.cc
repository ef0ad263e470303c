// The NCCL backend's logic on the fault-injecting fake: collectives across thread ranks, bad
// input, asynchronous errors, timeouts, aborts (also hanging ones), config translation, shutdown.
#include "lib/nccl/nccl_backend.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "adaptcomm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/backend_conformance.h"
#include "tests/fake_nccl_api.h"

namespace adaptcomm {
namespace {

using testing::BackendConformanceTest;
using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;

struct Ranks {
  std::vector<std::shared_ptr<FakeNcclApi>> apis;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<absl::Status> init;
};

// Creates `n` NCCL backends on fakes of one world, concurrently (init is collective).
Ranks Create(int n, const std::function<void(int, FakeNcclFaults&)>& faults = nullptr,
             absl::Duration init_timeout = absl::Seconds(10),
             const nccl::NcclCommConfig& config = {}) {
  Ranks r;
  auto world = testing::MakeFakeNcclWorld();
  auto store = CreateHashStore();
  r.backends.resize(n);
  r.init.resize(n);
  for (int i = 0; i < n; ++i) {
    FakeNcclFaults f;
    if (faults) faults(i, f);
    r.apis.push_back(std::make_shared<FakeNcclApi>(world, f));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      nccl::NcclBackendOptions o;
      o.rank = i;
      o.size = n;
      o.store = store;
      o.init_timeout = init_timeout;
      o.config = config;
      o.abort_timeout = absl::Milliseconds(500);
      auto b = nccl::CreateNcclBackend(r.apis[i], r.apis[i], o);
      r.init[i] = b.status();
      if (b.ok()) r.backends[i] = std::move(*b);
    });
  }
  for (auto& t : threads) t.join();
  return r;
}

// Runs ops[i] on rank i's backend concurrently; returns each status.
std::vector<absl::Status> RunAll(Ranks& r, const std::vector<OpDesc>& ops) {
  std::vector<absl::Status> out(ops.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ops.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = r.backends[i]->Run(ops[i]); });
  }
  for (auto& t : threads) t.join();
  return out;
}

TensorView Dev(void* data, size_t count, DType t = DType::kF32) {
  return TensorView{data, count, t, Device::Cuda(0), nullptr};
}

OpDesc Op(OpKind kind, TensorView in, TensorView out, ReduceOp reduce = ReduceOp::kSum) {
  OpDesc d;
  d.kind = kind;
  d.input = in;
  d.output = out;
  d.reduce = reduce;
  d.timeout = absl::Seconds(10);
  return d;
}

// The conformance suite (tests/backend_conformance.h) on fake devices: every op x dtype x reduce
// op, bad input, refusal once aborted.
testing::RankBackendFactory FakeRanks(FakeNcclFaults faults) {
  auto world = testing::MakeFakeNcclWorld();
  return [world, faults](int rank, int size,
                         std::shared_ptr<Store> store) -> std::unique_ptr<Backend> {
    auto api = std::make_shared<FakeNcclApi>(world, faults);
    nccl::NcclBackendOptions o;
    o.rank = rank;
    o.size = size;
    o.store = std::move(store);
    o.init_timeout = absl::Seconds(10);
    o.abort_timeout = absl::Milliseconds(500);
    absl::StatusOr<std::unique_ptr<Backend>> b = nccl::CreateNcclBackend(api, api, o);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : nullptr;
  };
}

// `native`: NCCL 2.28's ncclAlltoAll, else alltoall as grouped sends and receives.
testing::ConformanceTarget FakeTarget(std::string name, int world, bool native = false) {
  FakeNcclFaults faults;
  faults.has_alltoall = native;
  // The fake computes element by element on the CPU: large blocks would test it, not the backend.
  return testing::ConformanceTarget{.name = std::move(name),
                                    .world = world,
                                    .device = Device::Cuda(0),
                                    .prepare = [faults] { return FakeRanks(faults); },
                                    .large_bytes = 0};
}

INSTANTIATE_TEST_SUITE_P(FakeNccl, BackendConformanceTest,
                         ::testing::Values(FakeTarget("threads2", 2), FakeTarget("threads3", 3),
                                           FakeTarget("threads3_native_alltoall", 3, true)),
                         testing::ConformanceTargetName);

// What the conformance suite cannot see: NCCL reduces avg, bf16 and f16 itself.
TEST(NcclBackend, NativeAvgAndHalfTypesReachNccl) {
  constexpr int kN = 3;
  Ranks r = Create(kN);
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(r.init[i].ok()) << r.init[i];
  EXPECT_STREQ(r.backends[0]->name(), "nccl");
  EXPECT_TRUE(r.backends[0]->capabilities().device_memory);
  EXPECT_TRUE(r.backends[0]->capabilities().native_avg);

  std::vector<std::vector<float>> data(kN, std::vector<float>(3, 1.0f));
  std::vector<OpDesc> ops;
  for (int i = 0; i < kN; ++i) {
    ops.push_back(
        Op(OpKind::kAllreduce, Dev(data[i].data(), 3), Dev(data[i].data(), 3), ReduceOp::kAvg));
  }
  for (const auto& s : RunAll(r, ops)) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(r.apis[0]->ops_seen().back(), nccl::NcclRedOp::kAvg);

  for (DType t : {DType::kBF16, DType::kF16}) {
    std::vector<std::vector<uint16_t>> half(kN, std::vector<uint16_t>(2, 0));
    ops.clear();
    for (int i = 0; i < kN; ++i) {
      ops.push_back(Op(OpKind::kAllreduce, Dev(half[i].data(), 2, t), Dev(half[i].data(), 2, t)));
    }
    for (const auto& s : RunAll(r, ops)) EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(r.apis[1]->dtypes_seen().back(),
              t == DType::kBF16 ? nccl::NcclDataType::kBfloat16 : nccl::NcclDataType::kFloat16);
  }
}

TEST(NcclBackend, SendRecvPairsOnly) {
  Ranks r = Create(3);
  for (const auto& s : r.init) ASSERT_TRUE(s.ok()) << s;
  std::vector<int8_t> src = {1, 2, 3}, dst = {0, 0, 0};
  OpDesc send = Op(OpKind::kSend, Dev(src.data(), 3, DType::kI8), TensorView{});
  send.peer = 2;
  OpDesc recv = Op(OpKind::kRecv, TensorView{}, Dev(dst.data(), 3, DType::kI8));
  recv.peer = 0;
  absl::Status s0, s2;
  std::thread t0([&] { s0 = r.backends[0]->Run(send); });
  std::thread t2([&] { s2 = r.backends[2]->Run(recv); });
  t0.join();
  t2.join();
  EXPECT_TRUE(s0.ok()) << s0;
  EXPECT_TRUE(s2.ok()) << s2;
  EXPECT_EQ(dst, src);
}

TEST(NcclBackend, BadInputIsInvalidArgumentNamingTheView) {
  Ranks r = Create(1);
  ASSERT_TRUE(r.init[0].ok()) << r.init[0];
  std::vector<float> x(4, 1.0f);
  // A host view.
  absl::Status s =
      r.backends[0]->Supports(Op(OpKind::kAllreduce, HostView(x.data(), 4), HostView(x.data(), 4)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("view output of allreduce is a host (cpu) buffer"));
  // Host memory tagged as device memory.
  r.apis[0]->MarkHost(x.data(), x.size() * sizeof(float));
  s = r.backends[0]->Run(Op(OpKind::kAllgather, Dev(x.data(), 1), Dev(x.data(), 1)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("view input of allgather is tagged cuda:0 but its pointer "
                                     "is host memory"));
  // A device that does not exist.
  std::vector<float> y(4);
  TensorView v = Dev(y.data(), 4);
  v.device = Device::Cuda(7);
  s = r.backends[0]->Supports(Op(OpKind::kAllreduce, v, v));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cuda:7, which does not exist (1 CUDA device(s) visible)"));
  // Integer average.
  s = r.backends[0]->Supports(Op(OpKind::kAllreduce, Dev(y.data(), 4, DType::kI32),
                                 Dev(y.data(), 4, DType::kI32), ReduceOp::kAvg));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // Invalid input does not break the backend.
  EXPECT_TRUE(r.backends[0]->health().ok());
  EXPECT_EQ(r.apis[0]->abort_calls(), 0);
}

TEST(NcclBackend, PointerIsAskedAboutOncePerBufferAndANewHostBufferIsStillRefused) {
  Ranks r = Create(1);
  ASSERT_TRUE(r.init[0].ok()) << r.init[0];
  FakeNcclApi& api = *r.apis[0];
  std::vector<float> device(4, 1.0f), host(4, 1.0f);
  api.MarkHost(host.data(), host.size() * sizeof(float));
  const OpDesc on_device = Op(OpKind::kAllreduce, Dev(device.data(), 4), Dev(device.data(), 4));
  const int before = api.pointer_queries();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(r.backends[0]->Supports(on_device).ok());
  EXPECT_EQ(api.pointer_queries(), before + 1) << "a training loop's buffer is asked about once";
  absl::Status s =
      r.backends[0]->Supports(Op(OpKind::kAllreduce, Dev(host.data(), 4), Dev(host.data(), 4)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is tagged cuda:0 but its pointer is host memory"));
  // Refused buffers are not remembered: asked about again, refused again.
  s = r.backends[0]->Supports(Op(OpKind::kAllreduce, Dev(host.data(), 4), Dev(host.data(), 4)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(api.pointer_queries(), before + 3);
  EXPECT_TRUE(r.backends[0]->Supports(on_device).ok());
  EXPECT_EQ(api.pointer_queries(), before + 3);
}

TEST(NcclBackend, AsyncErrorMidCollectiveFailsWithMappedStatusAndAborts) {
  Ranks r = Create(1, [](int, FakeNcclFaults& f) { f.async_error_at_launch = 2; });
  ASSERT_TRUE(r.init[0].ok()) << r.init[0];
  std::vector<float> x = {1, 2};
  EXPECT_TRUE(r.backends[0]->Run(Op(OpKind::kAllreduce, Dev(x.data(), 2), Dev(x.data(), 2))).ok());
  const absl::Time start = absl::Now();
  absl::Status s = r.backends[0]->Run(Op(OpKind::kAllreduce, Dev(x.data(), 2), Dev(x.data(), 2)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("ncclRemoteError"));
  EXPECT_THAT(s.message(), HasSubstr("peer connection lost"));  // ncclGetLastError's text
  EXPECT_EQ(r.apis[0]->abort_calls(), 1);
  EXPECT_EQ(r.backends[0]->health().code(), absl::StatusCode::kUnavailable);
  // Broken: later ops fail fast without touching NCCL.
  absl::Status later =
      r.backends[0]->Run(Op(OpKind::kAllreduce, Dev(x.data(), 2), Dev(x.data(), 2)));
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition);
  r.backends[0].reset();
  EXPECT_EQ(r.apis[0]->abort_calls(), 1);     // not aborted twice
  EXPECT_EQ(r.apis[0]->finalize_calls(), 0);  // an aborted communicator is not finalized
}

TEST(NcclBackend, OpTimeoutAbortsAndHangingAbortIsBounded) {
  Ranks r = Create(1, [](int, FakeNcclFaults& f) {
    f.hang_at_launch = 1;
    f.abort_hangs_for = absl::Seconds(3);
  });
  ASSERT_TRUE(r.init[0].ok()) << r.init[0];
  std::vector<float> x = {1};
  OpDesc d = Op(OpKind::kAllreduce, Dev(x.data(), 1), Dev(x.data(), 1));
  d.timeout = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  absl::Status s = r.backends[0]->Run(d);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("did not complete within 200ms"));
  // 200 ms op timeout + 500 ms abort bound, not the 3 s the abort hangs.
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Milliseconds(2000));
  EXPECT_EQ(r.apis[0]->abort_calls(), 1);
}

TEST(NcclBackend, AbortFromAnotherThreadStopsARunningOp) {
  Ranks r = Create(1, [](int, FakeNcclFaults& f) { f.hang_at_launch = 1; });
  ASSERT_TRUE(r.init[0].ok()) << r.init[0];
  std::vector<float> x = {1};
  absl::Status s;
  absl::Time start = absl::Now();
  std::thread runner(
      [&] { s = r.backends[0]->Run(Op(OpKind::kAllreduce, Dev(x.data(), 1), Dev(x.data(), 1))); });
  absl::SleepFor(absl::Milliseconds(100));
  r.backends[0]->Abort(absl::CancelledError("watchdog"));
  runner.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_THAT(s.message(), HasSubstr("watchdog"));
  EXPECT_EQ(r.apis[0]->abort_calls(), 1);
  r.backends[0]->Abort(absl::CancelledError("again"));  // idempotent
  EXPECT_EQ(r.apis[0]->abort_calls(), 1);
}

TEST(NcclBackend, InitFailureAndInitTimeoutAbortTheCommunicator) {
  Ranks failed = Create(1, [](int, FakeNcclFaults& f) { f.init_fails = true; });
  EXPECT_EQ(failed.init[0].code(), absl::StatusCode::kUnavailable) << failed.init[0];
  EXPECT_THAT(failed.init[0].message(), HasSubstr("ncclSystemError"));
  EXPECT_EQ(failed.apis[0]->abort_calls(), 1);

  const absl::Time start = absl::Now();
  Ranks hung = Create(
      2, [](int i, FakeNcclFaults& f) { f.init_never_finishes = i == 1; }, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(hung.init[i].code(), absl::StatusCode::kDeadlineExceeded) << hung.init[i];
    EXPECT_THAT(hung.init[i].message(), HasSubstr("ncclCommAbort called"));
    EXPECT_EQ(hung.apis[i]->abort_calls(), 1) << "rank " << i;
  }

  Ranks refused = Create(1, [](int, FakeNcclFaults& f) { f.init_invalid_usage = true; });
  EXPECT_EQ(refused.init[0].code(), absl::StatusCode::kInvalidArgument) << refused.init[0];
  EXPECT_THAT(refused.init[0].message(), HasSubstr("invalid config (injected)"));
}

TEST(NcclBackend, ConfigTranslationReachesCommInitRankConfig) {
  config::NcclConfigValues values;
  values.blocking = 1;  // must be overridden: aborts need a nonblocking communicator
  values.min_ctas = 4;
  values.max_ctas = 8;
  values.net_name = "IB";
  values.traffic_class = 106;
  values.comm_name = "trainer";
  std::vector<std::string> notes;
  // NCCL 2.21: no trafficClass (2.26), no commName (2.27).
  nccl::NcclCommConfig c = nccl::TranslateNcclConfig(values, 22105, &notes);
  EXPECT_EQ(c.blocking, 0);
  EXPECT_EQ(c.min_ctas, 4);
  EXPECT_EQ(c.max_ctas, 8);
  EXPECT_EQ(c.net_name, "IB");
  EXPECT_EQ(c.traffic_class, nccl::kUndefInt);
  EXPECT_EQ(c.comm_name, "");
  EXPECT_EQ(c.cga_cluster_size, nccl::kUndefInt);
  EXPECT_THAT(notes, ::testing::Contains(
                         HasSubstr("ncclConfig_t.trafficClass needs NCCL 2.26.0, loaded 2.21.5")));
  EXPECT_THAT(notes, ::testing::Contains(HasSubstr("blocking=1 ignored")));

  nccl::NcclCommConfig full = nccl::TranslateNcclConfig(values, 22809, nullptr);
  EXPECT_EQ(full.traffic_class, 106);
  Ranks r = Create(1, nullptr, absl::Seconds(10), full);
  ASSERT_TRUE(r.init[0].ok()) << r.init[0];
  nccl::NcclCommConfig seen = r.apis[0]->last_config();
  EXPECT_EQ(seen.blocking, 0);
  EXPECT_EQ(seen.min_ctas, 4);
  EXPECT_EQ(seen.max_ctas, 8);
  EXPECT_EQ(seen.net_name, "IB");
  EXPECT_EQ(seen.traffic_class, 106);
  EXPECT_EQ(seen.comm_name, "trainer");
}

TEST(NcclBackend, ShutdownFinalizesAndDestroys) {
  Ranks r = Create(2);
  for (const auto& s : r.init) ASSERT_TRUE(s.ok()) << s;
  r.backends.clear();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(r.apis[i]->finalize_calls(), 1);
    EXPECT_EQ(r.apis[i]->destroy_calls(), 1);
    EXPECT_EQ(r.apis[i]->abort_calls(), 0);
  }
}

TEST(NcclBackend, ResultMappingAndVersions) {
  EXPECT_EQ(nccl::MapNcclResult(nccl::NcclResult::kSystemError, "x", "").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(nccl::MapNcclResult(nccl::NcclResult::kInternalError, "x", "").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(nccl::MapNcclResult(nccl::NcclResult::kUnhandledCudaError, "x", "").code(),
            absl::StatusCode::kUnavailable);
  absl::Status s = nccl::MapNcclResult(nccl::NcclResult::kInvalidArgument, "ncclAllReduce",
                                       "NCCL_MIN_CTAS out of range");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("NCCL_MIN_CTAS out of range"));
  EXPECT_EQ(nccl::NcclVersionString(22809), "2.28.9");
  EXPECT_EQ(nccl::NcclVersionString(2804), "2.8.4");  // the pre-2.9 scheme
  EXPECT_EQ(nccl::NormalizeNcclVersion(2804), 20804);
}

// Fault e: NCCL whose abort never returns. A communicator over it still fails the op within its
// bounds and the process still exits, well before the abort would have returned.
TEST(NcclBackend, HungAbortStillLetsTheProcessExit) {
  const absl::Time start = absl::Now();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    Ranks r = Create(1, [](int, FakeNcclFaults& f) {
      f.hang_at_launch = 1;
      f.abort_hangs_for = absl::Hours(1);
    });
    if (!r.init[0].ok()) _exit(3);
    CommunicatorOptions o;
    o.timeout = absl::Milliseconds(300);
    o.max_retry_attempts = 1;
    auto comm = Communicator::CreateWithBackend(std::move(r.backends[0]), o);
    if (!comm.ok()) _exit(4);
    std::vector<float> x = {1};
    TensorView v{x.data(), 1, DType::kF32, Device::Cuda(0)};
    absl::Status s = (*comm)->Allreduce(v).Synchronize();
    if (!absl::IsDeadlineExceeded(s)) _exit(5);
    comm->reset();  // shutdown with the hung abort still in flight
    std::fflush(nullptr);
    _exit(0);
  }
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && absl::Now() - start < absl::Seconds(30)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "process did not exit within 30 s with a hung ncclCommAbort";
  }
  EXPECT_TRUE(WIFEXITED(status)) << "signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: init, 4: create, 5: op did not time out";
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

}  // namespace
}  // namespace adaptcomm

namespace adaptcomm {
namespace {

// The backend runs ops on the caller's thread too (Work::Wait helps): it must leave that
// thread's current CUDA device as it found it.
TEST(NcclBackend, RunRestoresTheCallersCurrentDevice) {
  constexpr int kN = 2;
  Ranks r = Create(kN, [](int, FakeNcclFaults& f) { f.device_count = 2; });
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(r.init[i].ok()) << r.init[i];
  std::vector<std::vector<float>> data(kN, std::vector<float>(4, 1.0f));
  std::vector<int> after(kN, -1);
  std::vector<absl::Status> status(kN);
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] {
      ASSERT_EQ(r.apis[i]->SetDevice(1), cuda::kCudaSuccess);  // the trainer's own device
      status[i] = r.backends[i]->Run(
          Op(OpKind::kAllreduce, Dev(data[i].data(), 4), Dev(data[i].data(), 4)));
      ASSERT_EQ(r.apis[i]->GetDevice(&after[i]), cuda::kCudaSuccess);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kN; ++i) {
    EXPECT_TRUE(status[i].ok()) << status[i];
    EXPECT_EQ(data[i][0], 2.0f);
    EXPECT_EQ(after[i], 1) << "rank " << i << ": the backend left its own device current";
  }
}

// The end of a stream-ordered op is recorded on the event its position reserved at MarkIssue, once:
// a second launch from the same position (or one of a renumbered op) records on an event of its
// own, so that a Work still polling the first completion is not redirected to the second launch.
// Rank r's element i of an alltoall input: block j (elements j*block..) goes to rank j.
int32_t AlltoallInput(int rank, size_t i, int salt = 0) {
  return static_cast<int32_t>(rank * 100000 + salt * 1000 + static_cast<int>(i));
}

// What rank `rank` holds after an alltoall of `block` elements per rank.
void ExpectAlltoallResult(const std::vector<int32_t>& got, int rank, size_t block, int salt = 0) {
  for (size_t i = 0; i < got.size(); ++i) {
    const int from = static_cast<int>(i / block);
    ASSERT_EQ(got[i], AlltoallInput(from, static_cast<size_t>(rank) * block + i % block, salt))
        << "rank " << rank << " element " << i << " (from rank " << from << ")";
  }
}

// In-place alltoalls in one group (RunGroup): each sends from its own copy of its input (its own
// part of the staging buffer); sharing one part, the second copy would overwrite the first's
// before its sends read it.
TEST(NcclBackend, InPlaceAlltoallsOfOneGroupEachSendFromTheirOwnCopy) {
  constexpr int kN = 3;
  constexpr size_t kBlock = 5;
  Ranks r = Create(kN);
  for (const auto& s : r.init) ASSERT_TRUE(s.ok()) << s;
  std::vector<std::vector<std::vector<int32_t>>> bufs(kN);
  std::vector<absl::Status> out(kN);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kN; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<OpDesc> ops;
      bufs[rank].resize(2, std::vector<int32_t>(kBlock * kN));
      for (int salt = 0; salt < 2; ++salt) {
        std::vector<int32_t>& b = bufs[rank][static_cast<size_t>(salt)];
        for (size_t i = 0; i < b.size(); ++i) b[i] = AlltoallInput(rank, i, salt);
        OpDesc op = Op(OpKind::kAlltoall, Dev(b.data(), b.size(), DType::kI32),
                       Dev(b.data(), b.size(), DType::kI32));
        op.seq = static_cast<uint64_t>(salt + 1);
        ops.push_back(op);
      }
      out[rank] = r.backends[rank]->groups()->RunGroup(ops);
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kN; ++rank) {
    ASSERT_TRUE(out[rank].ok()) << out[rank];
    for (int salt = 0; salt < 2; ++salt) {
      ExpectAlltoallResult(bufs[rank][static_cast<size_t>(salt)], rank, kBlock, salt);
    }
  }
}

// The staging buffer grows to the largest in-place alltoall and is reused: one cudaMalloc for
// the first, none for one as large or smaller, one more for a larger one; every result exact.
// An alltoall with separate buffers is not staged at all.
TEST(NcclBackend, InPlaceAlltoallReusesItsStagingBuffer) {
  constexpr int kN = 2;
  Ranks r = Create(kN);
  for (const auto& s : r.init) ASSERT_TRUE(s.ok()) << s;
  auto run = [&](size_t block, bool in_place) {
    std::vector<std::vector<int32_t>> in(kN), sep(kN);
    std::vector<OpDesc> ops;
    for (int rank = 0; rank < kN; ++rank) {
      in[rank].resize(block * kN);
      sep[rank].resize(block * kN);
      for (size_t i = 0; i < in[rank].size(); ++i) in[rank][i] = AlltoallInput(rank, i);
      std::vector<int32_t>& dst = in_place ? in[rank] : sep[rank];
      ops.push_back(Op(OpKind::kAlltoall, Dev(in[rank].data(), in[rank].size(), DType::kI32),
                       Dev(dst.data(), dst.size(), DType::kI32)));
    }
    for (const auto& s : RunAll(r, ops)) ASSERT_TRUE(s.ok()) << s;
    for (int rank = 0; rank < kN; ++rank) {
      ExpectAlltoallResult(in_place ? in[rank] : sep[rank], rank, block);
    }
  };
  const int base = r.apis[0]->malloc_calls();
  run(64, true);
  EXPECT_EQ(r.apis[0]->malloc_calls(), base + 1);
  run(64, true);
  run(16, true);
  run(256, false);
  EXPECT_EQ(r.apis[0]->malloc_calls(), base + 1) << "staging reallocated for no larger need";
  run(256, true);
  EXPECT_EQ(r.apis[0]->malloc_calls(), base + 2);
  EXPECT_EQ(r.apis[1]->malloc_calls(), base + 2);
}

TEST(NcclBackend, EachLaunchFromAPositionRecordsItsEndOnItsOwnEvent) {
  Ranks r = Create(1);
  ASSERT_TRUE(r.init[0].ok()) << r.init[0];
  FakeNcclApi& api = *r.apis[0];
  StreamOrdered* ordered = r.backends[0]->stream_ordered();
  ASSERT_NE(ordered, nullptr);
  cuda::CudaStream caller = nullptr;
  ASSERT_EQ(api.StreamCreateNonBlocking(&caller), cuda::kCudaSuccess);
  std::vector<float> data = {1.0f, 2.0f};
  TensorView view{data.data(), data.size(), DType::kF32, Device::Cuda(0), caller};
  OpDesc op = Op(OpKind::kAllreduce, view, view);
  op.seq = 7;
  absl::StatusOr<std::shared_ptr<const StreamPosition>> position = ordered->MarkIssue(op);
  ASSERT_TRUE(position.ok()) << position.status();
  op.issued_at = *position;
  OpDesc renumbered = op;
  renumbered.seq = 6;  // as TranslateOp makes it after a shrink

  api.ClearCalls();
  api.HoldStreams(true);
  std::vector<std::shared_ptr<DeviceCompletion>> launched;
  for (const OpDesc* d : {&op, &op, &renumbered}) {
    absl::StatusOr<std::shared_ptr<DeviceCompletion>> c = ordered->Launch(*d);
    ASSERT_TRUE(c.ok()) << c.status();
    launched.push_back(*c);
  }
  std::vector<void*> ends;  // the event recorded after each NCCL call, on the backend's stream
  for (const testing::FakeCall& call : api.calls()) {
    if (call.name == "EventRecord") ends.push_back(call.event);
  }
  ASSERT_EQ(ends.size(), 3u);
  EXPECT_NE(ends[0], ends[1]);
  EXPECT_NE(ends[0], ends[2]);
  EXPECT_NE(ends[1], ends[2]);
  for (const auto& c : launched) {
    absl::StatusOr<bool> done = c->Poll();
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_FALSE(*done) << "the device is held: no op may be done yet";
  }
  api.HoldStreams(false);
  for (const auto& c : launched) ASSERT_TRUE(c->MakeStreamWait(caller).ok());
  ASSERT_EQ(api.StreamSynchronize(caller), cuda::kCudaSuccess);
  for (const auto& c : launched) {
    absl::StatusOr<bool> done = c->Poll();
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_TRUE(*done);
  }
  EXPECT_EQ(data[0], 1.0f);  // one rank: a sum over one rank, three times
  EXPECT_EQ(data[1], 2.0f);
}

}  // namespace
}  // namespace adaptcomm

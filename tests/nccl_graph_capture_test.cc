// CUDA graphs (docs/gpu.md): adaptcomm's device ops cannot be captured. An op issued on a stream
// that is capturing is refused at the call with FailedPrecondition naming it, before anything is
// queued on the stream, and the communicator goes on; a Wait() inside a capture is refused; the
// watchdog's polling of ops issued before a capture does not invalidate it. On the fake CUDA,
// which fails what CUDA forbids during a capture and invalidates the capture as CUDA does
// (tests/fake_nccl_api.h).
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/status.h"
#include "adaptcomm/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/gloo/gloo_backend.h"
#include "lib/nccl/nccl_backend.h"
#include "lib/nccl/staged_backend.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;

constexpr int kWorld = 2;
constexpr size_t kCount = 16;

// One fake per rank, of one fake world (as tests/nccl_stream_order_test.cc builds them).
class FakeRanks {
 public:
  FakeRanks() {
    auto world = testing::MakeFakeNcclWorld();
    for (int r = 0; r < kWorld; ++r) {
      apis_.push_back(std::make_shared<FakeNcclApi>(world, FakeNcclFaults{}));
    }
  }
  FakeNcclApi& api(int rank) { return *apis_[static_cast<size_t>(rank)]; }
  absl::StatusOr<std::unique_ptr<Communicator>> Create(const testing::RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.backend = BackendChoice::kAuto;
    o.max_retry_attempts = 3;  // coordinated retry on: a refusal must not start one
    o.timeout = absl::Seconds(30);
    o.failure_report_window = absl::Seconds(2);
    internal::CommunicatorDeps deps;
    deps.use_given_apis = true;
    deps.cuda = apis_[static_cast<size_t>(env.rank)];
    deps.nccl = apis_[static_cast<size_t>(env.rank)];
    return internal::CreateCommunicatorWith(o, deps);
  }

 private:
  std::vector<std::shared_ptr<FakeNcclApi>> apis_;
};

float Input(int rank, int op, size_t i) {
  return static_cast<float>((rank + 1) * 1000 + op * 32 + static_cast<int>(i));
}

Work IssueAllreduce(Communicator& comm, std::vector<float>& buf, int rank, int op,
                    cuda::CudaStream stream) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = Input(rank, op, i);
  return comm.Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0), stream});
}

void ExpectSum(const std::vector<float>& buf, int rank, int op) {
  for (size_t i = 0; i < buf.size(); ++i) {
    float want = 0;
    for (int r = 0; r < kWorld; ++r) want += Input(r, op, i);
    ASSERT_EQ(buf[i], want) << "rank " << rank << " op " << op << " element " << i;
  }
}

int CallsOn(const std::vector<testing::FakeCall>& calls, cuda::CudaStream stream) {
  int n = 0;
  for (const testing::FakeCall& c : calls) n += c.stream == stream ? 1 : 0;
  return n;
}

// Each rank's context for a test body: its fake, communicator, a stream it captures on and an
// ordinary one.
struct Rank {
  FakeNcclApi* fake = nullptr;
  std::unique_ptr<Communicator> comm;
  cuda::CudaStream graph = nullptr;   // the stream the trainer captures a CUDA graph on
  cuda::CudaStream caller = nullptr;  // never captured
};

template <typename Body>
void RunCaptureRanks(Body body) {
  FakeRanks fakes;
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        Rank rank;
        rank.fake = &fakes.api(env.rank);
        auto comm = fakes.Create(env);
        ASSERT_TRUE(comm.ok()) << comm.status();
        rank.comm = *std::move(comm);
        ASSERT_STREQ(rank.comm->backend_name(), "nccl");
        ASSERT_EQ(rank.fake->StreamCreateNonBlocking(&rank.graph), cuda::kCudaSuccess);
        ASSERT_EQ(rank.fake->StreamCreateNonBlocking(&rank.caller), cuda::kCudaSuccess);
        rank.fake->ClearCalls();
        body(env, rank);
      },
      absl::Seconds(60));
}

// The issue's case: an allreduce issued on a stream that is capturing. Before, the op recorded its
// issue event into the capture, pulled the communicator's stream into it, and the watchdog's query
// of its (captured) end event failed: a device failure that broke the communicator. Now it is
// refused at the call, nothing touches the stream, the capture stays valid, and the next op on an
// ordinary stream gives exact sums.
TEST(GraphCapture, AllreduceOnACapturingStreamIsRefusedAndTheCommunicatorGoesOn) {
  RunCaptureRanks([](const testing::RankEnv& env, Rank& rank) {
    FakeNcclApi& fake = *rank.fake;
    std::vector<float> captured(kCount);
    fake.BeginCapture(rank.graph);
    Work refused = IssueAllreduce(*rank.comm, captured, env.rank, 0, rank.graph);
    const absl::Status s = refused.Wait(absl::Seconds(5));
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_FALSE(IsRetryable(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("nccl allreduce seq 1 (rank " + std::to_string(env.rank)));
    EXPECT_THAT(s.message(), HasSubstr("is capturing a CUDA graph"));
    EXPECT_THAT(s.message(), HasSubstr("issue the op outside the capture"));
    // Whatever the watchdog would do with a captured op, it has had time to (it looks every half
    // second).
    absl::SleepFor(absl::Milliseconds(1200));
    EXPECT_EQ(CallsOn(fake.calls(), rank.graph), 0) << "something was queued on the capture";
    EXPECT_EQ(fake.EndCapture(rank.graph), cuda::kCudaSuccess) << "the capture was invalidated";
    EXPECT_TRUE(rank.comm->health().ok()) << rank.comm->health();
    EXPECT_EQ(captured[0], Input(env.rank, 0, 0)) << "the refused op wrote its buffer";

    std::vector<float> next(kCount);
    Work ok = IssueAllreduce(*rank.comm, next, env.rank, 1, rank.caller);
    ASSERT_TRUE(ok.Wait(absl::Seconds(10)).ok());
    ASSERT_TRUE(ok.Synchronize(absl::Seconds(10)).ok());
    ExpectSum(next, env.rank, 1);
    EXPECT_TRUE(rank.comm->health().ok()) << rank.comm->health();
  });
}

// Ops issued before a capture are still in flight when the trainer's thread begins capturing
// another stream (CUDA's default, global capture mode): the watchdog's event queries must not
// invalidate that capture (CUDA fails an event query from any thread then), nor fail the op.
TEST(GraphCapture, WatchdogPollingDoesNotInvalidateAnotherThreadsCapture) {
  RunCaptureRanks([](const testing::RankEnv& env, Rank& rank) {
    FakeNcclApi& fake = *rank.fake;
    fake.HoldStreams(true);  // the "device" runs nothing: the op stays in flight
    std::vector<float> buf(kCount);
    Work work = IssueAllreduce(*rank.comm, buf, env.rank, 0, rank.caller);
    ASSERT_TRUE(work.Wait(absl::Seconds(10)).ok());
    fake.BeginCapture(rank.graph);
    const int queries_before = fake.event_queries();
    absl::SleepFor(absl::Milliseconds(1500));  // the watchdog looks every half second
    EXPECT_GT(fake.event_queries(), queries_before) << "the watchdog did not poll: test is moot";
    EXPECT_EQ(fake.EndCapture(rank.graph), cuda::kCudaSuccess)
        << "a library thread's call invalidated the trainer's capture";
    fake.HoldStreams(false);
    ASSERT_TRUE(work.Synchronize(absl::Seconds(10)).ok());
    ExpectSum(buf, env.rank, 0);
    EXPECT_TRUE(rank.comm->health().ok()) << rank.comm->health();
  });
}

// An op issued outside a capture and waited for inside one: CUDA refuses a capturing stream's
// wait on an event recorded outside the capture (and invalidates the capture). Wait() says so,
// naming the op, as FailedPrecondition rather than as a transport failure; the op itself is
// unaffected.
TEST(GraphCapture, WaitInsideACaptureIsRefusedNamingTheOp) {
  RunCaptureRanks([](const testing::RankEnv& env, Rank& rank) {
    FakeNcclApi& fake = *rank.fake;
    fake.HoldStreams(true);  // still in flight at Wait() (a finished op's Wait queues nothing)
    std::vector<float> buf(kCount);
    Work work = IssueAllreduce(*rank.comm, buf, env.rank, 0, rank.graph);
    fake.BeginCapture(rank.graph);
    const absl::Status s = work.Wait(absl::Seconds(10));
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("nccl allreduce seq 1"));
    EXPECT_THAT(s.message(), HasSubstr("capturing a CUDA graph"));
    EXPECT_EQ(fake.EndCapture(rank.graph), cuda::kCudaErrorStreamCaptureInvalidated);
    fake.HoldStreams(false);
    ASSERT_TRUE(work.Synchronize(absl::Seconds(10)).ok());
    ExpectSum(buf, env.rank, 0);
    EXPECT_TRUE(rank.comm->health().ok()) << rank.comm->health();
  });
}

// An in-place alltoall stages its input in a buffer it allocates the first time (cudaMalloc, a
// call CUDA forbids from any thread in global mode while a global-mode capture is open): it
// allocates in thread-local mode, so a graph another thread of the trainer captures meanwhile
// stays valid, and the alltoall's result is exact.
TEST(GraphCapture, InPlaceAlltoallDoesNotInvalidateAnotherThreadsCapture) {
  RunCaptureRanks([](const testing::RankEnv& env, Rank& rank) {
    FakeNcclApi& fake = *rank.fake;
    std::thread([&] { fake.BeginCapture(rank.graph); }).join();  // open, on another thread
    constexpr size_t kBlock = 4;
    std::vector<int32_t> buf(kBlock * kWorld);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = env.rank * 100 + static_cast<int32_t>(i);
    const TensorView view{buf.data(), buf.size(), DType::kI32, Device::Cuda(0), rank.caller};
    Work work = rank.comm->Alltoall(view, view);
    ASSERT_TRUE(work.Wait(absl::Seconds(10)).ok());
    ASSERT_TRUE(work.Synchronize(absl::Seconds(10)).ok());
    EXPECT_EQ(fake.EndCapture(rank.graph), cuda::kCudaSuccess)
        << "the staging buffer's allocation invalidated another thread's capture";
    for (size_t i = 0; i < buf.size(); ++i) {
      const int from = static_cast<int>(i / kBlock);
      ASSERT_EQ(buf[i], from * 100 + static_cast<int32_t>(env.rank * kBlock + i % kBlock))
          << "rank " << env.rank << " element " << i;
    }
    EXPECT_TRUE(rank.comm->health().ok()) << rank.comm->health();
  });
}

// On a thread that is itself capturing a graph (on another stream), the first in-place alltoall
// of a size cannot allocate its staging buffer (CUDA refuses the cudaMalloc, and invalidates that
// capture as it does for any forbidden call): FailedPrecondition saying what to do, nothing queued
// on the op's stream, the backend usable; outside the capture the same op runs, and once the
// buffer exists a capturing thread no longer needs an allocation.
TEST(GraphCapture, InPlaceAlltoallCannotAllocateOnACapturingThread) {
  auto world = testing::MakeFakeNcclWorld();
  auto fake = std::make_shared<FakeNcclApi>(world, FakeNcclFaults{});
  nccl::NcclBackendOptions o;
  o.store = CreateHashStore();
  o.init_timeout = absl::Seconds(10);
  o.abort_timeout = absl::Milliseconds(500);
  auto created = nccl::CreateNcclBackend(fake, fake, o);
  ASSERT_TRUE(created.ok()) << created.status();
  Backend& b = **created;
  cuda::CudaStream graph = nullptr, caller = nullptr;
  ASSERT_EQ(fake->StreamCreateNonBlocking(&graph), cuda::kCudaSuccess);
  ASSERT_EQ(fake->StreamCreateNonBlocking(&caller), cuda::kCudaSuccess);
  std::vector<int32_t> buf = {1, 2, 3};
  OpDesc op;
  op.kind = OpKind::kAlltoall;
  op.input = op.output = TensorView{buf.data(), buf.size(), DType::kI32, Device::Cuda(0), caller};
  op.seq = 1;
  op.timeout = absl::Seconds(10);
  fake->ClearCalls();

  fake->BeginCapture(graph, cuda::CaptureMode::kThreadLocal);
  absl::Status s = b.Run(op);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("nccl alltoall seq 1"));
  EXPECT_THAT(s.message(), HasSubstr("while this thread captures a CUDA graph"));
  EXPECT_THAT(s.message(), HasSubstr("before the capture"));
  EXPECT_EQ(CallsOn(fake->calls(), caller), 0) << "queued on the op's stream";
  EXPECT_EQ(fake->EndCapture(graph), cuda::kCudaErrorStreamCaptureInvalidated);
  EXPECT_TRUE(b.health().ok()) << b.health();

  ASSERT_TRUE(b.Run(op).ok());
  EXPECT_EQ(buf, (std::vector<int32_t>{1, 2, 3}));  // one rank: its own blocks back
  fake->BeginCapture(graph, cuda::CaptureMode::kThreadLocal);
  op.seq = 2;
  const int mallocs = fake->malloc_calls();
  // No allocation needed now, but Run itself waits with event queries a capturing thread may not
  // make: issued on the worker instead (stream-ordered), as the executor does.
  StreamOrdered* ordered = b.stream_ordered();
  ASSERT_NE(ordered, nullptr);
  absl::StatusOr<std::shared_ptr<const StreamPosition>> at = ordered->MarkIssue(op);
  ASSERT_TRUE(at.ok()) << at.status();
  op.issued_at = *at;
  absl::StatusOr<std::shared_ptr<DeviceCompletion>> done = ordered->Launch(op);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(fake->malloc_calls(), mallocs);
  EXPECT_EQ(fake->EndCapture(graph), cuda::kCudaSuccess);
  ASSERT_TRUE((*done)->MakeStreamWait(caller).ok());
  ASSERT_EQ(fake->StreamSynchronize(caller), cuda::kCudaSuccess);
  EXPECT_EQ(buf, (std::vector<int32_t>{1, 2, 3}));
}

std::unique_ptr<Backend> Gloo1() {
  GlooBackendOptions o;
  o.store = CreateHashStore();
  o.hostname = "127.0.0.1";
  o.init_timeout = absl::Seconds(10);
  auto b = CreateGlooBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// Gloo over device memory (staging) copies on the caller's stream and waits for the copies with
// an event query, which a capture forbids: refused when the op is checked (Supports, on the
// issuing thread), before any copy; the backend stays usable.
TEST(GraphCapture, StagedDeviceOpOnACapturingStreamIsRefused) {
  auto fake = std::make_shared<FakeNcclApi>(testing::MakeFakeNcclWorld(), FakeNcclFaults{});
  auto staged = nccl::CreateStagedBackend(Gloo1(), fake, {.initial_bytes = 64});
  ASSERT_TRUE(staged.ok()) << staged.status();
  Backend& b = **staged;
  cuda::CudaStream graph = nullptr, caller = nullptr;
  ASSERT_EQ(fake->StreamCreateNonBlocking(&graph), cuda::kCudaSuccess);
  ASSERT_EQ(fake->StreamCreateNonBlocking(&caller), cuda::kCudaSuccess);
  std::vector<float> x(4, 0.5f);
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.input = op.output = TensorView{x.data(), x.size(), DType::kF32, Device::Cuda(0), graph};
  op.seq = 7;
  op.timeout = absl::Seconds(10);

  fake->BeginCapture(graph);
  absl::Status s = b.Supports(op);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("gloo+staged allreduce seq 7 (rank 0)"));
  EXPECT_THAT(s.message(), HasSubstr("is capturing a CUDA graph"));
  s = b.Run(op);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(CallsOn(fake->calls(), graph), 0);
  EXPECT_EQ(fake->EndCapture(graph), cuda::kCudaSuccess);
  EXPECT_TRUE(b.health().ok()) << b.health();

  op.input.stream = op.output.stream = caller;
  ASSERT_TRUE(b.Run(op).ok());
  for (float v : x) EXPECT_FLOAT_EQ(v, 0.5f);
}

}  // namespace
}  // namespace adaptcomm

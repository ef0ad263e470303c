// The execution model (#12): backend code runs only on threads the library owns (except a
// caller's own op when it waits without a bound on a backend that runs on any thread), and
// Work::Wait(d) returns within d whatever the ops ahead of the waited one do.
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "adaptcomm/adaptcomm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/executor/op_executor.h"
#include "lib/core/executor/work_impl.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;

// A one-rank backend that records which thread ran each op; the op with seq `hang_seq` sleeps
// `hang_for` and ignores Abort() (a backend call that does not return when asked).
// `any_thread`: Capabilities::runs_on_any_thread (as shared memory declares).
class ObservedBackend final : public Backend {
 public:
  ObservedBackend(uint64_t hang_seq, absl::Duration hang_for, bool any_thread = false)
      : hang_seq_(hang_seq), hang_for_(hang_for), any_thread_(any_thread) {}
  const char* name() const override { return "observed"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.runs_on_any_thread = any_thread_;
    return caps;
  }
  absl::Status Supports(const OpDesc&) const override { return absl::OkStatus(); }
  absl::Status Run(const OpDesc& op) override {
    {
      absl::MutexLock lock(&mu_);
      threads_.push_back(std::this_thread::get_id());
    }
    if (op.seq == hang_seq_) absl::SleepFor(hang_for_);
    return absl::OkStatus();
  }
  void Abort(const absl::Status&) override {}
  absl::Status health() const override { return absl::OkStatus(); }

  std::vector<std::thread::id> threads() const {
    absl::MutexLock lock(&mu_);
    return threads_;
  }

 private:
  const uint64_t hang_seq_;
  const absl::Duration hang_for_;
  const bool any_thread_;
  mutable absl::Mutex mu_;
  std::vector<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<Communicator> Create(std::unique_ptr<Backend> backend) {
  CommunicatorOptions o;
  o.max_retry_attempts = 1;
  auto comm = Communicator::CreateWithBackend(std::move(backend), o);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

TEST(ExecutionModel, BackendWithThreadStateNeverRunsOnTheCallersThread) {
  auto owned = std::make_unique<ObservedBackend>(0, absl::ZeroDuration());
  ObservedBackend* backend = owned.get();
  auto comm = Create(std::move(owned));
  ASSERT_NE(comm, nullptr);
  float x = 1.0f;
  // Issue-then-wait, the pattern in which a waiting thread used to run the op itself.
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(comm->Allreduce(HostView(&x, 1)).Wait().ok());
  }
  std::vector<std::thread::id> threads = backend->threads();
  ASSERT_EQ(threads.size(), 200u);
  for (size_t i = 0; i < threads.size(); ++i) {
    EXPECT_NE(threads[i], std::this_thread::get_id()) << "op #" << i + 1 << " ran on the caller";
  }
}

TEST(ExecutionModel, WaitReturnsWithinItsBoundBehindAHungOp) {
  constexpr absl::Duration kHang = absl::Seconds(3);
  constexpr absl::Duration kBound = absl::Milliseconds(1500);
  // The same epsilon as README's "Execution model": scheduling of one wake-up.
  constexpr absl::Duration kEpsilon = absl::Milliseconds(100);
  auto comm = Create(std::make_unique<ObservedBackend>(1, kHang));
  ASSERT_NE(comm, nullptr);
  float a = 1, b = 2, c = 3;
  AllreduceOptions quick;
  quick.timeout = absl::Milliseconds(100);  // short enough that a waiter might run them itself
  Work first = comm->Allreduce(HostView(&a, 1), quick);  // hangs for kHang
  Work second = comm->Allreduce(HostView(&b, 1), quick);
  Work third = comm->Allreduce(HostView(&c, 1), quick);
  const absl::Time start = absl::Now();
  absl::Status s = third.Wait(kBound);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("#3 is still pending"));
  EXPECT_GE(took, kBound);
  EXPECT_LT(took, kBound + kEpsilon);
  // The queue goes on once the hung call returns (it returned success, late).
  EXPECT_TRUE(first.Wait(absl::Seconds(10)).ok());
  EXPECT_TRUE(second.Wait(absl::Seconds(10)).ok());
  EXPECT_TRUE(third.Wait(absl::Seconds(10)).ok());
}

// Shared memory's case: the hand-off to the worker and back costs more than the op, so a caller
// that waits without a bound runs its own op when nothing else could run meanwhile.
TEST(ExecutionModel, UnboundedWaiterRunsItsOwnOpWhenTheExecutorIsIdle) {
  auto owned = std::make_unique<ObservedBackend>(0, absl::ZeroDuration(), /*any_thread=*/true);
  ObservedBackend* backend = owned.get();
  auto comm = Create(std::move(owned));
  ASSERT_NE(comm, nullptr);
  // Once a caller has waited for an op right after issuing it, the next ones are left to it (the
  // worker is not woken to race it). The worker still takes one the caller is late for (preempted
  // between issuing and waiting for a tick), after which the two race again for a while. On a
  // loaded machine (the suite runs tests side by side on two cores) preemptions can come often
  // enough in one batch to hand the worker more than a quarter: the best of three batches counts;
  // an executor that never leaves the op to its waiter fails all three.
  constexpr size_t kOps = 200;
  size_t best_on_caller = 0;
  for (int batch = 0; batch < 3 && best_on_caller < 150; ++batch) {
    float x = 1.0f;
    for (size_t i = 0; i < kOps; ++i) {
      ASSERT_TRUE(comm->Allreduce(HostView(&x, 1)).Wait().ok());
    }
    std::vector<std::thread::id> threads = backend->threads();
    ASSERT_EQ(threads.size(), kOps * (batch + 1));
    const size_t on_caller =
        std::count(threads.end() - kOps, threads.end(), std::this_thread::get_id());
    best_on_caller = std::max(best_on_caller, on_caller);
  }
  EXPECT_GE(best_on_caller, 150u);
}

// Issue-then-wait ops until the executor leaves them to their waiter.
void WaitRightAfterIssuing(Communicator& comm, int ops) {
  float x = 1.0f;
  for (int i = 0; i < ops; ++i) ASSERT_TRUE(comm.Allreduce(HostView(&x, 1)).Wait().ok());
}

// An op left to its waiter that nobody waits for (a caller overlapping it with compute) still
// starts, on the worker, within two of its ticks (500 us each), so peers never wait on it for
// longer than that.
TEST(ExecutionModel, HostOpNobodyWaitsForStartsOnTheWorkerWithinTwoTicks) {
  auto owned = std::make_unique<ObservedBackend>(0, absl::ZeroDuration(), /*any_thread=*/true);
  ObservedBackend* backend = owned.get();
  auto comm = Create(std::move(owned));
  ASSERT_NE(comm, nullptr);
  for (int round = 0; round < 5; ++round) {
    WaitRightAfterIssuing(*comm, 20);
    const size_t before = backend->threads().size();
    float x = 1.0f;
    const absl::Time issued = absl::Now();
    Work work = comm->Allreduce(HostView(&x, 1));
    // Not touching `work` (a query or a wait would hand it over): the backend hears of it anyway.
    while (backend->threads().size() == before && absl::Now() < issued + absl::Seconds(5)) {
      absl::SleepFor(absl::Microseconds(100));
    }
    const absl::Duration took = absl::Now() - issued;
    std::vector<std::thread::id> threads = backend->threads();
    ASSERT_EQ(threads.size(), before + 1) << "round " << round;
    EXPECT_NE(threads.back(), std::this_thread::get_id()) << "round " << round;
    // Two ticks plus the scheduling of one wake-up (README's epsilon).
    EXPECT_LT(took, absl::Milliseconds(101)) << "round " << round;
    ASSERT_TRUE(work.Wait().ok());
  }
}

// A caller that issues a second op before waiting for the first, waits with a bound, or polls the
// op's state hands an op left to its waiter to the worker at once. The executor is driven directly
// with a tick of a minute: an op not handed over would start only when that tick expires it, long
// past the bounds below.
TEST(ExecutionModel, OverlapBoundedWaitAndPollingHandTheOpToTheWorker) {
  constexpr absl::Duration kTick = absl::Seconds(60);
  constexpr absl::Duration kBound = absl::Seconds(10);
  auto owned = std::make_unique<ObservedBackend>(0, absl::ZeroDuration(), /*any_thread=*/true);
  ObservedBackend* backend = owned.get();
  internal::ExecutorOptions options;
  options.waiter_tick = kTick;
  auto executor = std::make_shared<internal::OpExecutor>(std::move(owned), options);
  executor->Start();
  float a = 1, b = 2;
  auto allreduce = [&](float* x) {
    OpDesc op;
    op.kind = OpKind::kAllreduce;
    op.input = op.output = HostView(x, 1);
    op.timeout = absl::Seconds(60);
    return executor->Submit(std::move(op));
  };
  auto wait_right_after_issuing = [&] {  // leaves the next op to its waiter
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(allreduce(&a)->Wait(absl::InfiniteDuration()).ok());
  };
  auto last_ran_on_worker = [&](size_t ops) {
    std::vector<std::thread::id> threads = backend->threads();
    for (size_t i = threads.size() - ops; i < threads.size(); ++i) {
      if (threads[i] == std::this_thread::get_id()) return false;
    }
    return true;
  };

  wait_right_after_issuing();
  absl::Time start = absl::Now();
  std::shared_ptr<internal::WorkImpl> first = allreduce(&a);
  std::shared_ptr<internal::WorkImpl> second = allreduce(&b);
  ASSERT_TRUE(second->Wait(kBound).ok());
  ASSERT_TRUE(first->Wait(kBound).ok());
  EXPECT_LT(absl::Now() - start, kBound);
  EXPECT_TRUE(last_ran_on_worker(2)) << "issued two before waiting";

  wait_right_after_issuing();
  start = absl::Now();
  ASSERT_TRUE(allreduce(&a)->Wait(kBound).ok()) << "bounded wait";
  EXPECT_LT(absl::Now() - start, kBound);
  EXPECT_TRUE(last_ran_on_worker(1)) << "bounded wait";

  wait_right_after_issuing();
  std::shared_ptr<internal::WorkImpl> polled = allreduce(&a);
  const absl::Time until = absl::Now() + kBound;
  while (!IsTerminal(polled->PolledState()) && absl::Now() < until) {
    absl::SleepFor(absl::Microseconds(50));
  }
  ASSERT_TRUE(IsTerminal(polled->state())) << "polled";
  EXPECT_TRUE(last_ran_on_worker(1)) << "polled";
  executor->Shutdown();
}

TEST(ExecutionModel, BoundedWaitAndOpsQueuedBehindOthersStayOnTheWorker) {
  constexpr absl::Duration kHang = absl::Milliseconds(300);
  auto owned = std::make_unique<ObservedBackend>(1, kHang, /*any_thread=*/true);
  ObservedBackend* backend = owned.get();
  auto comm = Create(std::move(owned));
  ASSERT_NE(comm, nullptr);
  float a = 1, b = 2;
  Work first = comm->Allreduce(HostView(&a, 1));  // runs kHang on the worker
  Work second = comm->Allreduce(HostView(&b, 1));
  // Pending behind a running op: the waiter only waits (it would otherwise run ops ahead of its
  // own, or hold its thread while another op could start).
  ASSERT_TRUE(second.Wait().ok());
  ASSERT_TRUE(first.Wait().ok());
  for (int i = 0; i < 50; ++i)
    ASSERT_TRUE(comm->Allreduce(HostView(&a, 1)).Wait(absl::Seconds(10)).ok());
  std::vector<std::thread::id> threads = backend->threads();
  ASSERT_EQ(threads.size(), 52u);
  for (size_t i = 0; i < threads.size(); ++i) {
    EXPECT_NE(threads[i], std::this_thread::get_id()) << "op #" << i + 1 << " ran on the caller";
  }
}

}  // namespace
}  // namespace adaptcomm

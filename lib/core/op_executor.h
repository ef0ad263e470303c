// OpExecutor: runs a communicator's operations one at a time, in sequence order, on its Backend.
//
// Two threads may run an op: the executor's worker, or a caller blocked in Work::Wait() that
// "helps" by running the queue head itself when nobody else is running one. Helping saves the two
// thread hand-offs per op that a worker-only design costs (tens of microseconds on a loaded
// 2-core machine, several percent of a 256 KiB allreduce). Ordering is kept because only one
// thread at a time may pop-and-run, and it always pops the head.
//
// A watchdog thread bounds every running op: past its timeout plus a grace period it aborts the
// backend, and past the abort bound it fails the Work itself so no waiter hangs even if the
// backend never returns.
#ifndef ADAPTCOMM_LIB_CORE_OP_EXECUTOR_H_
#define ADAPTCOMM_LIB_CORE_OP_EXECUTOR_H_

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adaptcomm/backend.h"
#include "lib/core/work_impl.h"
#include "lib/trace/op_observer.h"

namespace adaptcomm::internal {

struct ExecutorOptions {
  // How long past an op's own timeout the watchdog waits before aborting the backend (backends
  // honour the timeout themselves; this catches one that does not).
  absl::Duration watchdog_grace = absl::Seconds(1);
  // How long an abort may take before the watchdog fails the Work without the backend.
  absl::Duration abort_bound = absl::Seconds(5);
};

// Decides what a failed op's Work reports: called on the thread that ran the op, without the
// executor's lock, for every failure except InvalidArgument (a caller bug, local to the call).
// It may publish the failure, wait for the other ranks' reports, and enrich the status.
class FailureHandler {
 public:
  virtual ~FailureHandler() = default;
  virtual absl::Status OnOpFailure(const OpDesc& op, absl::Status status) = 0;
};

class OpExecutor : public std::enable_shared_from_this<OpExecutor> {
 public:
  OpExecutor(std::unique_ptr<Backend> backend, ExecutorOptions options);
  ~OpExecutor();
  OpExecutor(const OpExecutor&) = delete;
  OpExecutor& operator=(const OpExecutor&) = delete;

  // Shared: a worker abandoned inside a hung backend may still call them after Shutdown().
  // REQUIRES: called before Start().
  void AddObserver(std::shared_ptr<trace::OpObserver> observer) {
    observers_.push_back(std::move(observer));
  }
  void SetFailureHandler(std::shared_ptr<FailureHandler> handler) {
    failure_handler_ = std::move(handler);
  }
  // Starts the worker and watchdog threads. Call once, right after construction.
  void Start();
  // Queues `desc` (seq assigned here) and returns its work.
  std::shared_ptr<WorkImpl> Submit(OpDesc desc);
  // Runs queue-head ops on the calling thread until `target` is terminal, while nobody else is
  // running one. Returns without waiting if another thread is running an op.
  void HelpUntil(const WorkImpl* target);
  // Fails every queued op with `reason`, aborts the running one. Idempotent.
  void Abort(const absl::Status& reason);
  // Lets queued ops finish (each within its bound), then stops the threads.
  void Shutdown();

  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  uint64_t last_seq() const;

 private:
  void WorkerLoop();
  void WatchdogLoop();
  // Pops the head and runs it. REQUIRES: mu_ held, queue non-empty, !busy_. Releases mu_
  // around the backend call.
  void RunHeadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<Backend> backend_;
  const ExecutorOptions options_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<WorkImpl>> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a thread is inside RunHeadLocked's backend phase
  std::shared_ptr<WorkImpl> running_ ABSL_GUARDED_BY(mu_);  // the op the watchdog bounds
  absl::Time running_since_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<trace::OpObserver>> observers_;  // fixed after Start()
  std::shared_ptr<FailureHandler> failure_handler_;            // fixed after Start()
  std::thread worker_;
  std::thread watchdog_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_OP_EXECUTOR_H_

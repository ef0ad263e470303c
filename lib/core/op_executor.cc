#include "lib/core/op_executor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/log.h"

namespace adaptcomm::internal {

OpExecutor::OpExecutor(std::unique_ptr<Backend> backend, ExecutorOptions options)
    : backend_(std::move(backend)), options_(options) {}

OpExecutor::~OpExecutor() {
  // Shutdown() ran (the worker holds a reference until it ends, so we only get here after it).
  if (watchdog_.joinable()) watchdog_.join();
  if (worker_.joinable()) worker_.detach();
}

void OpExecutor::Start() {
  // The worker keeps the executor (and its backend) alive: if a backend call never returns,
  // Shutdown() abandons the thread, which must still find valid memory should it ever return.
  worker_ = std::thread([self = shared_from_this()] { self->WorkerLoop(); });
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

std::shared_ptr<WorkImpl> OpExecutor::Submit(OpDesc desc) {
  absl::MutexLock lock(&mu_);
  desc.seq = next_seq_++;
  auto work = std::make_shared<WorkImpl>(std::move(desc), weak_from_this());
  if (!aborted_.ok()) {
    work->Finish(absl::Status(aborted_.code(),
                              absl::StrCat("communicator was aborted: ", aborted_.message())));
  } else if (stopping_) {
    work->Finish(absl::FailedPreconditionError("communicator is shutting down"));
  } else {
    for (const auto& o : observers_) o->OnEnqueue(work->desc(), work->enqueue_time());
    queue_.push_back(work);
  }
  return work;
}

uint64_t OpExecutor::last_seq() const {
  absl::MutexLock lock(&mu_);
  return next_seq_ - 1;
}

void OpExecutor::RunHeadLocked() {
  std::shared_ptr<WorkImpl> work = std::move(queue_.front());
  queue_.pop_front();
  if (!work->MarkRunning()) return;  // finished by an abort while queued
  busy_ = true;
  running_ = work;
  const absl::Time started = absl::Now();
  running_since_ = started;
  const OpDesc& desc = work->desc();
  mu_.Unlock();
  for (const auto& o : observers_) o->OnStart(desc, started);
  absl::Status status = backend_->Run(desc);
  if (!status.ok()) {
    ADAPTCOMM_LOG(kDebug, OpKindName(desc.kind), " #", desc.seq, " failed: ", status.ToString());
    if (failure_handler_ != nullptr && !absl::IsInvalidArgument(status)) {
      {
        // The backend returned: the watchdog has nothing left to bound; the handler bounds itself.
        absl::MutexLock lock(&mu_);
        running_ = nullptr;
      }
      status = failure_handler_->OnOpFailure(desc, std::move(status));
    }
  }
  for (const auto& o : observers_) o->OnEnd(desc, status, absl::Now());
  mu_.Lock();
  work->Finish(std::move(status));
  running_ = nullptr;
  busy_ = false;
}

void OpExecutor::HelpUntil(const WorkImpl* target) {
  absl::MutexLock lock(&mu_);
  while (!IsTerminal(target->state()) && !queue_.empty() && !busy_) {
    RunHeadLocked();
  }
}

void OpExecutor::WorkerLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return (!queue_.empty() && !busy_) || (stopping_ && queue_.empty());
    };
    mu_.Await(absl::Condition(&ready));
    if (queue_.empty()) return;  // stopping and drained
    RunHeadLocked();
  }
}

void OpExecutor::WatchdogLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto idle_or_stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return running_ != nullptr || (stopping_ && queue_.empty() && !busy_);
    };
    mu_.Await(absl::Condition(&idle_or_stop));
    if (running_ == nullptr) return;  // stopping, nothing left
    std::shared_ptr<WorkImpl> watched = running_;
    auto moved_on = [this, &watched]()
                        ABSL_SHARED_LOCKS_REQUIRED(mu_) { return running_ != watched; };
    const OpDesc& desc = watched->desc();
    const absl::Time deadline = running_since_ + desc.timeout + options_.watchdog_grace;
    if (mu_.AwaitWithDeadline(absl::Condition(&moved_on), deadline)) continue;

    absl::Status timeout = absl::DeadlineExceededError(
        absl::StrCat(OpKindName(desc.kind), " #", desc.seq, " on rank ", backend_->rank(),
                     " exceeded its timeout of ", absl::FormatDuration(desc.timeout),
                     " (watchdog); aborting the ", backend_->name(), " backend"));
    ADAPTCOMM_LOG(kError, timeout.message());
    mu_.Unlock();
    backend_->Abort(timeout);
    mu_.Lock();
    if (mu_.AwaitWithTimeout(absl::Condition(&moved_on), options_.abort_bound)) continue;

    // The backend ignored the abort: release every waiter anyway so the process can exit.
    absl::Status hung = absl::DeadlineExceededError(
        absl::StrCat(timeout.message(), "; the backend did not return within the abort bound of ",
                     absl::FormatDuration(options_.abort_bound)));
    ADAPTCOMM_LOG(kError, hung.message());
    watched->Finish(hung);
    aborted_ = hung;
    for (auto& queued : queue_) queued->Finish(hung);
    queue_.clear();
    return;  // the worker is stuck inside the backend; Shutdown() will not wait for it
  }
}

void OpExecutor::Abort(const absl::Status& reason) {
  std::deque<std::shared_ptr<WorkImpl>> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = reason.ok() ? absl::AbortedError("aborted") : reason;
    dropped.swap(queue_);
  }
  for (auto& work : dropped) {
    work->Finish(
        absl::AbortedError(absl::StrCat(OpKindName(work->desc().kind), " #", work->desc().seq,
                                        " cancelled: communicator aborted: ", reason.message())));
  }
  backend_->Abort(reason);
}

void OpExecutor::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !worker_.joinable() && !watchdog_.joinable()) return;
    stopping_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  bool stuck;
  {
    absl::MutexLock lock(&mu_);
    stuck = busy_;
  }
  if (worker_.joinable()) {
    if (stuck) {
      // The backend never returned from Run(): keep the process able to exit. The backend is
      // deliberately leaked, since the stuck thread still uses it.
      worker_.detach();
      ADAPTCOMM_LOG(kError, "a ", backend_->name(),
                    " operation never returned; its thread and backend are abandoned");
    } else {
      worker_.join();
    }
  }
}

}  // namespace adaptcomm::internal

#include "lib/core/op_executor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/log.h"

namespace adaptcomm::internal {
namespace {

// How often the watchdog proves it is alive to the HeartbeatMonitor.
constexpr absl::Duration kBeat = absl::Seconds(1);

// What every rank must agree an op is: compared across ranks when they vote on a retry.
std::string Fingerprint(const OpDesc& op) {
  const TensorView& v = op.kind == OpKind::kRecv ? op.output : op.input;
  return absl::StrCat(OpKindName(op.kind), " ", DTypeName(v.dtype), "[", v.count, "]",
                      op.kind == OpKind::kAllreduce || op.kind == OpKind::kReduce ||
                              op.kind == OpKind::kReduceScatter
                          ? absl::StrCat(" ", ReduceOpName(op.reduce))
                          : "",
                      op.kind == OpKind::kBroadcast || op.kind == OpKind::kReduce
                          ? absl::StrCat(" root=", op.root)
                          : "");
}

}  // namespace

OpExecutor::OpExecutor(std::unique_ptr<Backend> backend, ExecutorOptions options)
    : backend_(backend.get()), options_(options) {
  absl::MutexLock lock(&mu_);
  owned_backends_.push_back(std::move(backend));
}

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
  auto work = std::make_shared<WorkImpl>(std::move(desc));
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
  absl::Status status = RunWithRetry(work);
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
  if (status.ok()) last_completed_seq_ = std::max(last_completed_seq_, desc.seq);
  work->Finish(std::move(status));
  running_ = nullptr;
  busy_ = false;
}

absl::Status OpExecutor::RunWithRetry(const std::shared_ptr<WorkImpl>& work) {
  const OpDesc& desc = work->desc();
  if (pre_run_check_) {
    if (absl::Status s = pre_run_check_(desc, Fingerprint(desc)); !s.ok()) return s;
  }
  const bool retries = recovery_handler_ != nullptr && recovery_handler_->max_attempts() > 1;
  bool replayable = false;
  if (retries) {
    replay_.BeforeOp(desc);
    absl::Status recorded = replay_.Record(desc, backend().device_memory());
    replayable = recorded.ok();
    if (!replayable && !replay_warned_) {
      replay_warned_ = true;
      ADAPTCOMM_LOG(kWarning, OpKindName(desc.kind), " #", desc.seq,
                    " runs without coordinated retry (said once): ", recorded.message());
    }
  }
  absl::Status status = backend().Run(desc);
  // A failure while another rank's retry is pending (the backend was interrupted or already
  // broken for it) joins that retry whatever its code; otherwise the policy decides.
  for (int attempt = 1; !status.ok() && replayable && attempt < recovery_handler_->max_attempts() &&
                        !Aborted() && !absl::IsInvalidArgument(status) &&
                        (recovery_handler_->Retryable(status) || RecoveryRequested());
       ++attempt) {
    {
      // The vote and the rebuild bound themselves; the watchdog resumes for the re-run.
      absl::MutexLock lock(&mu_);
      running_ = nullptr;
    }
    status = RecoverFrom(desc.seq, Fingerprint(desc), attempt, status);
    if (!status.ok()) break;  // no agreement: the error names who was missing
    {
      absl::MutexLock lock(&mu_);
      running_ = work;
      running_since_ = absl::Now();
    }
    status = replay_.RestoreInput(desc.seq);
    if (status.ok()) status = backend().Run(desc);
    if (status.ok()) {
      ADAPTCOMM_LOG(kWarning, OpKindName(desc.kind), " #", desc.seq,
                    " succeeded after a coordinated retry (attempt ", attempt + 1, ")");
    }
  }
  return status;
}

absl::Status OpExecutor::RecoverFrom(uint64_t position, const std::string& fingerprint, int attempt,
                                     const absl::Status& cause) {
  int next;
  {
    absl::MutexLock lock(&mu_);
    next = std::max(generation_, requested_generation_ - 1) + 1;
  }
  absl::StatusOr<RecoveryPlan> plan =
      recovery_handler_->Recover(next, position, fingerprint, attempt, cause);
  if (!plan.ok()) {
    // No agreement (a rank is gone): the communicator is finished; later ops fail fast with the
    // reason, and the pending request is dropped so nobody votes again.
    absl::MutexLock lock(&mu_);
    requested_generation_ = generation_;
    if (aborted_.ok()) aborted_ = plan.status();
    return plan.status();
  }
  const uint64_t restart = plan->restart_seq;
  InstallBackend(std::move(plan->backend), plan->generation);
  if (restart < position && !replay_.Covers(restart, position - 1)) {
    return absl::FailedPreconditionError(
        absl::StrCat("coordinated retry must restart at #", restart, " but rank ", backend().rank(),
                     " kept inputs only of its last ops before #", position, "; cannot re-run"));
  }
  for (uint64_t seq = restart; seq < position; ++seq) {
    // Completed here already: re-run for the ranks that did not complete it, into scratch.
    absl::StatusOr<OpDesc> copy = replay_.DetachedCopy(seq);
    if (!copy.ok()) return copy.status();
    if (absl::Status s = backend().Run(*copy); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void OpExecutor::InstallBackend(std::unique_ptr<Backend> backend, int generation) {
  absl::MutexLock lock(&mu_);
  backend_.store(backend.get());
  owned_backends_.push_back(std::move(backend));
  generation_ = generation;
  requested_generation_ = std::max(requested_generation_, generation);
}

void OpExecutor::RequestRecovery(int generation) {
  Backend* to_interrupt = nullptr;
  {
    absl::MutexLock lock(&mu_);
    // A finished communicator (aborted, or its own retry found no agreement) votes no more: the
    // caller already has its error, and a late wake from a peer must not start another round.
    if (!aborted_.ok() || stopping_) return;
    if (generation <= generation_ || generation <= requested_generation_) return;
    requested_generation_ = generation;
    if (busy_) to_interrupt = backend_.load();
  }
  // A running op fails with Aborted and takes the retry path; an idle worker wakes up for it.
  if (to_interrupt != nullptr) {
    to_interrupt->Abort(absl::AbortedError(
        absl::StrCat("another rank started coordinated retry generation ", generation)));
  }
}

bool OpExecutor::RecoveryRequested() const {
  absl::MutexLock lock(&mu_);
  return requested_generation_ > generation_;
}

bool OpExecutor::Aborted() const {
  absl::MutexLock lock(&mu_);
  return !aborted_.ok();
}

int OpExecutor::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void OpExecutor::RecoverIdleLocked() {
  busy_ = true;
  const uint64_t position = last_completed_seq_ + 1;
  mu_.Unlock();
  absl::Status status =
      RecoverFrom(position, "", 1, absl::AbortedError("requested by another rank"));
  mu_.Lock();
  busy_ = false;
  if (!status.ok()) {
    ADAPTCOMM_LOG(kError, "coordinated retry failed: ", status.ToString());
    requested_generation_ = generation_;
    if (aborted_.ok()) aborted_ = status;
    std::deque<std::shared_ptr<WorkImpl>> dropped;
    dropped.swap(queue_);
    for (auto& work : dropped) work->Finish(status);
  }
}

void OpExecutor::WorkerLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return (!busy_ && (!queue_.empty() || requested_generation_ > generation_)) ||
             (stopping_ && queue_.empty());
    };
    mu_.Await(absl::Condition(&ready));
    if (!busy_ && requested_generation_ > generation_) {
      RecoverIdleLocked();
      continue;
    }
    if (queue_.empty()) return;  // stopping and drained
    RunHeadLocked();
  }
}

void OpExecutor::Beat() {
  if (heartbeat_) heartbeat_();
}

void OpExecutor::WatchdogLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto idle_or_stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return running_ != nullptr || (stopping_ && queue_.empty() && !busy_);
    };
    while (!mu_.AwaitWithTimeout(absl::Condition(&idle_or_stop), kBeat)) Beat();
    if (running_ == nullptr) return;  // stopping, nothing left
    std::shared_ptr<WorkImpl> watched = running_;
    auto moved_on = [this, &watched]()
                        ABSL_SHARED_LOCKS_REQUIRED(mu_) { return running_ != watched; };
    const OpDesc& desc = watched->desc();
    const absl::Time deadline = running_since_ + desc.timeout + options_.watchdog_grace;
    bool moved = false;
    while (!(moved = mu_.AwaitWithDeadline(absl::Condition(&moved_on),
                                           std::min(deadline, absl::Now() + kBeat))) &&
           absl::Now() < deadline) {
      Beat();
    }
    if (moved) continue;

    absl::Status timeout = absl::DeadlineExceededError(
        absl::StrCat(OpKindName(desc.kind), " #", desc.seq, " on rank ", backend().rank(),
                     " exceeded its timeout of ", absl::FormatDuration(desc.timeout),
                     " (watchdog); aborting the ", backend().name(), " backend"));
    ADAPTCOMM_LOG(kError, timeout.message());
    mu_.Unlock();
    backend().Abort(timeout);
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
  backend().Abort(reason);
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
      ADAPTCOMM_LOG(kError, "a ", backend().name(),
                    " operation never returned; its thread and backend are abandoned");
    } else {
      worker_.join();
    }
  }
}

}  // namespace adaptcomm::internal

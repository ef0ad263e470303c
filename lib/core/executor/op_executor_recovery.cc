// OpExecutor's recovery: coordinated retry of a failed op (RunWithRetry, RecoverFrom), the
// worker's part in a retry another rank started (RecoverIdleLocked), the device-failure path of
// stream-ordered ops, and the installation of a rebuilt backend or a new membership.
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adaptcomm/status.h"
#include "lib/base/log.h"
#include "lib/base/wall_clock.h"
#include "lib/core/executor/op_executor.h"  // IWYU pragma: associated
#include "lib/cuda/cuda_api.h"

namespace adaptcomm::internal {

std::string OpFingerprint(const OpDesc& op) {
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

namespace {
constexpr auto Fingerprint = OpFingerprint;
}  // namespace

absl::Status OpExecutor::RunWithRetry(const WorkImpl& work, absl::Time started,
                                      std::optional<Launched>* launched) {
  const OpDesc& desc = work.desc();
  if (pre_run_check_) {
    absl::Status s;
    if (work.heads_group()) {
      // Every rank's group takes part (its first op may be a send on one rank and a collective on
      // another): checked as a barrier would be, with the group's collectives as its fingerprint.
      OpDesc probe = desc;
      probe.kind = OpKind::kBarrier;
      probe.seq = work.first_seq();
      s = pre_run_check_(probe, GroupFingerprint(work));
    } else {
      s = pre_run_check_(desc, Fingerprint(desc));
    }
    if (!s.ok()) return s;
  }
  if (work.step() != 0) return RunInStep(work, started, launched);
  if (work.heads_group()) return RunGroupWithRetry(work, started, launched);
  bool replayable = false;
  absl::Status recorded;  // why the op has no record, when it has none
  if (retries_) {
    replay_.BeforeOp(desc, backend().stream_ordered());
    recorded = replay_.Record(desc, backend().device_memory(), backend().stream_ordered());
    replayable = recorded.ok();
    if (!replayable) {
      // Only the executing thread writes it: a load and a store, no read-modify-write.
      unprotected_ops_.store(unprotected_ops_.load(std::memory_order_relaxed) + 1,
                             std::memory_order_relaxed);
    }
    if (!replayable && !replay_warned_) {
      replay_warned_ = true;
      ADAPTCOMM_LOG(kWarning, OpKindName(desc.kind), " #", desc.seq,
                    " runs without coordinated retry (said once): ", recorded.message());
    }
  }
  absl::Status status = Execute(work, started, launched);
  if (!status.ok() && !replayable && retries_) {
    return RecoverUnrecorded(
        desc, status,
        absl::IsFailedPrecondition(recorded) ? kReplayAutoNoCopy : recorded.message());
  }
  // A failure while another rank's retry is pending (the backend was interrupted or already
  // broken for it) joins that retry whatever its code; otherwise the policy decides.
  for (int attempt = 1;
       !status.ok() && replayable && attempt < recovery_handler_->max_attempts() && !Aborted() &&
       !absl::IsInvalidArgument(status) && !IsMembershipChanged(status) &&
       (recovery_handler_->Retryable(status) || RecoveryRequested());
       ++attempt) {
    {
      // The vote and the rebuild bound themselves; the watchdog resumes for the re-run.
      ExecutorLock lock(this);
      running_ = false;
    }
    status = RecoverFrom(desc.seq, Fingerprint(desc), attempt, status);
    if (!status.ok()) break;  // no agreement: the error names who was missing
    if (Aborted()) {
      // Abort() came during the vote and released the caller: its buffers are its own again.
      ExecutorLock lock(this);
      status = aborted_;
      break;
    }
    started = WallNow();
    {
      ExecutorLock lock(this);
      running_ = true;  // executing_ is `work`
      running_since_ = started;
    }
    status = replay_.RestoreInput(desc.seq, backend().stream_ordered());
    if (status.ok()) status = Execute(work, started, launched);
    if (status.ok()) {
      ADAPTCOMM_LOG(kWarning, OpKindName(desc.kind), " #", desc.seq,
                    " succeeded after a coordinated retry (attempt ", attempt + 1, ")");
    }
  }
  return status;
}

absl::Status OpExecutor::RecoverUnrecorded(const OpDesc& desc, const absl::Status& cause,
                                           absl::string_view why, const std::string* fingerprint) {
  if (Aborted() || absl::IsInvalidArgument(cause) || IsMembershipChanged(cause) ||
      !(recovery_handler_->Retryable(cause) || RecoveryRequested())) {
    return cause;
  }
  {
    ExecutorLock lock(this);
    running_ = false;  // the vote and the rebuild bound themselves
  }
  // The op cannot run again, but the vote still tells every rank who is gone (its error names
  // them), and when every rank is in this op the rebuilt communicator goes on: the op failed
  // everywhere, and the trainer redoes its work.
  if (absl::Status s = RecoverFrom(
          desc.seq, fingerprint != nullptr ? *fingerprint : Fingerprint(desc), 1, cause);
      !s.ok()) {
    return s;
  }
  return StepRedoStatus(absl::StrCat(
      OpKindName(desc.kind), " #", desc.seq, " failed (", cause.message(), ") and was not re-run (",
      why, "); every rank voted and the communicator recovered at generation ", generation(),
      ": redo the work of this op (or use BeginStep/CommitStep)"));
}

absl::Status OpExecutor::RecoverFrom(uint64_t position, const std::string& fingerprint, int attempt,
                                     const absl::Status& cause) {
  int next;
  uint64_t issued;
  {
    ExecutorLock lock(this);
    next = std::max(generation_, requested_generation_ - 1) + 1;
    issued = next_seq_ - 1;
  }
  absl::StatusOr<RecoveryPlan> plan =
      recovery_handler_->Recover(next, position, issued, fingerprint, attempt, cause);
  if (!plan.ok()) {
    // No agreement (a rank is gone): the communicator is finished; later ops fail fast with the
    // reason, and the pending request is dropped so nobody votes again.
    ExecutorLock lock(this);
    requested_generation_ = generation_;
    if (aborted_.ok()) aborted_ = plan.status();
    return plan.status();
  }
  const uint64_t restart = plan->restart_seq;
  const bool changed = plan->change.has_value();
  std::optional<MembershipChange> change = plan->change;
  InstallBackend(std::move(plan->backend), plan->generation, std::move(plan->change));
  if (plan->on_installed) plan->on_installed();
  if (restart < position && !replay_.Covers(restart, position - 1)) {
    return absl::FailedPreconditionError(
        absl::StrCat("coordinated retry must restart at #", restart, " but rank ", backend().rank(),
                     " kept inputs only of its last ops before #", position, "; cannot re-run"));
  }
  for (uint64_t seq = restart; seq < position; ++seq) {
    // Completed here already: re-run for the ranks that did not complete it, into scratch.
    absl::StatusOr<OpDesc> copy = replay_.DetachedCopy(seq, backend().stream_ordered());
    if (!copy.ok()) return copy.status();
    if (changed) {
      // Ranks behind this one fail the op if its meaning did not survive; so does its re-run here.
      absl::StatusOr<OpDesc> renumbered = TranslateOp(*copy, {&*change});
      if (!renumbered.ok()) continue;
      copy = std::move(renumbered);
    }
    if (absl::Status s = RerunCompleted(*copy); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status OpExecutor::RerunCompleted(const OpDesc& op) {
  StreamOrdered* ordered = op.issued_at != nullptr ? backend().stream_ordered() : nullptr;
  if (ordered == nullptr) return backend().Run(op);
  // A device op's scratch input was queued by CopyAt, behind the op's stream position on the
  // backend's stream: only an op that Launch queues there is ordered behind that copy. Run would
  // put the collective on the caller's stream (the trainer's, whose later work it would also
  // delay), where it could read the scratch before the copy landed and hand the peers a wrong sum.
  absl::StatusOr<std::shared_ptr<DeviceCompletion>> completion = ordered->Launch(op);
  if (!completion.ok()) return completion.status();
  const absl::Time deadline = absl::Now() + op.timeout;
  for (int i = 0;; ++i) {
    absl::StatusOr<bool> done = (*completion)->Poll();
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      absl::Status late = absl::DeadlineExceededError(absl::StrCat(
          OpKindName(op.kind), " #", op.seq, " on rank ", backend().rank(),
          ", re-run during a coordinated retry for the ranks that had not completed it, did not "
          "complete on the device within its timeout of ",
          absl::FormatDuration(op.timeout), "; aborting the ", backend().name(), " backend"));
      backend().Abort(late);
      return late;
    }
    cuda::PollPause(i);
  }
}

void OpExecutor::InstallBackend(std::unique_ptr<Backend> backend, int generation,
                                std::optional<MembershipChange> change) {
  ExecutorLock lock(this);
  if (change.has_value()) changes_.push_back(*std::move(change));
  backend_.store(backend.get());
  owned_backends_.push_back(std::move(backend));
  generation_ = generation;
  requested_generation_ = std::max(requested_generation_, generation);
  PublishMembershipLocked();
}

void OpExecutor::PublishMembershipLocked() {
  // A seqlock (membership()): odd while the copies change. Writers are serialized by mu_. Every
  // access is sequentially consistent (no fences: TSan does not model them); on x86 that costs the
  // readers nothing and the rare writer an exchange per store.
  const uint64_t version = membership_version_.load();
  membership_version_.store(version + 1);
  const Backend& b = *backend_.load();
  epoch_.store(static_cast<int>(changes_.size()));
  member_rank_.store(b.rank());
  member_world_.store(b.size());
  member_generation_.store(generation_);
  membership_version_.store(version + 2);
}

absl::Status OpExecutor::Reconfigure(
    const std::function<absl::StatusOr<RecoveryPlan>()>& reconfigure) {
  {
    ExecutorLock lock(this);
    if (!aborted_.ok()) return aborted_;
    if (stopping_ || busy_ || !queue_.empty() || !DeviceIdleLocked() ||
        requested_generation_ > generation_ || !device_failure_.ok()) {
      return absl::FailedPreconditionError(
          "membership reconfiguration needs an idle communicator (a step boundary: every op "
          "issued before it finished)");
    }
    busy_ = true;  // keeps the worker and inline launches off until the new backend is in
  }
  absl::StatusOr<RecoveryPlan> plan = reconfigure();
  if (plan.ok()) {
    InstallBackend(std::move(plan->backend), plan->generation, std::move(plan->change));
    if (plan->on_installed) plan->on_installed();
  }
  ExecutorLock lock(this);
  busy_ = false;
  return plan.status();
}

void OpExecutor::RequestRecovery(int generation) {
  Backend* to_interrupt = nullptr;
  {
    ExecutorLock lock(this);
    // A finished communicator (aborted, or its own retry found no agreement) votes no more: the
    // caller already has its error, and a late wake from a peer must not start another round.
    if (!aborted_.ok() || stopping_) return;
    if (generation <= generation_ || generation <= requested_generation_) return;
    requested_generation_ = generation;
    if (step_.open != 0 && step_.failure.ok()) {
      step_.failure = absl::AbortedError(
          absl::StrCat("another rank started coordinated retry generation ", generation));
    }
    // Ops in flight on the device end (and are retried from the oldest) once the backend aborts.
    if (busy_ || !in_flight_.empty()) to_interrupt = backend_.load();
  }
  // A running op fails with Aborted and takes the retry path; an idle worker wakes up for it.
  if (to_interrupt != nullptr) {
    to_interrupt->Abort(absl::AbortedError(
        absl::StrCat("another rank started coordinated retry generation ", generation)));
  }
}

bool OpExecutor::RecoveryRequested() const {
  absl::MutexLock lock(&mu_);  // reads only: wakes no one
  return requested_generation_ > generation_;
}

void OpExecutor::RecoverIdleLocked() {
  busy_ = true;
  const uint64_t position = last_completed_seq_ + 1;
  const bool steps = step_.begun != 0;
  UnlockAndWake();
  const absl::Status cause = absl::AbortedError("requested by another rank");
  absl::Status status = steps ? RecoverStep(nullptr, cause) : RecoverFrom(position, "", 1, cause);
  if (!status.ok() && break_hook_) break_hook_(status);
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

void OpExecutor::HandleDeviceFailure(std::deque<std::shared_ptr<WorkImpl>> failed,
                                     absl::Status cause) {
  const OpDesc& oldest = failed.front()->desc();
  absl::Status status = std::move(cause);
  if (failed.front()->step() != 0) {
    // A step's ops are never re-run: the communicator recovers, and they all fail for the step to
    // be redone (any that a Wait let the caller's stream past included: the redo rewrites them).
    status = RecoverStep(&oldest, status);
    if (!IsStepRedo(status) && break_hook_) break_hook_(status);
    ExecutorLock lock(this);
    const bool redo = IsStepRedo(status);
    for (const std::shared_ptr<WorkImpl>& work : failed) {
      CompleteLocked(work,
                     redo && work != failed.front() ? StepFailedLocked(work->desc()) : status);
    }
    return;
  }
  for (int attempt = oldest.seq == device_retry_seq_ ? device_retry_attempt_ : 1;
       retries_ && attempt < recovery_handler_->max_attempts() && !Aborted() &&
       !absl::IsInvalidArgument(status) && !IsMembershipChanged(status) &&
       (recovery_handler_->Retryable(status) || RecoveryRequested()) &&
       replay_.Covers(oldest.seq, failed.back()->desc().seq);
       ++attempt) {
    // An op whose Wait let the caller's stream go on may have been read (or its buffer reused)
    // already: a relaunch in place could rewrite what the stream consumed. Outside a step that
    // cannot be repaired. (A Wait racing this check is caught by MarkRelaunching below.)
    if (absl::Status lost = ReleasedOpLoss(failed, status); !lost.ok()) {
      status = lost;
      break;
    }
    status = RecoverFrom(oldest.seq, Fingerprint(oldest), attempt, status);
    if (!status.ok()) break;  // no agreement: the error names who was missing
    // Queue them again, in order, each from its recorded input.
    size_t relaunched = 0;
    for (; relaunched < failed.size() && status.ok(); ++relaunched) {
      const std::shared_ptr<WorkImpl>& work = failed[relaunched];
      if (!work->MarkRelaunching()) {  // its Wait came during the vote
        status = ReleasedOpLoss({work}, absl::AbortedError("its Wait came during the vote"));
        break;
      }
      status = replay_.RestoreInput(work->desc().seq, backend().stream_ordered());
      std::optional<Launched> launched;
      if (status.ok()) status = Execute(*work, WallNow(), &launched);
      if (status.ok()) {
        ExecutorLock lock(this);
        if (launched.has_value()) {
          RecordLaunchLocked(work, *std::move(launched));
        } else {
          CompleteLocked(work, absl::OkStatus());  // the rebuilt backend is not stream-ordered
        }
      }
    }
    ExecutorLock lock(this);
    if (status.ok() && device_failure_.ok()) {
      device_retry_seq_ = oldest.seq;
      device_retry_attempt_ = attempt + 1;
      ADAPTCOMM_LOG(kWarning, OpKindName(oldest.kind), " #", oldest.seq, " and the ",
                    failed.size() - 1,
                    " op(s) queued behind it were queued again after a "
                    "coordinated retry (attempt ",
                    attempt + 1, ")");
      return;
    }
    // The new generation failed too: everything queued again is unfinished again.
    if (status.ok()) status = device_failure_;
    device_failure_ = absl::OkStatus();
    std::deque<std::shared_ptr<WorkImpl>> again = TakeUnfinishedInFlightLocked();
    for (size_t i = relaunched; i < failed.size(); ++i) again.push_back(std::move(failed[i]));
    failed.swap(again);
    if (failed.empty()) return;
  }
  const std::shared_ptr<WorkImpl> head = failed.front();
  if (retries_ &&
      std::any_of(failed.begin(), failed.end(), [](const auto& w) { return w->heads_group(); })) {
    // A group has no record and is never re-run (nor are the ops in flight with it), but keeps what
    // groups promise off the device too: every rank votes, the communicator recovers, and its ops
    // fail with the redo status; unless a Wait let a caller's stream past one of them. (A single
    // device op without a record fails without a rebuild: NcclRetry.OpWhoseRecordIsOverTheBudget.)
    if (absl::Status lost = ReleasedOpLoss(failed, status); !lost.ok()) {
      status = lost;
    } else {
      OpDesc position = head->desc();
      position.seq = head->first_seq();
      const std::string fingerprint =
          head->heads_group() ? GroupFingerprint(*head) : Fingerprint(position);
      status = RecoverUnrecorded(position, status, kGroupNotReRun, &fingerprint);
    }
  }
  if (ReportToPeers(status)) {
    status = failure_handler_->OnOpFailure(head->desc(), std::move(status));
    if (break_hook_) break_hook_(status);
  }
  ExecutorLock lock(this);
  CompleteLocked(head, status);
  for (size_t i = 1; i < failed.size(); ++i) {
    const OpDesc& d = failed[i]->desc();
    std::string message =
        absl::StrCat(OpKindName(d.kind), " #", d.seq, " did not complete: ", status.message());
    CompleteLocked(failed[i], IsStepRedo(status) ? StepRedoStatus(std::move(message))
                                                 : absl::Status(status.code(), message));
  }
}

absl::Status OpExecutor::ReleasedOpLoss(const std::deque<std::shared_ptr<WorkImpl>>& failed,
                                        const absl::Status& cause) {
  for (const std::shared_ptr<WorkImpl>& head : failed) {
    // A group's ops are released one by one (each Wait), and fail together.
    const WorkImpl* released = head->released() ? head.get() : nullptr;
    for (const std::shared_ptr<WorkImpl>& m : head->group_members()) {
      if (released == nullptr && m->released()) released = m.get();
    }
    if (released == nullptr) continue;
    const OpDesc& d = released->desc();
    absl::Status lost = absl::DataLossError(absl::StrCat(
        OpKindName(d.kind), " #", d.seq, " on rank ", backend().rank(),
        " failed on the device after its Wait let the caller's stream go on (", cause.message(),
        "): the stream may have read an incomplete result, so it is not re-run in place; the "
        "communicator is broken (inside BeginStep/CommitStep the step would be redone)"));
    ExecutorLock lock(this);
    if (aborted_.ok()) aborted_ = lost;
    return lost;
  }
  return absl::OkStatus();
}

std::deque<std::shared_ptr<WorkImpl>> OpExecutor::TakeUnfinishedInFlightLocked() {
  std::deque<std::shared_ptr<WorkImpl>> unfinished;
  for (InFlight& f : in_flight_) {
    // Synchronize() saw the device finish it (and returned its result to the caller): it is
    // complete here, whatever failed after it; re-running it would write into buffers that are
    // the caller's again.
    // A group's ops share one completion: any of them seen done means the group is.
    const auto& members = f.work->group_members();
    if (f.work->state() == WorkState::kDone ||
        std::any_of(members.begin(), members.end(),
                    [](const auto& m) { return m->state() == WorkState::kDone; })) {
      CompleteLocked(f.work, absl::OkStatus());
    } else {
      unfinished.push_back(std::move(f.work));
    }
  }
  in_flight_.clear();
  return unfinished;
}

}  // namespace adaptcomm::internal

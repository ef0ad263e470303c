// OpExecutor's steps: the ops a trainer brackets with Communicator::BeginStep/CommitStep are
// recovered together, never one by one (see op_executor.h, "Steps", and docs/resilience.md).
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adaptcomm/status.h"
#include "lib/base/log.h"
#include "lib/core/executor/op_executor.h"  // IWYU pragma: associated

namespace adaptcomm::internal {
namespace {

constexpr absl::Duration kQuietPoll = absl::Microseconds(100);

constexpr auto StepRedo = StepRedoStatus;

}  // namespace

absl::Status StepRedoStatus(std::string message) {
  absl::Status status = absl::AbortedError(std::move(message));
  status.SetPayload(kStepRedoPayload, absl::Cord("redo"));
  return status;
}

bool OpExecutor::ReportToPeers(const absl::Status& status) const {
  return failure_handler_ != nullptr && !absl::IsInvalidArgument(status) &&
         !IsMembershipChanged(status) && !IsStepRedo(status);
}

absl::Status OpExecutor::StepFailedLocked(const OpDesc& op) const {
  return StepRedo(absl::StrCat(OpKindName(op.kind), op.seq != 0 ? absl::StrCat(" #", op.seq) : "",
                               " of step ", step_.open, " did not run: the step failed (",
                               step_.failure.message(), "); redo the step after CommitStep"));
}

bool OpExecutor::NoRecoveryLocked() const {
  return !recovering_ && requested_generation_ <= generation_;
}

bool OpExecutor::DrainedLocked() const {
  return NoRecoveryLocked() && queue_.empty() && !busy_ && DeviceIdleLocked() &&
         device_failure_.ok();
}

bool OpExecutor::NoRecovery() const {
  absl::MutexLock lock(&mu_);  // reads only: wakes no one
  return NoRecoveryLocked() || !aborted_.ok() || stopping_;
}

bool OpExecutor::Drained() const {
  absl::MutexLock lock(&mu_);  // reads only: wakes no one
  return DrainedLocked() || !aborted_.ok() || stopping_;
}

absl::Status OpExecutor::AwaitDrained(absl::Time deadline, const char* what) {
  return AwaitQuiet(&OpExecutor::Drained, deadline, what);
}

absl::Status OpExecutor::AwaitQuiet(bool (OpExecutor::*quiet)() const, absl::Time deadline,
                                    const char* what) {
  while (!(this->*quiet)()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": the communicator's ops or its recovery did not end in time"));
    }
    absl::SleepFor(kQuietPoll);
  }
  return absl::OkStatus();
}

absl::Status OpExecutor::BeginStep(absl::Duration bound) {
  // Another rank's recovery that this rank joined between steps renumbers what comes next.
  if (absl::Status s = AwaitQuiet(&OpExecutor::NoRecovery, absl::Now() + bound, "BeginStep");
      !s.ok()) {
    return s;
  }
  ExecutorLock lock(this);
  if (!aborted_.ok()) return aborted_;
  if (step_.open != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("BeginStep: step ", step_.open, " (from op #", step_.begin_seq,
                     ") is still open; steps do not nest: call CommitStep first"));
  }
  const uint64_t number = step_.begun + 1;
  step_ = StepState();
  step_.open = step_.begun = number;
  step_.begin_seq = next_seq_;
  return absl::OkStatus();
}

bool OpExecutor::StepOpen() const {
  absl::MutexLock lock(&mu_);  // reads only: wakes no one
  return step_.open != 0;
}

uint64_t OpExecutor::StepOpsIssued() const {
  absl::MutexLock lock(&mu_);  // reads only: wakes no one
  return step_.open != 0 ? next_seq_ - step_.begin_seq : 0;
}

void OpExecutor::FailStep(const absl::Status& cause) {
  ExecutorLock lock(this);
  if (step_.open != 0 && step_.failure.ok()) step_.failure = cause;
}

absl::StatusOr<OpExecutor::StepOutcome> OpExecutor::EndStep(absl::Duration bound) {
  bool failed;
  {
    absl::MutexLock lock(&mu_);  // reads only: wakes no one
    if (step_.open == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("CommitStep without BeginStep (", step_.begun, " step(s) so far)"));
    }
    failed = !step_.failure.ok() || !NoRecoveryLocked();
  }
  // A step that failed ends once its ops and the recovery have: the redo must start on the new
  // backend, numbered alike on every rank.
  absl::Status drained = failed
                             ? AwaitQuiet(&OpExecutor::Drained, absl::Now() + bound, "CommitStep")
                             : absl::OkStatus();
  ExecutorLock lock(this);
  StepOutcome outcome{.step = step_.open,
                      .failure = step_.failure,
                      .recovered = step_.recovered,
                      .max_position = step_.max_position};
  if (!drained.ok()) {
    // The recovery did not end within the bound: that, not the op's own error, is the verdict.
    outcome.failure =
        outcome.failure.ok()
            ? drained
            : absl::Status(drained.code(),
                           absl::StrCat(drained.message(),
                                        "; the step had failed: ", outcome.failure.message()));
  }
  if (step_.realign_seq > next_seq_) next_seq_ = step_.realign_seq;
  if (step_.recovered) last_completed_seq_ = next_seq_ - 1;
  const uint64_t begun = step_.begun;
  step_ = StepState();
  step_.begun = begun;
  return outcome;
}

absl::Status OpExecutor::RunInStep(const WorkImpl& work, absl::Time started,
                                   std::optional<Launched>* launched) {
  const OpDesc& desc = work.desc();
  {
    absl::MutexLock lock(&mu_);  // reads only: wakes no one
    if (work.step() != step_.open) {
      return absl::FailedPreconditionError(absl::StrCat(OpKindName(desc.kind), " #", desc.seq,
                                                        " of step ", work.step(),
                                                        " started after that step was committed"));
    }
    if (!step_.failure.ok()) return StepFailedLocked(desc);
  }
  absl::Status status = Execute(work, started, launched);
  if (status.ok() || IsMembershipChanged(status)) return status;
  if (absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status)) {
    // Refused here alone (a caller's mistake, a capturing stream): the step fails with it and
    // CommitStep returns it; the peers' recovery reaches this rank when they time out.
    ExecutorLock lock(this);
    if (step_.failure.ok()) step_.failure = status;
    return status;
  }
  return RecoverStep(&desc, status);
}

absl::Status OpExecutor::RecoverStep(const OpDesc* op, const absl::Status& cause) {
  uint64_t position, issued;
  int next;
  {
    ExecutorLock lock(this);
    running_ = false;  // the vote and the rebuild bound themselves
    if (step_.open != 0 && step_.failure.ok()) step_.failure = cause;
    // Every rank in the step votes its first op: the smallest position is then that op, and no
    // rank has anything to re-run (a rank past the step's commit is told by max_position).
    position = step_.open != 0 ? step_.begin_seq : last_completed_seq_ + 1;
    issued = next_seq_ - 1;
    next = std::max(generation_, requested_generation_ - 1) + 1;
    if (!retries_ || !aborted_.ok()) return cause;  // no recovery: the op's own error stands
    recovering_ = true;
  }
  absl::StatusOr<RecoveryPlan> plan =
      recovery_handler_->Recover(next, position, issued, "", 1, cause);
  if (plan.ok()) {
    InstallBackend(std::move(plan->backend), plan->generation, std::move(plan->change));
    if (plan->on_installed) plan->on_installed();
  }
  ExecutorLock lock(this);
  recovering_ = false;
  if (!plan.ok()) {
    // No agreement (a rank is gone): the communicator is finished, as after a failed retry.
    requested_generation_ = generation_;
    if (aborted_.ok()) aborted_ = plan.status();
    // CommitStep reports the recovery's verdict (it names the first error), not the op's error.
    if (step_.open != 0) step_.failure = plan.status();
    return plan.status();
  }
  ADAPTCOMM_LOG(kWarning, "step ", step_.open, ": the communicator recovered at generation ",
                generation_, " (cause: ", cause.message(), ")",
                step_.open != 0 ? "; the step is to be redone" : "");
  if (step_.open != 0) {
    step_.recovered = true;
    step_.max_position = plan->max_position;
    step_.realign_seq = plan->max_issued + 1;
  } else {
    next_seq_ = std::max(next_seq_, plan->max_issued + 1);
    last_completed_seq_ = next_seq_ - 1;
  }
  if (op == nullptr) return absl::OkStatus();
  return StepRedo(absl::StrCat(OpKindName(op->kind), " #", op->seq, " of step ", step_.open,
                               " failed (", cause.message(),
                               "); the communicator recovered at generation ", generation_,
                               ": redo the step after CommitStep"));
}

}  // namespace adaptcomm::internal

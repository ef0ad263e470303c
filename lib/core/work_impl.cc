#include "lib/core/work_impl.h"

#include "absl/strings/str_cat.h"

namespace adaptcomm::internal {

WorkImpl::WorkImpl(OpDesc desc) : desc_(std::move(desc)), enqueue_time_(absl::Now()) {}

std::shared_ptr<WorkImpl> WorkImpl::Failed(OpDesc desc, absl::Status status) {
  auto work = std::make_shared<WorkImpl>(std::move(desc));
  work->Finish(std::move(status));
  return work;
}

bool WorkImpl::MarkRunning() {
  absl::MutexLock lock(&mu_);
  if (state_ != WorkState::kPending) return false;
  state_ = WorkState::kRunning;
  start_time_ = absl::Now();
  return true;
}

bool WorkImpl::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (IsTerminal(state_)) return false;
  if (status.ok()) {
    state_ = WorkState::kDone;
  } else if (absl::IsDeadlineExceeded(status)) {
    state_ = WorkState::kTimedOut;
  } else {
    state_ = WorkState::kFailed;
  }
  status_ = std::move(status);
  end_time_ = absl::Now();
  return true;
}

absl::Status WorkImpl::Wait(absl::Duration bound) {
  // Only waits: the op runs on the executor's worker, so nothing here can outlast `bound`.
  const absl::Time deadline = absl::Now() + bound;
  absl::MutexLock lock(&mu_);
  auto terminal = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return IsTerminal(state_); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&terminal), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "wait bound of ", absl::FormatDuration(bound), " expired: ", OpKindName(desc_.kind), " #",
        desc_.seq, " is still ", WorkStateName(state_), " (the operation continues; wait again)"));
  }
  return status_;
}

WorkState WorkImpl::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

absl::Status WorkImpl::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Time WorkImpl::start_time() const {
  absl::MutexLock lock(&mu_);
  return start_time_;
}

absl::Time WorkImpl::end_time() const {
  absl::MutexLock lock(&mu_);
  return end_time_;
}

}  // namespace adaptcomm::internal

namespace adaptcomm {

Work::Work(std::shared_ptr<internal::WorkImpl> impl) : impl_(std::move(impl)) {}
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&&) noexcept = default;
Work::~Work() = default;

absl::Status Work::Wait() {
  // Unbounded here, yet bounded in fact: the executor's watchdog ends every running op within its
  // timeout + grace + abort bound, and queued ops behind it in turn.
  return Wait(absl::InfiniteDuration());
}

absl::Status Work::Wait(absl::Duration timeout) {
  if (impl_ == nullptr) return absl::FailedPreconditionError("Wait() on an empty Work handle");
  return impl_->Wait(timeout);
}

WorkState Work::state() const { return impl_ ? impl_->state() : WorkState::kFailed; }

absl::Status Work::status() const {
  if (impl_ == nullptr) return absl::FailedPreconditionError("empty Work handle");
  return impl_->status();
}

uint64_t Work::seq() const { return impl_ ? impl_->desc().seq : 0; }

}  // namespace adaptcomm

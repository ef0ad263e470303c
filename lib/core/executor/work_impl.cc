#include "lib/core/executor/work_impl.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/base/wall_clock.h"
#include "lib/core/executor/op_executor.h"

namespace adaptcomm::internal {

WorkImpl::WorkImpl(OpDesc&& desc, absl::Time enqueue_time, std::weak_ptr<OpExecutor> executor,
                   std::optional<absl::Time> started)
    : desc_(std::move(desc)),
      seq_(desc_.seq),
      executor_(std::move(executor)),
      enqueue_time_(enqueue_time),
      state_(started.has_value() ? WorkState::kRunning : WorkState::kPending),
      start_time_(started.value_or(absl::InfinitePast())) {}

std::shared_ptr<WorkImpl> WorkImpl::Failed(OpDesc&& desc, absl::Status status) {
  auto work = MakeWorkImpl(std::move(desc), WallNow());
  work->Finish(std::move(status));
  return work;
}

std::shared_ptr<WorkImpl> WorkImpl::Grouped(OpDesc&& desc, std::weak_ptr<OpExecutor> executor) {
  desc.seq = 0;
  auto work = MakeWorkImpl(std::move(desc), WallNow(), std::move(executor));
  work->in_open_group_.store(true, std::memory_order_release);
  return work;
}

void WorkImpl::AssignSeq(uint64_t seq, absl::Duration timeout) {
  desc_.seq = seq;
  desc_.timeout = timeout;
  seq_.store(seq, std::memory_order_release);
}

void WorkImpl::FormGroup(const std::shared_ptr<WorkImpl>& head,
                         std::vector<std::shared_ptr<WorkImpl>> members, uint64_t first,
                         uint64_t last) {
  head->heads_group_ = true;
  head->group_first_seq_ = first;
  head->group_last_seq_ = last;
  head->group_members_ = std::move(members);
  for (const std::shared_ptr<WorkImpl>& m : head->group_members_) m->group_head_ = head;
}

bool WorkImpl::MarkRunning(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ != WorkState::kPending) return false;
    state_ = WorkState::kRunning;
    start_time_ = now;
  }
  for (const std::shared_ptr<WorkImpl>& m : group_members_) m->MarkRunning(now);
  return true;
}

bool WorkImpl::Finish(absl::Status status) {
  bool won;
  {
    absl::MutexLock lock(&mu_);
    won = FinishLocked(group_members_.empty() ? std::move(status) : status);
  }
  // Every op of a group ends with the group's status, whoever ends it (the worker, an abort, the
  // watchdog): the members are finished here rather than at each of those places.
  for (const std::shared_ptr<WorkImpl>& m : group_members_) m->Finish(status);
  return won;
}

bool WorkImpl::FinishLocked(absl::Status status) {
  if (IsTerminal(state_)) return false;
  if (status.ok()) {
    state_ = WorkState::kDone;
  } else if (absl::IsDeadlineExceeded(status)) {
    state_ = WorkState::kTimedOut;
  } else {
    state_ = WorkState::kFailed;
  }
  status_ = std::move(status);
  end_time_ = WallNow();
  first_launch_.store(kClosed);  // the completions stay until the Work goes (MarkLaunched)
  return true;
}

DeviceCompletion* WorkImpl::MarkLaunched(std::shared_ptr<DeviceCompletion> completion) {
  DeviceCompletion* const launched = completion.get();
  if (first_completion_ == nullptr && completion != nullptr) {
    first_completion_ = std::move(completion);  // before the pointer is published
    uintptr_t fresh = 0;
    if (first_launch_.compare_exchange_strong(fresh, reinterpret_cast<uintptr_t>(launched))) {
      // A waiter that read first_launch_ before the swap registered before reading it: it sleeps
      // on mu_, whose release re-evaluates its condition.
      if (launch_waiters_.load() > 0) absl::MutexLock wake(&mu_);
      return launched;
    }
    // Finished during the launch (an abort: nothing to publish), or relaunched after a launch
    // that never reached the device: the locked way, as for any relaunch.
    completion = first_completion_;
  }
  absl::MutexLock lock(&mu_);
  SetAsideRelaunchLocked();
  completion_ = std::move(completion);
  return launched;
}

bool WorkImpl::MarkRelaunching() {
  absl::MutexLock lock(&mu_);
  const uintptr_t launch = first_launch_.exchange(kClosed);
  if (released_.load()) {
    if (launch > kClosed) first_launch_.store(launch);  // as it was: its Wait read it
    return false;
  }
  SetAsideRelaunchLocked();
  return true;
}

void WorkImpl::SetAsideRelaunchLocked() {
  if (completion_ != nullptr) earlier_relaunches_.push_back(std::move(completion_));
}

DeviceCompletion* WorkImpl::CompletionLocked() const {
  if (IsTerminal(state_)) return nullptr;
  if (completion_ != nullptr) return completion_.get();
  const uintptr_t launch = first_launch_.load();
  return launch > kClosed ? reinterpret_cast<DeviceCompletion*>(launch) : nullptr;
}

namespace {

std::string StillThere(const OpDesc& desc, absl::Duration bound, WorkState state, bool launched) {
  return absl::StrCat("wait bound of ", absl::FormatDuration(bound),
                      " expired: ", OpKindName(desc.kind), " #", desc.seq, " is still ",
                      WorkStateName(state),
                      desc.issued_at != nullptr && state == WorkState::kRunning
                          ? (launched ? " on the device" : " (not yet queued on the device)")
                          : "",
                      " (the operation continues; wait again)");
}

}  // namespace

namespace {

absl::Status InOpenGroup(const OpDesc& desc, const char* what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " on ", OpKindName(desc.kind),
                   " of a group that has not ended: its ops start only at GroupEnd(); call "
                   "GroupEnd() first (the op stays pending)"));
}

}  // namespace

absl::Status WorkImpl::Wait(absl::Duration bound) {
  if (in_open_group()) return InOpenGroup(desc_, "Wait()");
  // Stream-ordered device op, queued: the caller's stream waits for it, the caller does not.
  const TensorView& view = desc_.kind == OpKind::kSend ? desc_.input : desc_.output;
  // A device op's Wait lets the caller's stream at its buffers: from here on it is never re-run in
  // place (MarkRelaunching). Host ops end before Wait returns: nothing to mark.
  if (desc_.issued_at != nullptr && !released_.load(std::memory_order_relaxed)) {
    released_.store(true);
  }
  if (const uintptr_t launch = first_launch_.load(); launch > kClosed) {
    return reinterpret_cast<DeviceCompletion*>(launch)->MakeStreamWait(view.stream);
  }
  // Without a bound the caller may run its own op when nothing else could run meanwhile: it then
  // waits exactly as long as it would for the worker, minus the hand-off. With a bound it only
  // waits (the op runs on the worker), so nothing here can outlast `bound`.
  HelpProgress(bound);
  absl::MutexLock lock(&mu_);
  auto waited_for = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return IsTerminal(state_) || CompletionLocked() != nullptr;
  };
  // The clock is read only when there is something to wait for: a stream-ordered op issued on an
  // idle executor is already on the device here, and an op's host cost is a few clock reads.
  if (!waited_for()) {
    launch_waiters_.fetch_add(1);  // before the condition reads first_launch_ again (MarkLaunched)
    absl::Time now = absl::Now();
    const absl::Time deadline = now + bound;
    // absl's timed wait ends by the kernel's clock, which absl::Now() (calibrated from the cycle
    // counter) may see as up to a millisecond early on a VM: the bound is kept by absl::Now(). A
    // wait that ended early sleeps again for what absl::Now() says is left (a deadline the kernel
    // already passed would return at once, and this loop would spin until the clocks agree).
    bool expired = false;
    while (!expired && !mu_.AwaitWithTimeout(absl::Condition(&waited_for), deadline - now)) {
      now = absl::Now();
      expired = now >= deadline;
    }
    launch_waiters_.fetch_sub(1);
    if (expired) return absl::DeadlineExceededError(StillThere(desc_, bound, state_, false));
  }
  if (IsTerminal(state_)) return status_;
  return CompletionLocked()->MakeStreamWait(view.stream);
}

void WorkImpl::HelpProgress(absl::Duration bound) {
  if (IsDeviceOp(desc_)) return;  // never run on, or left to, its waiter: nothing to ask
  std::shared_ptr<OpExecutor> executor = executor_.lock();
  if (executor == nullptr) return;
  // A group runs as its head: the waiter of any of its ops helps the head.
  const std::shared_ptr<WorkImpl> head = group_head();
  const WorkImpl* target = head != nullptr ? head.get() : this;
  if (bound == absl::InfiniteDuration()) {
    (void)executor->RunOnWaiter(target);
  } else {
    executor->Expedite(target);
  }
}

WorkState WorkImpl::PolledState() const {
  const WorkState s = state();
  if (s == WorkState::kPending && !in_open_group()) {
    const std::shared_ptr<WorkImpl> head = group_head();
    if (std::shared_ptr<OpExecutor> executor = executor_.lock()) {
      executor->Expedite(head != nullptr ? head.get() : this);
    }
  }
  return s;
}

absl::Status WorkImpl::Synchronize(absl::Duration bound) {
  if (in_open_group()) return InOpenGroup(desc_, "Synchronize()");
  HelpProgress(bound);  // a host op: Synchronize is Wait
  const absl::Time deadline = absl::Now() + bound;
  absl::Duration step = absl::Microseconds(20);
  absl::MutexLock lock(&mu_);
  auto terminal = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return IsTerminal(state_); };
  while (!IsTerminal(state_)) {
    // The executor's watchdog finishes device ops as it sees them complete; asking the device here
    // too saves the caller the watchdog's polling period. A failure is the executor's to handle
    // (it may retry), so only success is taken from here.
    if (DeviceCompletion* completion = CompletionLocked(); completion != nullptr) {
      absl::StatusOr<bool> done = completion->Poll();
      if (done.ok() && *done) {
        FinishLocked(absl::OkStatus());
        break;
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          StillThere(desc_, bound, state_, CompletionLocked() != nullptr));
    }
    mu_.AwaitWithDeadline(absl::Condition(&terminal), std::min(deadline, now + step));
    step = std::min(step * 2, absl::Milliseconds(1));
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

absl::Status Work::Synchronize(absl::Duration timeout) {
  if (impl_ == nullptr)
    return absl::FailedPreconditionError("Synchronize() on an empty Work handle");
  return impl_->Synchronize(timeout);
}

WorkState Work::state() const { return impl_ ? impl_->PolledState() : WorkState::kFailed; }

absl::Status Work::status() const {
  if (impl_ == nullptr) return absl::FailedPreconditionError("empty Work handle");
  return impl_->status();
}

uint64_t Work::seq() const { return impl_ ? impl_->seq() : 0; }

}  // namespace adaptcomm

#include "lib/core/executor/op_executor.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adaptcomm/status.h"
#include "lib/base/log.h"
#include "lib/base/wall_clock.h"

namespace adaptcomm::internal {
namespace {

// While host ops are left to their waiters (defer_to_waiter_): how long the worker keeps ticking
// (ExecutorOptions::waiter_tick) after the last one.
constexpr absl::Duration kTickingIdle = absl::Milliseconds(50);

}  // namespace

// Debian's abseil is built without NDEBUG, so every absl::Mutex operation also updates a
// process-wide lock-order graph under a global lock: an uncontended lock/unlock costs 40 ns instead
// of 12, and a stream-ordered op's host cost 2.4 us instead of 1.4. The first executor turns that
// debug check off, unless ADAPTCOMM_ABSL_DEADLOCK_DETECTION=1 asks to keep it (the setting is the
// whole process's). TSan's lock-order detector covers our mutexes in the sanitizer builds.
namespace {
void QuietAbslDeadlockDetection() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* keep = std::getenv("ADAPTCOMM_ABSL_DEADLOCK_DETECTION");
    if (keep != nullptr && std::string_view(keep) == "1") return;
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}
}  // namespace

OpExecutor::OpExecutor(std::unique_ptr<Backend> backend, ExecutorOptions options)
    : backend_(backend.get()),
      replay_(2 * std::clamp<size_t>(options.in_flight_with_retries, 1, kInFlightWithoutRetries),
              options.retry_record_bytes, options.copy_inputs),
      options_(options) {
  QuietAbslDeadlockDetection();
  ExecutorLock lock(this);
  owned_backends_.push_back(std::move(backend));
  generation_ = requested_generation_ = options_.initial_generation;
  next_seq_ = options_.first_seq;
  last_completed_seq_ = options_.first_seq - 1;
  PublishMembershipLocked();
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

std::shared_ptr<WorkImpl> OpExecutor::Submit(OpDesc&& desc, int epoch) {
  ExecutorLock lock(this);
  desc.seq = next_seq_;
  if (step_.open != 0 && !step_.failure.ok()) {
    // The step is to be redone: the op does not run, and takes no number (every rank's numbers
    // realign when the step ends).
    absl::Status failed = StepFailedLocked(desc);
    desc.seq = 0;
    return WorkImpl::Failed(std::move(desc), std::move(failed));
  }
  if (aborted_.ok() && !stopping_ && IsDeviceOp(desc)) {
    if (StreamOrdered* ordered = backend().stream_ordered(); ordered != nullptr) {
      // The op's place in the caller's stream is where the caller issued it, whenever the worker
      // gets to it; a refusal does not take a sequence number (no rank queued anything).
      absl::StatusOr<std::shared_ptr<const StreamPosition>> position = ordered->MarkIssue(desc);
      if (!position.ok()) {
        desc.seq = 0;
        return WorkImpl::Failed(std::move(desc), position.status());
      }
      desc.issued_at = *std::move(position);
    }
  }
  ++next_seq_;
  // The op's one clock read: its enqueue time, and its start when it is launched right here.
  const absl::Time now = WallNow();
  // Launched right here: created running (no one else can see it before it is launched).
  const bool inline_launch = desc.issued_at != nullptr && CanLaunchInlineLocked();
  // Only a host op's waiter asks its executor for help (WorkImpl::HelpProgress): a device op's
  // Work goes without the reference (two atomic operations per op).
  std::weak_ptr<OpExecutor> helper;
  if (!IsDeviceOp(desc)) helper = weak_from_this();
  auto work = MakeWorkImpl(std::move(desc), now, std::move(helper),
                           inline_launch ? std::optional(now) : std::nullopt);
  work->set_membership_epoch(epoch < 0 ? static_cast<int>(changes_.size()) : epoch);
  work->set_step(step_.open);
  if (inline_launch) {
    LaunchInlineLocked(work);
    return work;
  }
  if (!aborted_.ok()) {
    work->Finish(absl::Status(aborted_.code(),
                              absl::StrCat("communicator was aborted: ", aborted_.message())));
  } else if (stopping_) {
    work->Finish(absl::FailedPreconditionError("communicator is shutting down"));
  } else {
    for (const auto& o : observers_) o->OnEnqueue(work->desc(), work->enqueue_time());
    if (deferred_seq_ != 0) {
      EndDeferralLocked();  // a second op before the first was waited for: the caller overlaps
    } else if (defer_to_waiter_ && queue_.empty() && !busy_ && DeviceIdleLocked() &&
               device_failure_.ok() && requested_generation_ <= generation_ &&
               WaiterMayRun(work->desc())) {
      deferred_seq_ = work->desc().seq;
      last_deferred_ = work->enqueue_time();
    }
    queue_.push_back(work);
  }
  return work;
}

bool OpExecutor::WaiterMayRun(const OpDesc& desc) const {
  return !IsDeviceOp(desc) && backend().capabilities().runs_on_any_thread;
}

void OpExecutor::EndDeferralLocked() {
  deferred_seq_ = 0;
  defer_to_waiter_ = false;
}

bool OpExecutor::RunOnWaiter(const WorkImpl* work) {
  // Without the executor's lock: every stream-ordered Wait comes here (the backend pointer is
  // atomic, and a replaced backend stays alive).
  if (!WaiterMayRun(work->desc())) return false;
  ExecutorLock lock(this);
  if (!aborted_.ok() || stopping_ || busy_ || queue_.empty() || queue_.front().get() != work ||
      !device_failure_.ok() || requested_generation_ > generation_ || !DeviceIdleLocked()) {
    // Waiting for the op the worker has just started: this caller waits right after issuing, so
    // its next op is left to it.
    if (RunningLocked() == work && WallNow() - work->enqueue_time() < options_.waiter_tick) {
      defer_to_waiter_ = true;
      last_deferred_ = work->enqueue_time();
    }
    return false;
  }
  defer_to_waiter_ = true;
  last_deferred_ = work->enqueue_time();
  RunHeadLocked();
  return true;
}

void OpExecutor::Expedite(const WorkImpl* work) {
  if (!WaiterMayRun(work->desc())) return;  // never deferred
  ExecutorLock lock(this);
  if (deferred_seq_ != 0 && deferred_seq_ == work->desc().seq) EndDeferralLocked();
}

void OpExecutor::ExpireDeferralLocked(absl::Time now) {
  if (deferred_seq_ != 0 && !queue_.empty() && queue_.front()->desc().seq == deferred_seq_ &&
      now - queue_.front()->enqueue_time() >= options_.waiter_tick) {
    EndDeferralLocked();  // issued and not waited for within a tick: the caller overlaps
  }
  if (deferred_seq_ == 0 && now - last_deferred_ >= kTickingIdle) defer_to_waiter_ = false;
}

bool OpExecutor::CanLaunchInlineLocked() const {
  return aborted_.ok() && !stopping_ && queue_.empty() && !busy_ && device_failure_.ok() &&
         requested_generation_ <= generation_ && in_flight_.size() < InFlightWindow() &&
         !pre_run_check_;
}

void OpExecutor::LaunchInlineLocked(std::shared_ptr<WorkImpl>& work) {
  // Queuing a stream-ordered op on the device cannot block on the device or on peers, and nothing
  // but this op runs here (the executor is idle and busy_ keeps the worker off): the caller pays
  // for its own launch instead of a hand-off to the worker and back. It starts when it was queued
  // (a few instructions later): no second clock read.
  WorkImpl& op = *work;
  const absl::Time started = op.enqueue_time();
  busy_ = true;
  running_ = true;
  // Lent rather than copied (two atomic operations per op): only this thread replaces executing_
  // while busy_, and takes it back below.
  executing_ = std::move(work);
  running_since_ = started;
  UnlockAndWake();
  // Nothing else finishes it meanwhile: it is in neither queue_ nor in_flight_, and running_ keeps
  // Abort() off executing_. The observers hear of it before it can end (it is not launched yet).
  for (const auto& o : observers_) o->OnEnqueueAndStart(op.desc(), started);
  std::optional<Launched> launched;
  absl::Status status = RunWithRetry(op, started, &launched);
  mu_.Lock();
  work = std::move(executing_);
  if (launched.has_value()) RecordLaunchLocked(work, *std::move(launched));
  running_ = false;
  busy_ = false;
  // Not launched: refused before anything was queued (InvalidArgument), or the backend is no
  // longer stream-ordered and ran it to completion.
  if (!launched.has_value()) CompleteLocked(work, std::move(status));
}

void OpExecutor::RunHeadLocked() {
  std::shared_ptr<WorkImpl> work = std::move(queue_.front());
  queue_.pop_front();
  if (work->desc().seq == deferred_seq_) deferred_seq_ = 0;
  const absl::Time started = WallNow();
  if (!work->MarkRunning(started)) return;  // finished by an abort while queued
  busy_ = true;
  running_ = true;
  executing_ = work;
  running_since_ = started;
  const OpDesc& desc = work->desc();
  UnlockAndWake();
  for (const auto& o : observers_) {
    o->OnStart(desc, started);
    for (const std::shared_ptr<WorkImpl>& m : work->group_members()) o->OnStart(m->desc(), started);
  }
  std::optional<Launched> launched;
  absl::Status status = RunWithRetry(*work, started, &launched);
  if (launched.has_value()) {
    // On the device (or handed to the device-failure path): the watchdog finishes it.
    mu_.Lock();
    RecordLaunchLocked(work, *std::move(launched));
    running_ = false;
    executing_ = nullptr;
    busy_ = false;
    return;
  }
  if (!status.ok()) {
    ADAPTCOMM_LOG(kDebug, OpKindName(desc.kind), " #", desc.seq, " failed: ", status.ToString());
    if (ReportToPeers(status)) {
      {
        // The backend returned: the watchdog has nothing left to bound; the handler bounds itself.
        ExecutorLock lock(this);
        running_ = false;
      }
      // A group is reported at its own number, which every rank's group shares.
      OpDesc reported = desc;
      reported.seq = work->first_seq();
      status = failure_handler_->OnOpFailure(reported, std::move(status));
      if (break_hook_) break_hook_(status);
    }
  }
  mu_.Lock();
  CompleteLocked(work, std::move(status));
  running_ = false;
  executing_ = nullptr;
  busy_ = false;
}

void OpExecutor::CompleteLocked(const std::shared_ptr<WorkImpl>& work, absl::Status status) {
  if (status.ok()) last_completed_seq_ = std::max(last_completed_seq_, work->last_seq());
  End(*work, std::move(status), WallNow());
}

void OpExecutor::End(WorkImpl& work, absl::Status status, absl::Time when,
                     std::optional<absl::Duration> device_time) {
  for (const auto& o : observers_) {
    if (device_time.has_value()) o->OnDeviceTime(work.desc(), *device_time);
    o->OnEnd(work.desc(), status, when);
    for (const std::shared_ptr<WorkImpl>& m : work.group_members()) {
      o->OnEnd(m->desc(), status, when);
    }
  }
  work.Finish(std::move(status));
}

size_t OpExecutor::InFlightWindow() const {
  // The window keeps every restart point a vote can produce within the records; without copies
  // (retry.replay auto) there are none to keep, and the device gets the whole pipeline.
  return retries_ && options_.copy_inputs ? replay_.depth() / 2 : kInFlightWithoutRetries;
}

absl::StatusOr<OpDesc> OpExecutor::ForCurrentMembership(const WorkImpl& work) const {
  std::vector<MembershipChange> since;
  {
    absl::MutexLock lock(&mu_);  // reads only: wakes no one
    for (size_t e = static_cast<size_t>(std::max(work.membership_epoch(), 0)); e < changes_.size();
         ++e) {
      since.push_back(changes_[e]);
    }
  }
  std::vector<const MembershipChange*> changes;
  for (const MembershipChange& c : since) changes.push_back(&c);
  return TranslateOp(work.desc(), changes);
}

absl::Status OpExecutor::Execute(const WorkImpl& work, absl::Time started,
                                 std::optional<Launched>* launched) {
  launched->reset();
  if (work.heads_group()) return ExecuteGroup(work, started, launched);
  if (work.membership_epoch() != epoch_.load()) {
    // Issued before a membership change: run as it reads now, or fail it for the trainer to redo.
    absl::StatusOr<OpDesc> translated = ForCurrentMembership(work);
    if (!translated.ok()) return translated.status();
    return ExecuteAs(*translated, started, launched);
  }
  return ExecuteAs(work.desc(), started, launched);
}

absl::Status OpExecutor::ExecuteAs(const OpDesc& desc, absl::Time started,
                                   std::optional<Launched>* launched) {
  if (desc.wire.has_value() && !backend().capabilities().wire_cast) {
    // A rebuilt backend of another kind would run it as a plain f32 allreduce.
    return absl::InvalidArgumentError(
        absl::StrCat(OpKindName(desc.kind), " #", desc.seq, ": backend ", backend().name(),
                     " cannot send f32 data as ", DTypeName(*desc.wire), " (no wire_cast)"));
  }
  StreamOrdered* ordered = desc.issued_at != nullptr ? backend().stream_ordered() : nullptr;
  if (ordered == nullptr) return backend().Run(desc);  // e.g. degraded to staged Gloo
  // The retry record's copy of the input (or its restore before a re-run), if any, was queued on
  // the backend's stream behind the op's issue point (ReplayLog, StreamOrdered::CopyAt): the op
  // keeps the place in the caller's stream where it was issued.
  absl::StatusOr<std::shared_ptr<DeviceCompletion>> completion = ordered->Launch(desc);
  if (!completion.ok() && (absl::IsInvalidArgument(completion.status()) ||
                           absl::IsFailedPrecondition(completion.status()))) {
    // Refused before anything was queued (bad arguments, a capturing stream): local to this op.
    return completion.status();
  }
  launched->emplace(Launched{std::move(completion), started});
  return absl::OkStatus();
}

void OpExecutor::RecordLaunchLocked(const std::shared_ptr<WorkImpl>& work, Launched launched) {
  if (!launched.completion.ok()) {
    // The ops in flight before this one are not finished either: they fail, and are retried,
    // together with it, from the oldest (the position every rank votes on).
    in_flight_.push_back(InFlight{work, nullptr});
    if (device_failure_.ok()) device_failure_ = launched.completion.status();
    return;
  }
  if (in_flight_.empty()) head_since_ = launched.started;
  // A group's ops share its one completion: a Wait on any of them makes the caller's stream wait
  // for the whole group.
  for (const std::shared_ptr<WorkImpl>& m : work->group_members()) {
    (void)m->MarkLaunched(*launched.completion);
  }
  in_flight_.push_back(InFlight{work, work->MarkLaunched(*std::move(launched.completion))});
}

uint64_t OpExecutor::next_seq() const {
  absl::MutexLock lock(&mu_);  // reads only: wakes no one
  return next_seq_;
}

bool OpExecutor::Aborted() const {
  absl::MutexLock lock(&mu_);  // reads only: wakes no one
  return !aborted_.ok();
}

absl::Status OpExecutor::health() const {
  {
    absl::MutexLock lock(&mu_);  // reads only: wakes no one
    if (!aborted_.ok()) return aborted_;
  }
  return backend().health();
}

int OpExecutor::generation() const {
  absl::MutexLock lock(&mu_);  // reads only: wakes no one
  return generation_;
}

OpExecutor::MembershipSnapshot OpExecutor::membership() const {
  // Every op reads it: without mu_ (PublishMembershipLocked). A read that overlapped a change,
  // which takes a few stores, is read again.
  while (true) {
    const uint64_t version = membership_version_.load();
    const MembershipSnapshot m{epoch_.load(), member_rank_.load(), member_world_.load(),
                               member_generation_.load()};
    if ((version & 1) == 0 && membership_version_.load() == version) return m;
  }
}

bool OpExecutor::WorkerReadyLocked() const {
  if (busy_) return false;
  if (!device_failure_.ok()) return true;
  const bool recovery = requested_generation_ > generation_;
  // A retry another rank asked for while ops are in flight arrives as their failure.
  if (recovery) return DeviceIdleLocked();
  if (queue_.empty()) return stopping_ && DeviceIdleLocked();
  if (queue_.front()->desc().seq == deferred_seq_ && !stopping_) return false;  // its waiter's
  // A stream-ordered op joins those in flight (up to the window); any other op runs alone,
  // after the device finished them (one NCCL communicator, one order of its ops).
  const bool ordered =
      queue_.front()->desc().issued_at != nullptr && backend_.load()->stream_ordered() != nullptr;
  return ordered ? in_flight_.size() < InFlightWindow() : DeviceIdleLocked();
}

bool OpExecutor::WorkerWakesLocked() const {
  return defer_to_waiter_ != worker_ticking_ || (worker_awaits_idle_ && !busy_) ||
         WorkerReadyLocked();
}

OpExecutor::Sleepers OpExecutor::SleepersToWakeLocked() const {
  return Sleepers{worker_sleeping_ && WorkerWakesLocked(),
                  watchdog_sleeping_ && WatchdogWakesLocked()};
}

void OpExecutor::Wake(Sleepers sleepers) {
  if (sleepers.worker) worker_cv_.Signal();
  if (sleepers.watchdog) watchdog_cv_.Signal();
}

void OpExecutor::WakeSleepersLocked() { Wake(SleepersToWakeLocked()); }

void OpExecutor::UnlockAndWake() {
  // Decided under mu_, signalled after it: absl wakes a timed CondVar waiter at once, and one
  // woken while mu_ is still held would only wait for it (or, for the ticking worker, win the race
  // for the op its caller is about to run). A sleeper that wakes meanwhile on its own re-checks
  // its predicate under mu_, so no wake-up is lost.
  const Sleepers sleepers = SleepersToWakeLocked();
  mu_.Unlock();
  Wake(sleepers);
}

void OpExecutor::SleepLocked(absl::CondVar& cv, bool* sleeping, bool (OpExecutor::*wakes)() const,
                             absl::Time deadline) {
  WakeSleepersLocked();  // the other sleeper, for what this thread changed before sleeping
  *sleeping = true;
  while (!(this->*wakes)()) {
    if (cv.WaitWithDeadline(&mu_, deadline)) break;  // the deadline passed
  }
  *sleeping = false;
}

void OpExecutor::WorkerLoop() {
  ExecutorLock lock(this);
  while (true) {
    worker_ticking_ = defer_to_waiter_;
    // While a waiter runs its op nothing can be deferred before it ends, and ticks meanwhile would
    // only preempt the ranks (a 64 MiB op would see 40 of them): one wake-up at its end instead.
    worker_awaits_idle_ = worker_ticking_ && busy_;
    const bool ticks = worker_ticking_ && !worker_awaits_idle_;
    SleepLocked(worker_cv_, &worker_sleeping_, &OpExecutor::WorkerWakesLocked,
                ticks ? absl::Now() + options_.waiter_tick : absl::InfiniteFuture());
    worker_awaits_idle_ = false;
    if (ticks) ExpireDeferralLocked(WallNow());
    if (!WorkerReadyLocked()) continue;
    if (!device_failure_.ok()) {
      absl::Status cause = std::move(device_failure_);
      device_failure_ = absl::OkStatus();
      std::deque<std::shared_ptr<WorkImpl>> failed = TakeUnfinishedInFlightLocked();
      if (failed.empty()) continue;  // all done after all; the broken backend fails the next op
      busy_ = true;
      UnlockAndWake();
      HandleDeviceFailure(std::move(failed), std::move(cause));
      mu_.Lock();
      busy_ = false;
      continue;
    }
    if (requested_generation_ > generation_) {
      RecoverIdleLocked();
      continue;
    }
    if (queue_.empty()) return;  // stopping and drained
    RunHeadLocked();
  }
}

void OpExecutor::Abort(const absl::Status& reason) {
  std::deque<std::shared_ptr<WorkImpl>> dropped;
  absl::Status aborted_status;
  {
    ExecutorLock lock(this);
    if (aborted_.ok()) aborted_ = reason.ok() ? absl::AbortedError("aborted") : reason;
    aborted_status = aborted_;
    dropped.swap(queue_);
    deferred_seq_ = 0;
    // The op being executed may be in a coordinated retry's vote or a failure report (store
    // waits the backend's abort cannot end): its waiters are released now; the worker finishes
    // later, and its result is dropped (the first Finish wins).
    if (executing_ != nullptr && !running_) dropped.push_back(executing_);
    // On the device: their Works fail now (Synchronize returns at once); the watchdog still
    // retires them as the aborted backend ends them.
    for (const InFlight& f : in_flight_) dropped.push_back(f.work);
  }
  for (auto& work : dropped) {
    work->Finish(
        absl::AbortedError(absl::StrCat(OpKindName(work->desc().kind), " #", work->desc().seq,
                                        " cancelled: communicator aborted: ", reason.message())));
  }
  backend().Abort(reason);
  if (break_hook_) break_hook_(aborted_status);
}

void OpExecutor::Shutdown() {
  bool pending;
  {
    ExecutorLock lock(this);
    if (stopping_ && !worker_.joinable() && !watchdog_.joinable()) return;
    stopping_ = true;
    // Ops still queued or in flight get half the abort bound to finish; then they are aborted, so
    // that destroying a communicator whose peer died or hangs does not wait out the op timeout
    // (the teardown matrix of #14; pytorch#180611 hangs there). The other half is the abort's.
    auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return queue_.empty() && !busy_ && !running_ && DeviceIdleLocked();
    };
    WakeSleepersLocked();  // stopping_: the worker and the watchdog drain, then stop
    pending = !mu_.AwaitWithTimeout(absl::Condition(&drained), options_.abort_bound / 2);
  }
  if (pending) {
    Abort(absl::CancelledError(
        absl::StrCat("communicator destroyed with operations still pending after ",
                     absl::FormatDuration(options_.abort_bound / 2))));
  }
  if (watchdog_.joinable()) watchdog_.join();
  bool stuck;
  {
    ExecutorLock lock(this);
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

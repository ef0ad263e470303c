// OpExecutor: runs a communicator's operations one at a time, in sequence order, on its Backend.
//
// Backend code runs only on the executor's own worker thread (and, for a coordinated retry, on
// that same thread): never on a caller's thread. A caller's Work::Wait(d) therefore only waits,
// and returns within d whatever the backend does (a hung op ahead of it, a retry in progress),
// and the backend never inherits a trainer thread's state (its CUDA device, its signal mask).
//
// A watchdog thread bounds every running op: past its timeout plus a grace period it aborts the
// backend, and past the abort bound it fails the Work itself so no waiter hangs even if the
// backend never returns.
//
// Stream-ordered device ops (Backend::stream_ordered(), CUDA views): Submit marks the op's place
// in the caller's stream on the caller's thread (one event record: it cannot block, and it is
// what makes the op's position independent of when the worker gets to it). When the executor is
// idle the caller also queues the op on the device itself (a few non-blocking CUDA/NCCL calls for
// its own op only; a hand-off to the worker and back would cost more than the op's launch);
// otherwise the worker does, and moves on to the next op without waiting for the device. Up to a
// window of ops are in flight: 1024 with retries off; with coordinated retry on,
// ExecutorOptions::in_flight_with_retries (8 by default), so that the retry record (ReplayLog,
// twice as many entries) covers every restart point a vote can produce (a rank's first unfinished
// op is at most a window behind another's). The watchdog polls the oldest op in
// flight (every millisecond while any is; faster while ops wait in the queue for the window, see
// kBacklogPollMin) and finishes its Work when the device is done; a device
// failure or an op past its timeout (counted from when it became the oldest) aborts the backend
// and hands the ops in flight to the worker, which retries them in order (or fails them).
#ifndef ADAPTCOMM_LIB_CORE_EXECUTOR_OP_EXECUTOR_H_
#define ADAPTCOMM_LIB_CORE_EXECUTOR_OP_EXECUTOR_H_

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adaptcomm/ext/backend.h"
#include "lib/core/elastic/membership.h"
#include "lib/core/executor/replay_log.h"
#include "lib/core/executor/work_impl.h"
#include "lib/trace/op_observer.h"

namespace adaptcomm::internal {

// Stream-ordered ops in flight at once without retries (with them: ExecutorOptions). Past it an
// op's Wait blocks until the device finishes the oldest one.
inline constexpr size_t kInFlightWithoutRetries = 1024;

struct ExecutorOptions {
  // How long past an op's own timeout the watchdog waits before aborting the backend (backends
  // honour the timeout themselves; this catches one that does not).
  absl::Duration watchdog_grace = absl::Seconds(1);
  // How long an abort may take before the watchdog fails the Work without the backend.
  absl::Duration abort_bound = absl::Seconds(5);
  // A process that joins a running job (elastic grow, #14) starts at the job's generation and
  // sequence number, so that its votes and positions line up with the members'.
  int initial_generation = 0;
  uint64_t first_seq = 1;
  // While host ops are left to their waiters (RunOnWaiter): how often the worker looks for one no
  // one came for; such an op starts within two ticks.
  absl::Duration waiter_tick = absl::Microseconds(500);
  // Stream-ordered ops in flight at once while coordinated retry is on (profile retry.in_flight).
  // The replay record keeps twice as many ops: a window behind and a window ahead of this rank's
  // oldest unfinished op cover every restart point a vote can produce.
  size_t in_flight_with_retries = 8;
  // Device memory those records may hold (profile retry.record_bytes; ReplayLog).
  uint64_t retry_record_bytes = uint64_t{1} << 30;
  // Copy every op's input for a retry (retry.replay copy), or only take records that need none
  // (auto; ReplayLog).
  bool copy_inputs = true;
};

// Decides what a failed op's Work reports: called on the thread that ran the op, without the
// executor's lock, for every failure except InvalidArgument (a caller bug, local to the call).
// It may publish the failure, wait for the other ranks' reports, and enrich the status.
class FailureHandler {
 public:
  virtual ~FailureHandler() = default;
  virtual absl::Status OnOpFailure(const OpDesc& op, absl::Status status) = 0;
};

// A coordinated retry's agreement: where every rank restarts, and the rebuilt backend.
struct RecoveryPlan {
  uint64_t restart_seq = 0;  // the smallest position over all ranks
  // The largest position over all ranks, and the largest sequence number any rank had issued when
  // it voted: a step's recovery tells from them whether some rank got past the step's commit, and
  // where every rank's sequence goes on from (OpExecutor, "Steps").
  uint64_t max_position = 0;
  uint64_t max_issued = 0;
  int generation = 0;  // of the new backend
  std::unique_ptr<Backend> backend;
  // Set when ranks were lost and the survivors go on without them (elastic shrink): the backend is
  // built for the new world, and ops issued before it are renumbered or failed (TranslateOp).
  std::optional<MembershipChange> change;
  // Called once the new backend is installed, before any op runs on it (the trainer's callback).
  std::function<void()> on_installed;
};

// Agrees with every rank on a restart point after a retryable failure and builds the next
// generation's backend. Called on the executing thread, without the executor's lock; bounds itself.
class RecoveryHandler {
 public:
  virtual ~RecoveryHandler() = default;
  // `position`: the first op this rank has not completed; `fingerprint`: what that op is
  // ("allreduce f32[4096] sum"), empty when the rank is idle there. `generation`: the one to
  // build. Errors name the ranks that did not take part (dead or stalled), or, when ranks are in
  // different ops at the same position (mismatched collectives), those ranks and ops
  // (InvalidArgument: never retried).
  // `issued_through`: the last sequence number this rank has given an op.
  virtual absl::StatusOr<RecoveryPlan> Recover(int generation, uint64_t position,
                                               uint64_t issued_through,
                                               const std::string& fingerprint, int attempt,
                                               const absl::Status& cause) = 0;
  // Including the first try; 1 = no retries.
  virtual int max_attempts() const = 0;
  // Whether `status` is one the policy retries (never InvalidArgument).
  virtual bool Retryable(const absl::Status& status) const = 0;
};

// What every rank must agree an op is ("allreduce f32[4096] sum"): compared across ranks when
// they vote on a retry, and by the collective check.
std::string OpFingerprint(const OpDesc& op);
// A group's: its collectives in issue order (its sends and receives may differ between ranks).
std::string GroupFingerprint(const WorkImpl& head);

// Why an op has no replay record (RecoverUnrecorded): a group's, and one of retry.replay auto.
inline constexpr absl::string_view kGroupNotReRun =
    "a group takes no replay record and is never re-run alone";
inline constexpr absl::string_view kReplayAutoNoCopy =
    "retry.replay auto keeps no copy of its input";

// Aborted with the step-redo payload (IsStepRedo): a step's op, or the step, to be redone.
absl::Status StepRedoStatus(std::string message);

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
  // Runs before each op's first attempt with the op and its fingerprint ("allreduce f32[8] sum");
  // a failure fails the op without running it. REQUIRES: before Start().
  using PreRunCheck = std::function<absl::Status(const OpDesc&, const std::string& fingerprint)>;
  void SetPreRunCheck(PreRunCheck check) { pre_run_check_ = std::move(check); }
  void SetFailureHandler(std::shared_ptr<FailureHandler> handler) {
    failure_handler_ = std::move(handler);
  }
  // Called without mu_ each time the communicator fails for good: an abort, an op failure that the
  // failure handler reported to every rank, a coordinated retry that failed (not one that
  // recovered). May be called more than once; it must not wait for this executor's ops.
  // REQUIRES: before Start().
  void SetBreakHook(std::function<void(const absl::Status&)> hook) {
    break_hook_ = std::move(hook);
  }
  // Called by the watchdog at least once a second while it is alive (see HeartbeatMonitor).
  void SetHeartbeat(std::function<void()> beat) { heartbeat_ = std::move(beat); }
  void SetRecoveryHandler(std::shared_ptr<RecoveryHandler> handler) {
    retries_ = handler != nullptr && handler->max_attempts() > 1;
    recovery_handler_ = std::move(handler);
  }
  // Another rank started a coordinated retry that builds `generation`: join it. A running op is
  // interrupted (it then recovers); an idle executor recovers on its worker. Stale requests (an
  // older generation) are ignored.
  void RequestRecovery(int generation);
  int generation() const;
  // Ops outside a step that ran with coordinated retry on but could not be re-run alone (no
  // record: retry.replay auto and an op that overwrites its input, a record past its budget, ...).
  uint64_t unprotected_ops() const { return unprotected_ops_.load(std::memory_order_relaxed); }
  // The membership ops are issued under: its number (changes so far), and the current backend's
  // rank and size, read together.
  struct MembershipSnapshot {
    int epoch = 0;
    int rank = 0;
    int world_size = 1;
    int generation = 0;
  };
  MembershipSnapshot membership() const;
  // Whether Abort() was called (by the caller or because another rank failed): never retried.
  bool Aborted() const;
  // OK, or what broke the communicator: an abort or a recovery that failed (every new op fails
  // fast with it), else the backend's own health.
  absl::Status health() const;
  // Whether another rank asked for a retry this executor has not joined yet.
  bool RecoveryRequested() const;
  // Starts the worker and watchdog threads. Call once, right after construction.
  void Start();
  // Queues `desc` (seq assigned here) and returns its work. For a stream-ordered device op also
  // records its place in the caller's stream (StreamOrdered::MarkIssue).
  // `epoch`: the membership the caller validated `desc` against (membership().epoch); -1: the
  // current one.
  std::shared_ptr<WorkImpl> Submit(OpDesc&& desc, int epoch = -1);
  // Queues a group (Communicator::GroupEnd): `works` (WorkImpl::Grouped, in issue order, at least
  // one) run as one unit headed by the first. The group takes a sequence number, which its sends
  // and receives carry, and one more per collective, in issue order (so every rank's group takes
  // the same numbers, whatever its sends and receives). It runs through the
  // backend's GroupRunner, or one after the other on a backend without one. A group of device ops
  // on a stream-ordered backend is stream-ordered as one op: each op's place in its stream is
  // taken here (at GroupEnd), the group is launched as one unit (StreamOrdered::LaunchGroup) and
  // joins the ops in flight, and a Wait on any of its ops makes the caller's stream wait for the
  // whole group. Any other group runs to completion on the executing thread, behind the ops in
  // flight. Every op of the group ends with the group's status. A group takes no replay record
  // and is never re-run: inside a step its failure redoes the step; outside one the coordinated
  // vote runs and its ops fail with the redo status, as an unrecorded op's (in flight: unless a
  // Wait let a caller's stream past one of its ops, which breaks the communicator, DataLoss).
  // Returns the refusal of a group that was not queued (MarkGroupIssueLocked: its ops fail with
  // it), else OK.
  [[nodiscard]] absl::Status SubmitGroup(std::vector<std::shared_ptr<WorkImpl>> works,
                                         int epoch = -1);
  // A caller that waits for `work` without a bound runs it on its own thread when nothing else can
  // run in the meantime: `work` is next in the queue, the executor is idle (no op running, none in
  // flight, no retry pending), it is a host op and the backend runs on any thread
  // (Capabilities::runs_on_any_thread). The op then runs exactly as on the worker (watchdog,
  // failure handler, coordinated retry); it saves the hand-off to the worker and back, which costs
  // more than a small op on shared memory. Returns whether it ran the op (finished when it
  // returns). A caller that waits this way for the op it just issued makes the next ops wait for
  // their waiters instead of waking the worker (see defer_to_waiter_); each is still started by
  // the worker within two ticks (ExecutorOptions::waiter_tick) if no one comes for it.
  bool RunOnWaiter(const WorkImpl* work);
  // Someone wants `work` to progress without running it (a bounded wait, a state query): if it was
  // left to its waiter, the worker takes it now.
  void Expedite(const WorkImpl* work);
  // Elastic grow (Communicator::AdmitJoiners): runs `reconfigure` on the calling thread while the
  // executor is idle (nothing queued, running or in flight, no retry pending; FailedPrecondition
  // otherwise) and installs the backend and membership change it returns. Ops submitted meanwhile
  // wait for it. A failure leaves the current backend in place.
  absl::Status Reconfigure(const std::function<absl::StatusOr<RecoveryPlan>()>& reconfigure);
  // The sequence number the next submitted op gets.
  uint64_t next_seq() const;

  // ---- Steps (Communicator::BeginStep / CommitStep; op_executor_steps.cc) ----
  // Ops issued while a step is open belong to it: they take no replay record and are never re-run
  // alone. The first failure of one of them, on any rank, recovers the communicator at once (the
  // retry vote and rebuild, with every rank's position at the step's first op, so no rank has
  // anything to re-run) and fails the step's other ops without running them; CommitStep then
  // tells the trainer to redo the step. A vote's sequence numbers realign every rank at the step's
  // end (the ranks may have given different numbers of the step's ops a number before they
  // learnt of the failure).
  // Opens a step. FailedPrecondition if one is open. Waits up to `bound` for a recovery in
  // progress to end first (a rank between steps joins the recovery of another's failed step).
  absl::Status BeginStep(absl::Duration bound);
  // Whether a step is open.
  bool StepOpen() const;
  // Ops issued in the open step so far (0 when none is open).
  uint64_t StepOpsIssued() const;
  // The open step (if any) fails with `cause` (an op refused at the call): its later ops do not
  // run and its commit reports `cause`.
  void FailStep(const absl::Status& cause);
  // What became of the open step, which it closes. Waits up to `bound` for every op issued before
  // to end, and for a recovery in progress.
  struct StepOutcome {
    uint64_t step = 0;       // its number (1, 2, ...)
    absl::Status failure;    // the first failure of one of its ops here or on another rank
    bool recovered = false;  // the communicator recovered from it
    // Some rank had got past op `seq` when the recovery voted: true for the step's commit op, the
    // step is committed there, hence everywhere (see Communicator::CommitStep).
    uint64_t max_position = 0;
  };
  absl::StatusOr<StepOutcome> EndStep(absl::Duration bound);
  // Waits until every op issued before has ended (device ops included) and no recovery runs, or
  // the executor is aborted or stopping: then nothing runs on the backend until the next op is
  // issued. DeadlineExceeded naming `what` past `deadline`.
  absl::Status AwaitDrained(absl::Time deadline, const char* what);
  // Fails every queued op with `reason`, aborts the running one. Idempotent.
  void Abort(const absl::Status& reason);
  // Lets queued and in-flight ops finish for half the abort bound, aborts those still pending,
  // then stops the threads.
  void Shutdown();

  Backend& backend() { return *backend_.load(); }
  const Backend& backend() const { return *backend_.load(); }

 private:
  void WorkerLoop();
  void WatchdogLoop();

  // The worker and the watchdog sleep on condition variables, not on mu_ with an absl::Condition:
  // absl evaluates a Condition waiter's predicate on every release of the mutex
  // (Mutex::UnlockSlow), which cost every op two slow releases of mu_. Whoever releases mu_ wakes
  // them instead, when what they wait for came true: every hold of mu_ is an ExecutorLock, or ends
  // in UnlockAndWake.
  class ABSL_SCOPED_LOCKABLE ExecutorLock {
   public:
    explicit ExecutorLock(OpExecutor* executor) ABSL_EXCLUSIVE_LOCK_FUNCTION(executor->mu_)
        : executor_(executor) {
      executor_->mu_.Lock();
    }
    ~ExecutorLock() ABSL_UNLOCK_FUNCTION() { executor_->UnlockAndWake(); }
    ExecutorLock(const ExecutorLock&) = delete;
    ExecutorLock& operator=(const ExecutorLock&) = delete;

   private:
    OpExecutor* const executor_;
  };
  void UnlockAndWake() ABSL_UNLOCK_FUNCTION(mu_);
  // Which of the worker and the watchdog sleeps while what it waits for came true.
  struct Sleepers {
    bool worker = false;
    bool watchdog = false;
  };
  Sleepers SleepersToWakeLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Wake(Sleepers sleepers);
  // Signals them with mu_ held (before this thread sleeps, or awaits the drain in Shutdown).
  void WakeSleepersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sleeps on `cv` until (this->*wakes)() or `deadline`; mu_ is released meanwhile.
  void SleepLocked(absl::CondVar& cv, bool* sleeping, bool (OpExecutor::*wakes)() const,
                   absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker can run something: the head op, a device failure or a recovery, or its stop.
  bool WorkerReadyLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The worker must look again: it is ready, deferral started or stopped (it sleeps in ticks
  // exactly while deferral is on), or a waiter's op that it sleeps through ended.
  bool WorkerWakesLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The watchdog must look before watchdog_next_: an op started whose bound falls earlier, the ops
  // in flight went from none to some (or back), an op began waiting for them (a backlog: it polls
  // faster then), or the executor is stopping and drained.
  bool WatchdogWakesLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Beat();
  // Whether `desc` may run on a waiting caller's thread: a host op on a backend that runs on any
  // thread. Reads no guarded state.
  bool WaiterMayRun(const OpDesc& desc) const;
  // No op is left to its waiter any more, and the next ones wake the worker. REQUIRES: mu_ held.
  void EndDeferralLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the deferral of an op left unclaimed for a tick, and the worker's ticking once no op was
  // deferred for kTickingIdle. REQUIRES: mu_ held.
  void ExpireDeferralLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pops the head and runs it on the worker. REQUIRES: mu_ held, queue non-empty, !busy_.
  // Releases mu_ around the backend call.
  void RunHeadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stream-ordered op may be queued on the device by its issuing thread: the executor is idle,
  // the window has room and no check must run first. REQUIRES: mu_ held.
  bool CanLaunchInlineLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Runs `work` (just submitted) on the issuing thread; lends it to executing_ meanwhile and gives
  // it back. REQUIRES: mu_ held; released meanwhile.
  void LaunchInlineLocked(std::shared_ptr<WorkImpl>& work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stream-ordered op queued on the device (or whose launch failed there), not yet in
  // in_flight_: the executing thread records it (RecordLaunchLocked) under its next hold of mu_,
  // which saves taking mu_ once more per op.
  struct Launched {
    absl::StatusOr<std::shared_ptr<DeviceCompletion>> completion;
    absl::Time started;  // of the attempt that launched it
  };
  // Runs `op` (recording it for replay when retries are on) and, on a retryable failure, joins or
  // starts a coordinated retry. Called while busy_, without mu_. `started`: when it started (the
  // caller's clock read). *launched set: the op went to the device (stream-ordered); once recorded
  // it is the watchdog's.
  absl::Status RunWithRetry(const WorkImpl& work, absl::Time started,
                            std::optional<Launched>* launched);
  // A retryable failure of an op that has no record: the coordinated vote and rebuild all the
  // same (the vote names a rank that is gone), then the op fails with the redo status, or the
  // vote's error. Called while busy_, without mu_.
  // `why`: why it has no record, for the redo status. `fingerprint`: what the vote compares
  // (null: desc's own; a group's, GroupFingerprint).
  absl::Status RecoverUnrecorded(const OpDesc& desc, const absl::Status& cause,
                                 absl::string_view why, const std::string* fingerprint = nullptr);
  // RunWithRetry for an op of a step: no record, no re-run; a failure recovers the communicator
  // (RecoverStep) and the op fails with the step's redo status.
  absl::Status RunInStep(const WorkImpl& work, absl::Time started,
                         std::optional<Launched>* launched);
  // The communicator's recovery for a failed step (or, between steps, another rank's): votes
  // with the step's first op as this rank's position (or its next op between steps), installs the
  // new backend and notes where sequence numbers go on. Returns the redo status for `op` (null:
  // between steps), or the recovery's error. Called while busy_, without mu_.
  absl::Status RecoverStep(const OpDesc* op, const absl::Status& cause);
  // The status of `op` in the open step that failed. REQUIRES: mu_ held.
  absl::Status StepFailedLocked(const OpDesc& op) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether an op's failure goes to the FailureHandler (and so to the peers).
  bool ReportToPeers(const absl::Status& status) const;
  // Polls (every 100 us, mu_ released meanwhile) until `quiet` holds or `deadline`; for the
  // step boundaries, which wait only on the failure path.
  absl::Status AwaitQuiet(bool (OpExecutor::*quiet)() const, absl::Time deadline, const char* what);
  bool NoRecoveryLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool DrainedLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool NoRecovery() const;
  bool Drained() const;
  // One coordinated retry round from this rank's `position`; re-runs ops [restart, position) from
  // the replay log. Called while busy_, without mu_.
  absl::Status RecoverFrom(uint64_t position, const std::string& fingerprint, int attempt,
                           const absl::Status& cause);
  // Re-runs `op`, an op this rank completed already (a ReplayLog::DetachedCopy), to completion for
  // the ranks that did not. Called while busy_, without mu_.
  absl::Status RerunCompleted(const OpDesc& op);
  // The worker's recovery when another rank asked for one while this rank was idle.
  void RecoverIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `work`'s op on the current backend: Launch for a stream-ordered device op (its result in
  // *launched, for RecordLaunchLocked), else Run. Called while busy_, without mu_. `started`: when
  // this attempt started; an op that is the oldest in flight once launched has its device timeout
  // counted from there (its launch included), which saves a clock read per op.
  absl::Status Execute(const WorkImpl& work, absl::Time started, std::optional<Launched>* launched);
  // Runs a group headed by `work` (Execute's part for groups): launched on the device as one unit
  // when its ops have stream positions (*launched set), else to completion.
  // `started`: as Execute's.
  absl::Status ExecuteGroup(const WorkImpl& work, absl::Time started,
                            std::optional<Launched>* launched);
  // RunWithRetry's part for a group outside a step.
  absl::Status RunGroupWithRetry(const WorkImpl& work, absl::Time started,
                                 std::optional<Launched>* launched);
  // SubmitGroup's part for a group of device ops on a stream-ordered backend: each op's place in
  // its view's stream (StreamOrdered::MarkIssue), or the refusal of the first that has none (the
  // group is then not queued). Does nothing for any other group. REQUIRES: mu_ held, sequence
  // numbers assigned.
  absl::Status MarkGroupIssueLocked(const std::vector<std::shared_ptr<WorkImpl>>& works)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Execute's part once the op reads as `desc` on the current membership.
  absl::Status ExecuteAs(const OpDesc& desc, absl::Time started, std::optional<Launched>* launched);
  // Puts a launched op in flight (or, if its launch failed, hands the ops in flight to the
  // device-failure path). REQUIRES: mu_ held.
  void RecordLaunchLocked(const std::shared_ptr<WorkImpl>& work, Launched launched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ops in flight failed on the device (`cause`): retries them in order or fails them. On the
  // worker, while busy_, without mu_.
  void HandleDeviceFailure(std::deque<std::shared_ptr<WorkImpl>> failed, absl::Status cause);
  // DataLoss naming the first of `failed` whose Wait let the caller's stream go on (the
  // communicator is then broken: aborted_), else OK. Without mu_.
  absl::Status ReleasedOpLoss(const std::deque<std::shared_ptr<WorkImpl>>& failed,
                              const absl::Status& cause);
  // Watchdog: finishes the ops in flight the device completed; returns when the oldest one must
  // be looked at again. REQUIRES: mu_ held.
  absl::Time PollInFlightLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completed here: counts it and tells the observers. REQUIRES: mu_ held.
  void CompleteLocked(const std::shared_ptr<WorkImpl>& work, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the observers that `work` ended at `when` (and, first, how long the device executed it
  // when its backend timed it there), then finishes it; mu_ held or not (the watchdog ends the ops
  // the device finished after releasing it).
  void End(WorkImpl& work, absl::Status status, absl::Time when,
           std::optional<absl::Duration> device_time = std::nullopt);
  size_t InFlightWindow() const;
  // Empties in_flight_: the ops the device finished are completed, the others returned in order.
  // REQUIRES: mu_ held.
  std::deque<std::shared_ptr<WorkImpl>> TakeUnfinishedInFlightLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void InstallBackend(std::unique_ptr<Backend> backend, int generation,
                      std::optional<MembershipChange> change);
  // Copies what membership() reports for readers without mu_ (a seqlock: membership_version_ is
  // odd while they change). Called whenever the backend, changes_ or generation_ change.
  void PublishMembershipLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `work`'s op as it reads on the current membership (TranslateOp), or why it cannot run there.
  absl::StatusOr<OpDesc> ForCurrentMembership(const WorkImpl& work) const;

  // The current backend. Replaced only by the executing thread (busy_) during a retry; earlier
  // ones stay alive in owned_backends_ because other threads may still call Abort()/health() on
  // them.
  std::atomic<Backend*> backend_;
  // Used only by the executing thread (busy_). Declared before the backends so that it is
  // destroyed after them: a device record may still be the target of a copy queued on a
  // backend's stream, which the backend's teardown drains.
  ReplayLog replay_;
  std::vector<std::unique_ptr<Backend>> owned_backends_ ABSL_GUARDED_BY(mu_);
  int generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Membership changes so far: changes_[e] leads from epoch e to e + 1.
  std::vector<MembershipChange> changes_ ABSL_GUARDED_BY(mu_);
  // membership() as of the last PublishMembershipLocked(); epoch_ is changes_.size().
  std::atomic<uint64_t> membership_version_{0};
  std::atomic<int> epoch_{0};
  std::atomic<int> member_rank_{0};
  std::atomic<int> member_world_{1};
  std::atomic<int> member_generation_{0};
  int requested_generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_completed_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool replay_warned_ = false;  // likewise
  // Ops outside a step that ran with retries on but without a record (not re-run if they fail);
  // written by the executing thread, read by anyone.
  std::atomic<uint64_t> unprotected_ops_{0};
  // The op whose device failure was retried last, and the attempt its relaunch is: a relaunch the
  // rebuilt backend accepted that the device then fails again is that op's next attempt, not its
  // first (HandleDeviceFailure). Likewise used only by the executing thread.
  uint64_t device_retry_seq_ = 0;
  int device_retry_attempt_ = 0;
  const ExecutorOptions options_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<WorkImpl>> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // the worker is inside RunHeadLocked's backend phase
  // The op the executing thread is in, also while it votes or reports.
  std::shared_ptr<WorkImpl> executing_ ABSL_GUARDED_BY(mu_);
  // executing_ runs on the backend, and the watchdog bounds it (not while it votes or reports,
  // which bound themselves). A flag rather than a second reference: two atomic operations per op.
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  // The op the watchdog bounds, or null.
  WorkImpl* RunningLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return running_ ? executing_.get() : nullptr;
  }
  absl::Time running_since_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  struct StepState {
    uint64_t open = 0;       // the open step's number; 0: none
    uint64_t begun = 0;      // steps begun so far
    uint64_t begin_seq = 0;  // the open step's first op
    absl::Status failure;    // the open step's first failure (here, or another rank's retry)
    bool recovered = false;  // RecoverStep ran for it
    uint64_t max_position = 0;
    uint64_t realign_seq = 0;  // where sequence numbers go on from when it ends; 0: as they are
  };
  StepState step_ ABSL_GUARDED_BY(mu_);
  bool recovering_ ABSL_GUARDED_BY(mu_) = false;  // RecoverStep in progress
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  // Host ops left to their waiter (RunOnWaiter): while callers wait for their ops right after
  // issuing them, an op issued on an idle executor does not wake the worker, which would otherwise
  // race the waiter for it and make it sleep until the op is done (two wake-ups per op, which cost
  // more than a small op on shared memory). The worker then sleeps in ticks and takes such an op
  // itself once it has waited a tick unclaimed, or at once when the caller waits with a bound,
  // asks for its state, or issues another op first; each of those turns the deferral off again.
  bool defer_to_waiter_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t deferred_seq_ ABSL_GUARDED_BY(mu_) = 0;  // the queued op left to its waiter; 0: none
  // When the last op was left to (or run by) its waiter: the worker ticks until kTickingIdle after.
  absl::Time last_deferred_ ABSL_GUARDED_BY(mu_);
  bool worker_ticking_ ABSL_GUARDED_BY(mu_) = false;      // how the worker sleeps right now
  bool worker_awaits_idle_ ABSL_GUARDED_BY(mu_) = false;  // until the waiter's op ends
  absl::CondVar worker_cv_;
  absl::CondVar watchdog_cv_;
  bool worker_sleeping_ ABSL_GUARDED_BY(mu_) = false;
  bool watchdog_sleeping_ ABSL_GUARDED_BY(mu_) = false;
  // While the watchdog sleeps: the running op it last saw, whether nothing was in flight, whether
  // it polls at the backlog's pace, and when it wakes anyway (WatchdogWakesLocked).
  const WorkImpl* watchdog_watched_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool watchdog_idle_ ABSL_GUARDED_BY(mu_) = true;
  bool watchdog_backlog_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time watchdog_next_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Stream-ordered device ops queued on the device, oldest first, and their completion.
  struct InFlight {
    std::shared_ptr<WorkImpl> work;
    // Kept by `work` while it lives (WorkImpl::MarkLaunched); null: the launch failed.
    DeviceCompletion* completion = nullptr;
  };
  std::deque<InFlight> in_flight_ ABSL_GUARDED_BY(mu_);
  absl::Time head_since_ ABSL_GUARDED_BY(mu_);  // when in_flight_.front() became the oldest
  // How long the last op to complete was the oldest in flight: about its time on the device.
  absl::Duration last_head_time_ ABSL_GUARDED_BY(mu_);
  // Device ops the watchdog took from in_flight_ as done and is finishing (their Works) without
  // mu_: until then the device counts as busy for whatever must follow every op in flight.
  size_t ending_ ABSL_GUARDED_BY(mu_) = 0;
  bool DeviceIdleLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return in_flight_.empty() && ending_ == 0;
  }
  // Ops wait in the queue for those in flight (a full window, or an op that runs alone).
  bool BacklogLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() && !in_flight_.empty();
  }
  // Set by the watchdog when the ops in flight failed; the worker handles it.
  absl::Status device_failure_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<trace::OpObserver>> observers_;  // fixed after Start()
  std::shared_ptr<FailureHandler> failure_handler_;            // fixed after Start()
  PreRunCheck pre_run_check_;                                  // fixed after Start()
  std::shared_ptr<RecoveryHandler> recovery_handler_;          // fixed after Start()
  // recovery_handler_ allows more than one attempt: asked once, when it is set, not per op.
  bool retries_ = false;
  std::function<void()> heartbeat_;                      // fixed after Start()
  std::function<void(const absl::Status&)> break_hook_;  // fixed after Start()
  std::thread worker_;
  std::thread watchdog_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_EXECUTOR_OP_EXECUTOR_H_

// WorkImpl: the shared state of one operation, between the Work handle(s), the executor that runs
// it and the watchdog that bounds it.
#ifndef ADAPTCOMM_LIB_CORE_EXECUTOR_WORK_IMPL_H_
#define ADAPTCOMM_LIB_CORE_EXECUTOR_WORK_IMPL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adaptcomm/ext/backend.h"
#include "adaptcomm/work.h"
#include "lib/base/block_recycler.h"

namespace adaptcomm::internal {

class OpExecutor;

// An op on CUDA views: it never runs on a waiting caller's thread (OpExecutor::WaiterMayRun).
inline bool IsDeviceOp(const OpDesc& op) {
  return op.output.device.is_cuda() || op.input.device.is_cuda();
}

class WorkImpl;
// What every Work's state is made with. A device op's goes in a recycled block (MakeRecycled,
// lib/base/block_recycler.h): a trainer holds a
// step's device ops, whose allocations then took malloc's slow path at a cost comparable to the
// op's launch. A host op's comes from the heap, whose per-thread cache serves a Work freed right
// after its Wait without the block list's atomic operations, and costs little beside the op.
template <typename... Args>
std::shared_ptr<WorkImpl> MakeWorkImpl(OpDesc&& desc, Args&&... args) {
  if (!IsDeviceOp(desc)) {
    return std::make_shared<WorkImpl>(std::move(desc), std::forward<Args>(args)...);
  }
  return MakeRecycled<WorkImpl>(std::move(desc), std::forward<Args>(args)...);
}

class WorkImpl {
 public:
  // `enqueue_time`: when the op was issued (the caller's clock read, so that issuing one reads the
  // clock once). `executor`: the one that runs it (Wait() without a bound may run the op on the
  // waiting thread, OpExecutor::RunOnWaiter); empty for a Work that never runs, and for a device op
  // (never run on its waiter). `started`: set for an op that starts as it is created (running from
  // then, as if MarkRunning(started)).
  WorkImpl(OpDesc&& desc, absl::Time enqueue_time, std::weak_ptr<OpExecutor> executor = {},
           std::optional<absl::Time> started = std::nullopt);
  // A Work that failed before being queued (bad input, broken communicator).
  static std::shared_ptr<WorkImpl> Failed(OpDesc&& desc, absl::Status status);

  const OpDesc& desc() const { return desc_; }
  // desc().seq, readable by any thread while GroupEnd assigns it (AssignSeq).
  uint64_t seq() const { return seq_.load(std::memory_order_acquire); }

  // ---- Groups (Communicator::GroupStart/GroupEnd) ----
  // The Work of an op issued into an open group: pending, not queued; Wait and Synchronize fail at
  // once with FailedPrecondition until GroupEnd (they would otherwise wait for an op that cannot
  // start before the caller ends the group).
  static std::shared_ptr<WorkImpl> Grouped(OpDesc&& desc, std::weak_ptr<OpExecutor> executor);
  bool in_open_group() const { return in_open_group_.load(std::memory_order_acquire); }
  // GroupEnd, under the executor's lock, before the group is queued: the op's sequence number and
  // timeout (the group's: the largest of its ops'). Only this writes desc_ after construction; the
  // issuing side reads no more of desc_ than its kind and views until then (seq() is atomic).
  void AssignSeq(uint64_t seq, absl::Duration timeout);
  // GroupEnd, likewise, for a device op of a group that is launched stream-ordered: its place in
  // its view's stream (StreamOrdered::MarkIssue, taken at GroupEnd as ncclGroupEnd would).
  void SetIssuedAt(std::shared_ptr<const StreamPosition> position) {
    desc_.issued_at = std::move(position);
  }
  void EndOpenGroup() { in_open_group_.store(false, std::memory_order_release); }
  // The group's first op stands for the group in the executor's queue: it carries the others,
  // which start and end with it (MarkRunning, Finish) with its status. REQUIRES: before queued.
  // `first`..`last`: the sequence numbers the group takes (OpExecutor::SubmitGroup).
  static void FormGroup(const std::shared_ptr<WorkImpl>& head,
                        std::vector<std::shared_ptr<WorkImpl>> members, uint64_t first,
                        uint64_t last);
  // Whether this op heads a group, and the ops it carries (itself not included).
  bool heads_group() const { return heads_group_; }
  const std::vector<std::shared_ptr<WorkImpl>>& group_members() const { return group_members_; }
  // The first and last sequence numbers of the group this op heads (desc().seq for an op
  // outside a group): where every rank's group starts, whatever op it issued first.
  uint64_t first_seq() const { return heads_group_ ? group_first_seq_ : desc_.seq; }
  uint64_t last_seq() const { return heads_group_ ? group_last_seq_ : desc_.seq; }
  // A member's group head (null for a head or an op outside a group): a member's waiter helps the
  // group progress through it.
  std::shared_ptr<WorkImpl> group_head() const { return group_head_.lock(); }
  // The membership (OpExecutor::membership().epoch) the op was issued under. Set by the executor
  // before the work is shared.
  int membership_epoch() const { return membership_epoch_; }
  void set_membership_epoch(int epoch) { membership_epoch_ = epoch; }
  // The step (OpExecutor::BeginStep) the op was issued in; 0: none. Set like the epoch.
  uint64_t step() const { return step_; }
  void set_step(uint64_t step) { step_ = step; }

  // Pending -> running at `now` (the caller's clock read); the timeout clock starts here. False if
  // already terminal (aborted).
  bool MarkRunning(absl::Time now);
  // Any non-terminal state -> done/failed/timed out. The first call wins; later ones are ignored
  // (the watchdog and the executor may both try). Returns whether this call won.
  bool Finish(absl::Status status);

  // A stream-ordered device op is on the device now (Work::Wait's point); `completion` tells when
  // it is done. Called again with the new completion when a retry queues it again.
  // Returns `completion`, which the Work keeps until it goes (every launch's: the executor's record
  // of ops in flight refers to it without a reference of its own, one atomic operation per op).
  // REQUIRES: called by the thread executing the op (OpExecutor's busy_), never concurrently with
  // itself.
  DeviceCompletion* MarkLaunched(std::shared_ptr<DeviceCompletion> completion);
  // A retry is about to queue the op again in its own buffers: waiters wait for that. False, and
  // nothing changes for waiters, once a Wait may have let the caller's stream go on past the op
  // (its buffers may be read or rewritten by then): such an op is never re-run in place.
  [[nodiscard]] bool MarkRelaunching();
  // A Wait may have let the caller's stream go on past the op.
  bool released() const { return released_.load(); }

  absl::Status Wait(absl::Duration bound);
  absl::Status Synchronize(absl::Duration bound);
  WorkState state() const;
  // state() for the caller who polls its op: an op left to its waiter goes to the worker now.
  WorkState PolledState() const;
  absl::Status status() const;
  absl::Time enqueue_time() const { return enqueue_time_; }
  absl::Time start_time() const;
  absl::Time end_time() const;

 private:
  // Without a bound, runs the op on this thread when nothing else could run meanwhile
  // (OpExecutor::RunOnWaiter): the caller waits exactly as long, minus the hand-off. With a bound,
  // hands an op left to its waiter to the worker (OpExecutor::Expedite).
  void HelpProgress(absl::Duration bound);
  // Terminal now, unless it was already. REQUIRES: mu_ held.
  bool FinishLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // completion_ (if any) is no longer the current launch: kept in earlier_relaunches_, since the
  // executor's record of ops in flight may still point at it (MarkLaunched).
  void SetAsideRelaunchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The completion of the launch waiters wait for, null while there is none (not launched yet,
  // being relaunched, or terminal).
  DeviceCompletion* CompletionLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  OpDesc desc_;  // const but for AssignSeq and SetIssuedAt (see there)
  std::atomic<uint64_t> seq_{0};
  std::atomic<bool> in_open_group_{false};
  bool heads_group_ = false;  // set before the group is queued, then fixed
  uint64_t group_first_seq_ = 0;
  uint64_t group_last_seq_ = 0;
  std::vector<std::shared_ptr<WorkImpl>> group_members_;
  std::weak_ptr<WorkImpl> group_head_;
  const std::weak_ptr<OpExecutor> executor_;
  const absl::Time enqueue_time_;
  int membership_epoch_ = 0;
  uint64_t step_ = 0;
  // Set by the first Wait before it reads first_launch_, read by MarkRelaunching after it closed
  // first_launch_ (both sequentially consistent): either the Wait sees the op closed and waits for
  // its relaunch, or the relaunch sees the Wait and does not happen.
  std::atomic<bool> released_{false};
  mutable absl::Mutex mu_;
  WorkState state_ ABSL_GUARDED_BY(mu_) = WorkState::kPending;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time start_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time end_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::shared_ptr<DeviceCompletion> completion_ ABSL_GUARDED_BY(mu_);  // a relaunch's
  std::vector<std::shared_ptr<DeviceCompletion>> earlier_relaunches_ ABSL_GUARDED_BY(mu_);
  // The first launch, published without mu_: Work::Wait on a launched op, right after issuing it,
  // reads it and makes the caller's stream wait without taking mu_ (MarkLaunched takes none
  // either), which saved two of the six lock pairs of a stream-ordered op's issue and Wait
  // (bench/stream_order_bench). Holds the DeviceCompletion* of first_completion_ while that launch
  // is the op's current one and the op is not terminal; kClosed once it is terminal or relaunched
  // (for good: a relaunch's completion is completion_), 0 before. Set by a compare-and-swap from 0,
  // so that an op an abort finished during its launch stays finished.
  static constexpr uintptr_t kClosed = 1;
  std::atomic<uintptr_t> first_launch_{0};
  // Owns what first_launch_ points to, until the Work goes: a Wait that read the pointer may still
  // use it after a Finish. Written once, by the executing thread (MarkLaunched's REQUIRES).
  std::shared_ptr<DeviceCompletion> first_completion_;
  // Waits under mu_ for a launch or the end (Wait's slow path): a MarkLaunched that published
  // without mu_ takes it once to wake them.
  std::atomic<int> launch_waiters_{0};
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_EXECUTOR_WORK_IMPL_H_

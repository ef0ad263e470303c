// OpExecutor's groups (Communicator::GroupStart/GroupEnd): a group is queued as one unit headed by
// its first op (SubmitGroup), launched on the device as one (StreamOrdered::LaunchGroup) or run
// through the backend's GroupRunner.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/wall_clock.h"
#include "lib/core/executor/op_executor.h"  // IWYU pragma: associated

namespace adaptcomm::internal {

absl::Status OpExecutor::SubmitGroup(std::vector<std::shared_ptr<WorkImpl>> works, int epoch) {
  ExecutorLock lock(this);
  if (step_.open != 0 && !step_.failure.ok()) {
    // As Submit: the step is to be redone, and its ops take no number.
    for (const std::shared_ptr<WorkImpl>& w : works) {
      w->EndOpenGroup();
      w->Finish(StepFailedLocked(w->desc()));
    }
    return absl::OkStatus();  // the step's redo status is its ops' and CommitStep's
  }
  // Every rank's group takes the same numbers, however many sends and receives it holds: the
  // group's own (its sends and receives carry it), then one per collective in issue order (the
  // same on every rank), which the backends match them by.
  absl::Duration timeout = absl::ZeroDuration();
  for (const std::shared_ptr<WorkImpl>& w : works) timeout = std::max(timeout, w->desc().timeout);
  const uint64_t first = next_seq_++;
  for (const std::shared_ptr<WorkImpl>& w : works) {
    const bool p2p = w->desc().kind == OpKind::kSend || w->desc().kind == OpKind::kRecv;
    w->AssignSeq(p2p ? first : next_seq_++, timeout);
    w->set_membership_epoch(epoch < 0 ? static_cast<int>(changes_.size()) : epoch);
    w->set_step(step_.open);
  }
  if (absl::Status marked = MarkGroupIssueLocked(works); !marked.ok()) {
    // Refused before anything was queued (a capturing stream, a stream on another device): no
    // rank queued anything, and the group takes no number.
    next_seq_ = first;
    const absl::Status refused(marked.code(), absl::StrCat("group of ", works.size(),
                                                           " op(s) not run: ", marked.message()));
    for (const std::shared_ptr<WorkImpl>& w : works) {
      w->AssignSeq(0, timeout);
      w->EndOpenGroup();
      w->Finish(refused);
    }
    return refused;
  }
  const std::shared_ptr<WorkImpl> head = works.front();
  WorkImpl::FormGroup(head, std::vector<std::shared_ptr<WorkImpl>>(works.begin() + 1, works.end()),
                      first, next_seq_ - 1);
  for (const std::shared_ptr<WorkImpl>& w : works) w->EndOpenGroup();
  if (!aborted_.ok()) {
    head->Finish(absl::Status(aborted_.code(),
                              absl::StrCat("communicator was aborted: ", aborted_.message())));
    return absl::OkStatus();  // as Submit: the ops carry it
  }
  if (stopping_) {
    head->Finish(absl::FailedPreconditionError("communicator is shutting down"));
    return absl::OkStatus();
  }
  for (const std::shared_ptr<WorkImpl>& w : works) {
    for (const auto& o : observers_) o->OnEnqueue(w->desc(), w->enqueue_time());
  }
  if (deferred_seq_ != 0) {
    EndDeferralLocked();
  } else if (defer_to_waiter_ && queue_.empty() && !busy_ && DeviceIdleLocked() &&
             device_failure_.ok() && requested_generation_ <= generation_ &&
             WaiterMayRun(head->desc())) {
    // Left to whoever waits for one of its ops (WorkImpl::HelpProgress helps the head).
    deferred_seq_ = head->desc().seq;
    last_deferred_ = WallNow();
  }
  queue_.push_back(head);
  return absl::OkStatus();
}

absl::Status OpExecutor::MarkGroupIssueLocked(const std::vector<std::shared_ptr<WorkImpl>>& works) {
  if (!aborted_.ok() || stopping_) return absl::OkStatus();
  StreamOrdered* ordered = backend().stream_ordered();
  if (ordered == nullptr) return absl::OkStatus();
  for (const std::shared_ptr<WorkImpl>& w : works) {
    if (!IsDeviceOp(w->desc())) return absl::OkStatus();  // runs as a whole on the worker
  }
  std::vector<std::shared_ptr<const StreamPosition>> positions;
  positions.reserve(works.size());
  for (const std::shared_ptr<WorkImpl>& w : works) {
    absl::StatusOr<std::shared_ptr<const StreamPosition>> position = ordered->MarkIssue(w->desc());
    if (!position.ok()) return position.status();
    positions.push_back(*std::move(position));
  }
  for (size_t i = 0; i < works.size(); ++i) works[i]->SetIssuedAt(std::move(positions[i]));
  return absl::OkStatus();
}

std::string GroupFingerprint(const WorkImpl& head) {
  std::vector<std::string> collectives;
  auto add = [&collectives](const OpDesc& op) {
    if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) {
      collectives.push_back(OpFingerprint(op));
    }
  };
  add(head.desc());
  for (const std::shared_ptr<WorkImpl>& m : head.group_members()) add(m->desc());
  return absl::StrCat("group(", absl::StrJoin(collectives, "; "), ")");
}

absl::Status OpExecutor::ExecuteGroup(const WorkImpl& head, absl::Time started,
                                      std::optional<Launched>* launched) {
  launched->reset();
  Backend& backend = this->backend();
  const bool wire_cast = backend.capabilities().wire_cast;
  std::vector<OpDesc> ops;
  ops.reserve(1 + head.group_members().size());
  auto add = [&](const WorkImpl& work) -> absl::Status {
    if (work.membership_epoch() != epoch_.load()) {
      // Issued before a membership change: run as it reads now, or fail the group.
      absl::StatusOr<OpDesc> translated = ForCurrentMembership(work);
      if (!translated.ok()) return translated.status();
      ops.push_back(*std::move(translated));
    } else {
      ops.push_back(work.desc());
    }
    if (ops.back().wire.has_value() && !wire_cast) {
      return absl::InvalidArgumentError(
          absl::StrCat(OpKindName(ops.back().kind), " #", ops.back().seq, " of a group: backend ",
                       backend.name(), " cannot send f32 data as ", DTypeName(*ops.back().wire)));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = add(head); !s.ok()) return s;
  for (const std::shared_ptr<WorkImpl>& m : head.group_members()) {
    if (absl::Status s = add(*m); !s.ok()) return s;
  }
  StreamOrdered* ordered = backend.stream_ordered();
  if (ordered != nullptr && std::all_of(ops.begin(), ops.end(),
                                        [](const OpDesc& op) { return op.issued_at != nullptr; })) {
    // Positions taken at GroupEnd (MarkGroupIssueLocked): queued on the device as one unit, and in
    // flight from here like a single op.
    absl::StatusOr<std::shared_ptr<DeviceCompletion>> completion = ordered->LaunchGroup(ops);
    if (!completion.ok() && (absl::IsInvalidArgument(completion.status()) ||
                             absl::IsFailedPrecondition(completion.status()))) {
      return completion.status();  // refused before anything was queued, as ExecuteAs's
    }
    launched->emplace(Launched{std::move(completion), started});
    return absl::OkStatus();
  }
  if (GroupRunner* runner = backend.groups(); runner != nullptr) return runner->RunGroup(ops);
  for (const OpDesc& op : ops) {
    if (absl::Status s = backend.Run(op); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status OpExecutor::RunGroupWithRetry(const WorkImpl& head, absl::Time started,
                                           std::optional<Launched>* launched) {
  // As every rank numbers it: the group's own number, whichever op this rank issued first.
  OpDesc desc = head.desc();
  desc.seq = head.first_seq();
  if (retries_) {
    // A group's completion does not prove that every rank entered it (it may hold only sends and
    // receives): the record of the op before it must not rely on a stable input any more.
    OpDesc probe = desc;
    probe.kind = OpKind::kSend;
    replay_.BeforeOp(probe, nullptr);
    unprotected_ops_.store(
        unprotected_ops_.load(std::memory_order_relaxed) + 1 + head.group_members().size(),
        std::memory_order_relaxed);
  }
  absl::Status status = ExecuteGroup(head, started, launched);
  if (!status.ok() && retries_) {
    const std::string fingerprint = GroupFingerprint(head);
    return RecoverUnrecorded(desc, status, kGroupNotReRun, &fingerprint);
  }
  return status;
}

}  // namespace adaptcomm::internal

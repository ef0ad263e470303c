// OpExecutor's groups (Communicator::GroupStart/GroupEnd): a group is queued as one unit headed by
// its first op (SubmitGroup, op_executor.cc) and runs here, through the backend's GroupRunner.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/wall_clock.h"
#include "lib/core/executor/op_executor.h"  // IWYU pragma: associated

namespace adaptcomm::internal {

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

absl::Status OpExecutor::ExecuteGroup(const WorkImpl& head, std::optional<Launched>* launched) {
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
    launched->emplace(Launched{std::move(completion), WallNow()});
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
  (void)started;  // a group is never re-run: no attempt to time
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
  absl::Status status = ExecuteGroup(head, launched);
  if (!status.ok() && retries_) {
    const std::string fingerprint = GroupFingerprint(head);
    return RecoverUnrecorded(desc, status, kGroupNotReRun, &fingerprint);
  }
  return status;
}

}  // namespace adaptcomm::internal

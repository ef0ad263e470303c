// NcclBackend's groups (Communicator::GroupStart/GroupEnd): every op of a group in one
// ncclGroupStart/ncclGroupEnd on the communicator's stream. LaunchGroup (StreamOrdered) queues a
// group whose ops carry stream positions and returns; RunGroup, for ops without them, waits for the
// device.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/nccl/alltoall_staging.h"
#include "lib/nccl/nccl_backend_class.h"  // IWYU pragma: associated
#include "lib/nccl/nccl_translate.h"
#include "lib/nccl/stream_order.h"

namespace adaptcomm::nccl {
namespace {

bool IsPointToPoint(const OpDesc& op) {
  return op.kind == OpKind::kSend || op.kind == OpKind::kRecv;
}

}  // namespace

std::string NcclBackend::WhatGroup(const std::vector<OpDesc>& ops) const {
  return absl::StrCat("nccl group of ", ops.size(), " op(s) #", ops.front().seq, "-#",
                      ops.back().seq, " on rank ", options_.rank);
}

absl::StatusOr<OpDesc> NcclBackend::GroupBound(const std::vector<OpDesc>& ops) const {
  OpDesc bound = ops.front();
  for (const OpDesc& op : ops) {
    if (absl::Status s = Supports(op); !s.ok()) return s;
    bound.timeout = std::max(bound.timeout, op.timeout);
  }
  return bound;
}

absl::Status NcclBackend::EnqueueGroup(const std::vector<OpDesc>& ops, NcclResult* queued) {
  // In-place alltoalls of the group send from copies of their inputs, each its own part of the
  // staging buffer, copied on the communicator's stream behind the waits the caller queued.
  std::vector<OpDesc> staged;
  const std::vector<OpDesc>* members = &ops;
  if (std::any_of(ops.begin(), ops.end(), NeedsAlltoallStaging)) {
    staged = ops;
    if (absl::Status s = StageOverlappingInputs(absl::MakeSpan(staged), stream_); !s.ok()) {
      return s;
    }
    members = &staged;
  }
  // Collectives in issue order, then the sends and receives: NCCL pairs those of two ranks in
  // the order each issued them, so they go by tag (then issue order), as the peer's do.
  std::vector<const OpDesc*> p2p;
  for (const OpDesc& op : *members) {
    if (IsPointToPoint(op)) p2p.push_back(&op);
  }
  std::stable_sort(p2p.begin(), p2p.end(),
                   [](const OpDesc* a, const OpDesc* b) { return a->tag < b->tag; });
  NcclResult r = api_->GroupStart();
  if (r != NcclResult::kSuccess) {
    return Break(MapNcclResult(r, What(ops.front()), api_->GetLastError(comm_)));
  }
  NcclResult first_error = NcclResult::kSuccess;
  auto note = [&first_error](NcclResult x) {
    if (!InFlight(x) && first_error == NcclResult::kSuccess) first_error = x;
  };
  for (const OpDesc& op : *members) {
    if (!IsPointToPoint(op)) note(EnqueueMember(op, stream_));
  }
  for (const OpDesc* op : p2p) note(EnqueueMember(*op, stream_));
  r = api_->GroupEnd();  // closed even when a member was refused
  if (first_error != NcclResult::kSuccess) r = first_error;
  if (r == NcclResult::kInvalidArgument || r == NcclResult::kInvalidUsage) {
    return MapNcclResult(r, WhatGroup(ops), api_->GetLastError(comm_));
  }
  if (!InFlight(r)) return Break(MapNcclResult(r, WhatGroup(ops), api_->GetLastError(comm_)));
  *queued = r;
  return absl::OkStatus();
}

absl::Status NcclBackend::RunGroup(const std::vector<OpDesc>& ops) {
  if (ops.empty()) return absl::OkStatus();
  const OpDesc& head = ops.front();
  if (absl::Status s = BeginCall(head); !s.ok()) return s;
  return FinishCall([&]() -> absl::Status {
    absl::StatusOr<OpDesc> group = GroupBound(ops);
    if (!group.ok()) return group.status();
    const absl::Time deadline = absl::Now() + group->timeout;
    ScopedCudaDevice device(*cuda_, options_.device);
    if (int e = device.error(); e != kCudaSuccess) {
      return Break(absl::UnavailableError(absl::StrCat(
          What(head), ": cudaSetDevice(", options_.device, "): ", cuda_->ErrorString(e))));
    }
    // The group runs on the communicator's stream, behind the work queued on each op's stream
    // by now (one NCCL group, one stream); the host then waits for it, so the callers' streams see
    // the results without waiting on it.
    std::vector<CudaStream> waited;
    for (const OpDesc& op : ops) {
      const bool output = UsesOutput(op.kind);
      const CudaStream s = op.kind == OpKind::kBarrier ? stream_
                           : output                    ? op.output.stream
                                                       : op.input.stream;
      if (s == stream_ || std::find(waited.begin(), waited.end(), s) != waited.end()) continue;
      if (absl::Status r =
              RefuseIfCapturing(*cuda_, s, output ? "output" : "input", [&] { return What(op); });
          !r.ok()) {
        return r;
      }
      if (int e = cuda_->EventRecord(event_, s); e != kCudaSuccess) {
        return Break(absl::UnavailableError(
            absl::StrCat(What(op), ": cudaEventRecord: ", cuda_->ErrorString(e))));
      }
      if (int e = cuda_->StreamWaitEvent(stream_, event_); e != kCudaSuccess) {
        return Break(absl::UnavailableError(
            absl::StrCat(What(op), ": cudaStreamWaitEvent: ", cuda_->ErrorString(e))));
      }
      waited.push_back(s);
    }
    NcclResult queued = NcclResult::kSuccess;
    if (absl::Status s = EnqueueGroup(ops, &queued); !s.ok()) return s;
    return WaitDone(*group, stream_, deadline);
  }());
}

absl::StatusOr<std::shared_ptr<DeviceCompletion>> NcclBackend::LaunchGroup(
    const std::vector<OpDesc>& ops) {
  if (ops.empty()) return absl::InvalidArgumentError("nccl: an empty group launched");
  const OpDesc& head = ops.front();
  std::vector<const NcclOpEvents*> positions;
  positions.reserve(ops.size());
  for (const OpDesc& op : ops) {
    positions.push_back(EventsOf(op.issued_at.get()));
    if (positions.back() == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(What(op), " of a group: launched without a stream position from MarkIssue"));
    }
  }
  if (absl::Status s = BeginCall(head); !s.ok()) return s;
  std::shared_ptr<DeviceCompletion> completion;
  absl::Status status = FinishCall([&]() -> absl::Status {
    absl::StatusOr<OpDesc> bound = GroupBound(ops);
    if (!bound.ok()) return bound.status();
    // Per group, on the device (none of it waits for the host, nor the host for it):
    //  - each op's stream (the caller's): the op's issue event, recorded at GroupEnd (MarkIssue),
    //    which nothing on it waits for;
    //  - the communicator's stream waits for every op's issue event, then runs the in-place
    //    alltoalls' staging copies (if any), the group's NCCL calls in one
    //    ncclGroupStart/ncclGroupEnd and the done event (the first op's position's);
    //  - each op's stream waits for the done event when the trainer calls Work::Wait on that op
    //    (MakeStreamWait): whichever op of the group it waits for, it waits for all of them.
    // On abort, ncclCommAbort ends the kernels: the done event completes, Poll() reports the
    // abort and every op of the group fails. Under CUDA graph capture nothing gets here: GroupEnd's
    // MarkIssue refused the group before recording anything. A second issuing thread: the
    // positions are taken by whichever thread ends the group, for every op it holds.
    ScopedCudaDevice device(*cuda_, options_.device);
    if (int e = device.error(); e != kCudaSuccess) {
      return Break(absl::UnavailableError(absl::StrCat(
          What(head), ": cudaSetDevice(", options_.device, "): ", cuda_->ErrorString(e))));
    }
    std::vector<CudaEvent> waited;
    for (size_t i = 0; i < ops.size(); ++i) {
      const CudaEvent issued = positions[i]->issued();
      if (positions[i]->AwaitedOn(stream_id_) ||
          std::find(waited.begin(), waited.end(), issued) != waited.end()) {
        continue;
      }
      if (int e = cuda_->StreamWaitEvent(stream_, issued); e != kCudaSuccess) {
        return Break(absl::UnavailableError(
            absl::StrCat(What(ops[i]), ": cudaStreamWaitEvent: ", cuda_->ErrorString(e))));
      }
      waited.push_back(issued);
    }
    NcclResult queued = NcclResult::kSuccess;
    if (absl::Status s = EnqueueGroup(ops, &queued); !s.ok()) return s;
    if (absl::Status s = AwaitLaunchDone(queued, *bound); !s.ok()) return s;
    // The first op's position's done event stands for the group's end.
    absl::StatusOr<std::shared_ptr<DeviceCompletion>> claimed = CompletionOf(head);
    if (!claimed.ok()) return claimed.status();
    completion = *std::move(claimed);
    auto* events = static_cast<NcclOpEvents*>(completion.get());
    if (int e = cuda_->EventRecord(events->done(), stream_); e != kCudaSuccess) {
      completion = nullptr;
      return Break(absl::UnavailableError(
          absl::StrCat(WhatGroup(ops), ": cudaEventRecord: ", cuda_->ErrorString(e))));
    }
    return absl::OkStatus();
  }());
  if (!status.ok()) return status;
  return completion;
}

}  // namespace adaptcomm::nccl

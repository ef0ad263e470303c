// Names of the public enums, and the retry classification of status codes.
#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/status.h"
#include "adaptcomm/types.h"
#include "adaptcomm/work.h"

namespace adaptcomm {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "unknown-dtype";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "unknown-op";
}

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAlltoall:
      return "alltoall";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
  }
  return "unknown-op";
}

const char* WorkStateName(WorkState state) {
  switch (state) {
    case WorkState::kPending:
      return "pending";
    case WorkState::kRunning:
      return "running";
    case WorkState::kDone:
      return "done";
    case WorkState::kFailed:
      return "failed";
    case WorkState::kTimedOut:
      return "timed_out";
  }
  return "unknown-state";
}

const char* BackendChoiceName(BackendChoice choice) {
  switch (choice) {
    case BackendChoice::kAuto:
      return "auto";
    case BackendChoice::kGloo:
      return "gloo";
    case BackendChoice::kNccl:
      return "nccl";
    case BackendChoice::kShm:
      return "shm";
  }
  return "unknown-backend";
}

const char* ReplayModeName(ReplayMode mode) {
  switch (mode) {
    case ReplayMode::kAuto:
      return "auto";
    case ReplayMode::kCopy:
      return "copy";
  }
  return "unknown-replay";
}

const char* LossPolicyName(LossPolicy policy) {
  switch (policy) {
    case LossPolicy::kFail:
      return "fail";
    case LossPolicy::kShrink:
      return "shrink";
    case LossPolicy::kWaitForReplacement:
      return "wait_for_replacement";
  }
  return "unknown-loss-policy";
}

bool IsStepRedo(const absl::Status& status) {
  return absl::IsAborted(status) && status.GetPayload(kStepRedoPayload).has_value();
}

bool IsMembershipChanged(const absl::Status& status) {
  return MembershipChangedWorldSize(status).has_value();
}

std::optional<int> MembershipChangedWorldSize(const absl::Status& status) {
  if (!absl::IsAborted(status)) return std::nullopt;
  const auto payload = status.GetPayload(kMembershipChangedPayload);
  int world_size = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &world_size)) {
    return std::nullopt;
  }
  return world_size;
}

absl::Status MembershipChangedError(int world_size, absl::string_view what) {
  absl::Status status = absl::AbortedError(absl::StrCat("membership changed: ", what));
  status.SetPayload(kMembershipChangedPayload, absl::Cord(absl::StrCat(world_size)));
  return status;
}

bool IsRetryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDeadlineExceeded:
      return true;
    default:
      return false;
  }
}

}  // namespace adaptcomm

#include "lib/core/executor/validate.h"

#include "absl/strings/str_cat.h"

namespace adaptcomm::internal {
namespace {

std::string Describe(const TensorView& v) {
  return absl::StrCat(DTypeName(v.dtype), "[", v.count, "] on ",
                      v.device.is_cuda() ? absl::StrCat("cuda:", v.device.index) : "cpu");
}

absl::Status Invalid(const OpDesc& op, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(OpKindName(op.kind), ": ", what));
}

// Why `v` is not a view of `role`, once CheckView saw that something is wrong with it.
absl::Status ViewError(const OpDesc& op, const char* role, const TensorView& v) {
  if (v.data == nullptr && v.count > 0) {
    return Invalid(op, absl::StrCat(role, " is null but its count is ", v.count));
  }
  if (DTypeSize(v.dtype) == 0) {
    return Invalid(op,
                   absl::StrCat(role, " has an unknown dtype code ", static_cast<int>(v.dtype)));
  }
  if (v.device.is_cuda() && v.device.index < 0) {
    return Invalid(op, absl::StrCat(role, " is on CUDA with device index ", v.device.index));
  }
  return absl::OkStatus();
}

// Inline and without a message on the path every op takes: the message is built by ViewError only
// for a view that fails.
inline absl::Status CheckView(const OpDesc& op, const char* role, const TensorView& v) {
  if ((v.data != nullptr || v.count == 0) && DTypeSize(v.dtype) != 0 &&
      (!v.device.is_cuda() || v.device.index >= 0)) {
    return absl::OkStatus();
  }
  return ViewError(op, role, v);
}

absl::Status CheckRank(const OpDesc& op, const char* role, int value, int world_size) {
  if (value < 0 || value >= world_size) {
    return Invalid(op, absl::StrCat(role, " ", value, " is out of range [0, ", world_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDType(const OpDesc& op) {
  if (op.input.dtype != op.output.dtype) {
    return Invalid(op, absl::StrCat("input ", Describe(op.input), " and output ",
                                    Describe(op.output), " differ in dtype"));
  }
  return absl::OkStatus();
}

absl::Status CheckCounts(const OpDesc& op, size_t expected_output, const char* rule) {
  if (op.output.count != expected_output) {
    return Invalid(op, absl::StrCat("output ", Describe(op.output), " must hold ", expected_output,
                                    " elements (", rule, "); input is ", Describe(op.input)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateOp(const OpDesc& op, int rank, int world_size) {
  if (auto s = CheckView(op, "input", op.input); !s.ok()) return s;
  if (auto s = CheckView(op, "output", op.output); !s.ok()) return s;
  if (op.timeout <= absl::ZeroDuration()) {
    return Invalid(
        op, absl::StrCat("timeout must be positive, got ", absl::FormatDuration(op.timeout)));
  }
  const size_t n = static_cast<size_t>(world_size);
  switch (op.kind) {
    case OpKind::kAllreduce:
    case OpKind::kBarrier:
      return absl::OkStatus();
    case OpKind::kBroadcast:
    case OpKind::kReduce:
      return CheckRank(op, "root", op.root, world_size);
    case OpKind::kAllgather:
      if (auto s = CheckSameDType(op); !s.ok()) return s;
      return CheckCounts(op, op.input.count * n, "input count x world size");
    case OpKind::kReduceScatter:
      if (auto s = CheckSameDType(op); !s.ok()) return s;
      if (op.input.count != op.output.count * n) {
        return Invalid(op, absl::StrCat("input ", Describe(op.input), " must hold output count x ",
                                        "world size = ", op.output.count * n, " elements"));
      }
      return absl::OkStatus();
    case OpKind::kAlltoall:
      if (auto s = CheckSameDType(op); !s.ok()) return s;
      if (auto s = CheckCounts(op, op.input.count, "same as input"); !s.ok()) return s;
      if (op.input.count % n != 0) {
        return Invalid(op, absl::StrCat("count ", op.input.count,
                                        " is not divisible by the world size ", world_size));
      }
      return absl::OkStatus();
    case OpKind::kSend:
    case OpKind::kRecv:
      if (auto s = CheckRank(op, "peer", op.peer, world_size); !s.ok()) return s;
      if (op.peer == rank) return Invalid(op, absl::StrCat("peer ", op.peer, " is this rank"));
      return absl::OkStatus();
  }
  return Invalid(op, absl::StrCat("unknown op kind ", static_cast<int>(op.kind)));
}

}  // namespace adaptcomm::internal

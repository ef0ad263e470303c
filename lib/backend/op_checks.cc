#include "lib/backend/op_checks.h"

#include "absl/strings/str_cat.h"
#include "lib/base/op_views.h"

namespace adaptcomm {

absl::Status CheckHostOp(const OpDesc& op, const char* backend, int rank, int size,
                         size_t max_elements) {
  const char* kind = OpKindName(op.kind);
  if (!IsKnownOpKind(op.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat(backend, " backend: unknown op kind ", static_cast<int>(op.kind)));
  }
  auto check_view = [&](const TensorView& v, const char* which) -> absl::Status {
    if (v.device.is_cuda()) {
      return absl::InvalidArgumentError(absl::StrCat(backend, " backend needs host memory; view ",
                                                     which, " of ", kind,
                                                     " is on cuda:", v.device.index));
    }
    if (DTypeSize(v.dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(backend, " backend: ", kind, " ", which,
                                                     " has unknown dtype ",
                                                     static_cast<int>(v.dtype)));
    }
    if (v.count > max_elements) {
      return absl::InvalidArgumentError(absl::StrCat(backend, " backend: ", kind, " ", which,
                                                     " has ", v.count, " elements; at most ",
                                                     max_elements, " per buffer"));
    }
    return absl::OkStatus();
  };
  if (UsesInput(op.kind)) {
    if (absl::Status s = check_view(op.input, "input"); !s.ok()) return s;
  }
  if (UsesOutput(op.kind)) {
    if (absl::Status s = check_view(op.output, "output"); !s.ok()) return s;
  }
  if ((op.kind == OpKind::kSend || op.kind == OpKind::kRecv) &&
      (op.peer < 0 || op.peer >= size || op.peer == rank)) {
    return absl::InvalidArgumentError(absl::StrCat(backend, " backend: ", kind, " peer ", op.peer,
                                                   " must be another rank in [0, ", size,
                                                   "), not this rank ", rank));
  }
  return absl::OkStatus();
}

absl::Status BrokenBackendRefusal(absl::string_view backend, const OpDesc& op,
                                  const absl::Status& broken) {
  return absl::FailedPreconditionError(absl::StrCat(backend, " backend is broken; ",
                                                    OpKindName(op.kind), " seq ", op.seq,
                                                    " not run: ", broken.ToString()));
}

}  // namespace adaptcomm

// The argument checks every host-memory backend makes in Backend::Supports(), in one place so
// that gloo and shm refuse the same ops with the same words.
#ifndef ADAPTCOMM_LIB_BACKEND_OP_CHECKS_H_
#define ADAPTCOMM_LIB_BACKEND_OP_CHECKS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "adaptcomm/ext/backend.h"

namespace adaptcomm {

// OK, or InvalidArgument starting "<backend> backend: " when `op` has an unknown kind, a view it
// uses (op_views.h) in device memory, of an unknown dtype or with more than `max_elements`
// elements, or a send/recv peer that is not another rank in [0, size).
absl::Status CheckHostOp(const OpDesc& op, const char* backend, int rank, int size,
                         size_t max_elements = SIZE_MAX);

// The FailedPrecondition every backend returns for an op (or a group, from its first op) that it
// refuses because `broken` broke it: "<backend> backend is broken; <op> seq <n> not run: ...".
absl::Status BrokenBackendRefusal(absl::string_view backend, const OpDesc& op,
                                  const absl::Status& broken);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BACKEND_OP_CHECKS_H_

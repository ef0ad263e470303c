// The generic rules every op must satisfy whatever the backend: non-null data, sizes that match,
// root and peer in range, same dtype on both sides. Backend-specific rules (dtype x reduce op,
// device memory) are the backend's Supports().
#ifndef ADAPTCOMM_LIB_CORE_EXECUTOR_VALIDATE_H_
#define ADAPTCOMM_LIB_CORE_EXECUTOR_VALIDATE_H_

#include "absl/status/status.h"
#include "adaptcomm/ext/backend.h"

namespace adaptcomm::internal {

// InvalidArgument naming the op, the argument and the values, or OK.
absl::Status ValidateOp(const OpDesc& op, int rank, int world_size);

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_EXECUTOR_VALIDATE_H_

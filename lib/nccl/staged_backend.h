// Staging: device (cuda:N) buffers on a host-memory backend such as Gloo, so that a GPU trainer
// keeps working on every rank when NCCL is unavailable.
//
// Each op copies its device input to preallocated pinned host memory (one copy, on the view's
// stream, waited for), runs the inner backend on the host copy, and copies the result back (one
// copy, waited for before Run returns, since the staging memory is reused by the next op). Host
// views pass through untouched. The staging memory grows to the largest op seen and is kept.
#ifndef ADAPTCOMM_LIB_NCCL_STAGED_BACKEND_H_
#define ADAPTCOMM_LIB_NCCL_STAGED_BACKEND_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "adaptcomm/ext/backend.h"
#include "lib/cuda/cuda_api.h"

namespace adaptcomm::nccl {

struct StagingOptions {
  // Pinned bytes allocated up front for each of the input and output staging buffers.
  size_t initial_bytes = 4 << 20;
};

// Wraps `inner` (which must accept host memory). Errors: InvalidArgument for a null argument,
// ResourceExhausted when the pinned memory cannot be allocated.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateStagedBackend(
    std::unique_ptr<Backend> inner, std::shared_ptr<cuda::CudaApi> cuda,
    const StagingOptions& options = {});

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_STAGED_BACKEND_H_

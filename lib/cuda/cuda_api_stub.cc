// Built instead of cuda_api_runtime.cc when the CUDA toolkit was not found at build time: device
// views, staging and the device mixed-precision path exist as types, but there is no runtime.
#include "lib/cuda/cuda_api.h"

namespace adaptcomm::cuda {

bool CudaBuiltIn() { return false; }
bool CastKernelsBuiltIn() { return false; }

absl::StatusOr<std::shared_ptr<CudaApi>> LoadCudaApi() {
  // Selection reports this as the reason NCCL is not used.
  return absl::FailedPreconditionError(
      "NCCL backend not built: CUDA toolkit not found at build time");
}

}  // namespace adaptcomm::cuda

// Built instead of nccl_api_dlopen.cc when the CUDA toolkit was not found at build time: the NCCL
// backend and staging exist as types, but nothing can load.
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl {
namespace {
constexpr char kNotBuilt[] = "NCCL backend not built: CUDA toolkit not found at build time";
}  // namespace

bool CudaBuiltIn() { return false; }
bool CastKernelsBuiltIn() { return false; }

absl::StatusOr<std::shared_ptr<CudaApi>> LoadCudaApi() {
  return absl::FailedPreconditionError(kNotBuilt);
}

absl::StatusOr<std::shared_ptr<NcclApi>> LoadNcclApi(const std::string& /*path*/) {
  return absl::FailedPreconditionError(kNotBuilt);
}

}  // namespace adaptcomm::nccl

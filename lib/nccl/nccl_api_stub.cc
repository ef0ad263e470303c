// Built instead of nccl_api_dlopen.cc when the CUDA toolkit was not found at build time: the NCCL
// backend exists as a type, but nothing can load.
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl {

absl::StatusOr<std::shared_ptr<NcclApi>> LoadNcclApi(const std::string& /*path*/) {
  return absl::FailedPreconditionError(
      "NCCL backend not built: CUDA toolkit not found at build time");
}

}  // namespace adaptcomm::nccl

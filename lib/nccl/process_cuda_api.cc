// The process-wide CudaApi of the device mixed-precision path, with a test override.
#include <memory>
#include <utility>

#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl {
namespace {

// Destroyed with its thread (a rank thread of a test).
thread_local std::shared_ptr<CudaApi> thread_api;

}  // namespace

absl::StatusOr<std::shared_ptr<CudaApi>> ProcessCudaApi() {
  if (thread_api != nullptr) return thread_api;
  return LoadCudaApi();  // itself loaded once per process
}

void SetThreadCudaApiForTesting(std::shared_ptr<CudaApi> api) { thread_api = std::move(api); }

}  // namespace adaptcomm::nccl

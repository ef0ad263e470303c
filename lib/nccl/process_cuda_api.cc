// The process-wide CudaApi of the device mixed-precision path, with a test override.
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl {
namespace {

absl::Mutex override_mu(absl::kConstInit);
std::shared_ptr<CudaApi>* override_api ABSL_GUARDED_BY(override_mu) = nullptr;

// Destroyed with its thread (a rank thread of a test).
thread_local std::shared_ptr<CudaApi> thread_api;

}  // namespace

absl::StatusOr<std::shared_ptr<CudaApi>> ProcessCudaApi() {
  if (thread_api != nullptr) return thread_api;
  {
    absl::MutexLock lock(&override_mu);
    if (override_api != nullptr && *override_api != nullptr) return *override_api;
  }
  return LoadCudaApi();  // itself loaded once per process
}

void SetProcessCudaApiForTesting(std::shared_ptr<CudaApi> api) {
  absl::MutexLock lock(&override_mu);
  if (override_api == nullptr) override_api = new std::shared_ptr<CudaApi>();  // never freed
  *override_api = std::move(api);
}

void SetThreadCudaApiForTesting(std::shared_ptr<CudaApi> api) { thread_api = std::move(api); }

}  // namespace adaptcomm::nccl

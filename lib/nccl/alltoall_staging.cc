#include "lib/nccl/alltoall_staging.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace adaptcomm::nccl {

bool NeedsAlltoallStaging(const OpDesc& op) {
  if (op.kind != OpKind::kAlltoall) return false;
  const auto in = reinterpret_cast<uintptr_t>(op.input.data);
  const auto out = reinterpret_cast<uintptr_t>(op.output.data);
  const size_t in_bytes = op.input.bytes(), out_bytes = op.output.bytes();
  if (in_bytes == 0 || out_bytes == 0) return false;
  return in < out + out_bytes && out < in + in_bytes;
}

AlltoallStaging::~AlltoallStaging() {
  if (buffer_ == nullptr && outgrown_.empty()) return;
  cuda::ScopedCudaDevice device(*cuda_, device_);
  if (buffer_ != nullptr) (void)cuda_->Free(buffer_);
  for (void* p : outgrown_) (void)cuda_->Free(p);
}

absl::StatusOr<void*> AlltoallStaging::Reserve(size_t bytes) {
  if (bytes <= capacity_) return buffer_;
  const size_t grown = std::max(bytes, capacity_ * 2);
  void* fresh = nullptr;
  int e = cuda::kCudaSuccess;
  {
    cuda::ScopedCaptureModeThreadLocal mode(*cuda_);
    e = cuda_->Malloc(&fresh, grown);
  }
  if (e != cuda::kCudaSuccess) {
    if (cuda::IsStreamCaptureError(e)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "nccl in-place alltoall needs a staging buffer of ", grown, " bytes on cuda:", device_,
          ", which cannot be allocated while this thread captures a "
          "CUDA graph (cudaMalloc: ",
          cuda_->ErrorString(e),
          "); run one in-place alltoall of "
          "this size before the capture (the buffer is kept and reused) or pass separate input and "
          "output buffers. Nothing was queued"));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("nccl in-place alltoall: cudaMalloc of a ", grown,
                     "-byte staging buffer on cuda:", device_, ": ", cuda_->ErrorString(e)));
  }
  if (buffer_ != nullptr) outgrown_.push_back(buffer_);
  buffer_ = fresh;
  capacity_ = grown;
  return buffer_;
}

}  // namespace adaptcomm::nccl

#include "lib/cuda/device_memory.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace adaptcomm::cuda {
namespace {

class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(std::shared_ptr<CudaApi> cuda) : cuda_(std::move(cuda)) {}

  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Device device,
                         void* stream) override {
    if (bytes == 0) return absl::OkStatus();
    if (!device.is_cuda()) return NotCuda();
    ScopedCudaDevice current(*cuda_, device.index);
    if (absl::Status s = Selected(current, device); !s.ok()) return s;
    const int e = cuda_->MemcpyAsync(dst, src, bytes, MemcpyKind::kDeviceToDevice, stream);
    return Check(e, absl::StrCat("cudaMemcpyAsync of ", bytes, " bytes on cuda:", device.index));
  }

  absl::StatusOr<void*> Allocate(Device device, size_t bytes) override {
    if (!device.is_cuda()) return NotCuda();
    ScopedCudaDevice current(*cuda_, device.index);
    if (absl::Status s = Selected(current, device); !s.ok()) return s;
    void* ptr = nullptr;
    int e = kCudaSuccess;
    {
      // A retry record's allocation, on a library thread: in CUDA's default capture mode a
      // cudaMalloc from any thread invalidates a CUDA graph a trainer's thread is capturing.
      ScopedCaptureModeThreadLocal relaxed(*cuda_);
      e = cuda_->Malloc(&ptr, bytes);
    }
    if (absl::Status s =
            Check(e, absl::StrCat("cudaMalloc of ", bytes, " bytes on cuda:", device.index));
        !s.ok()) {
      return s;
    }
    return ptr;
  }

  void Free(Device device, void* ptr) override {
    if (ptr == nullptr || !device.is_cuda()) return;
    ScopedCudaDevice current(*cuda_, device.index);
    if (current.error() == kCudaSuccess) (void)cuda_->Free(ptr);
  }

 private:
  static absl::Status NotCuda() {
    return absl::InvalidArgumentError("device memory: the view is not on a CUDA device");
  }
  absl::Status Selected(const ScopedCudaDevice& current, Device device) {
    return Check(current.error(), absl::StrCat("cudaSetDevice(", device.index, ")"));
  }

  absl::Status Check(int error, const std::string& what) {
    if (error == kCudaSuccess) return absl::OkStatus();
    // A failing copy or allocation (out of memory, a sticky CUDA error) is not transient here.
    return absl::InternalError(absl::StrCat(what, ": ", cuda_->ErrorString(error)));
  }

  const std::shared_ptr<CudaApi> cuda_;
};

}  // namespace

std::shared_ptr<DeviceMemory> MakeCudaDeviceMemory(std::shared_ptr<CudaApi> cuda) {
  return std::make_shared<CudaDeviceMemory>(std::move(cuda));
}

}  // namespace adaptcomm::cuda

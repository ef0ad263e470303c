// DeviceMemory (include/adaptcomm/ext/backend.h) over the CUDA seam: what the NCCL and staging
// backends hand to the coordinated retry for copies of device inputs.
#ifndef ADAPTCOMM_LIB_CUDA_DEVICE_MEMORY_H_
#define ADAPTCOMM_LIB_CUDA_DEVICE_MEMORY_H_

#include <memory>

#include "adaptcomm/ext/backend.h"
#include "lib/cuda/cuda_api.h"

namespace adaptcomm::cuda {

// Copies are cudaMemcpyAsync(DeviceToDevice) on the caller's stream: stream-ordered with the op
// that follows, so no host synchronization. Each call selects `device` on the calling thread first.
std::shared_ptr<DeviceMemory> MakeCudaDeviceMemory(std::shared_ptr<CudaApi> cuda);

}  // namespace adaptcomm::cuda

#endif  // ADAPTCOMM_LIB_CUDA_DEVICE_MEMORY_H_

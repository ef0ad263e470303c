// DeviceMemory (include/adaptcomm/backend.h) over the CUDA runtime calls of the NcclApi seam: what
// the NCCL and staging backends hand to the coordinated retry for copies of device inputs.
#ifndef ADAPTCOMM_LIB_NCCL_DEVICE_MEMORY_H_
#define ADAPTCOMM_LIB_NCCL_DEVICE_MEMORY_H_

#include <memory>

#include "adaptcomm/backend.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl {

// Copies are cudaMemcpyAsync(DeviceToDevice) on the caller's stream: stream-ordered with the op
// that follows, so no host synchronization. Each call selects `device` on the calling thread first.
std::shared_ptr<DeviceMemory> MakeCudaDeviceMemory(std::shared_ptr<CudaApi> cuda);

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_DEVICE_MEMORY_H_

// The gradient bucketer's bookkeeping collectives (registration digest, per-step errors) through
// device scratch, for a communicator whose backend takes device memory only (NCCL), and zeroed
// device stand-ins for CUDA tensors a step did not mark. Only the CUDA seam the communicator was
// built with is called (internal::CommunicatorCudaApi), so the fake seams test it.
#ifndef ADAPTCOMM_LIB_PRECISION_BUCKETER_DEVICE_H_
#define ADAPTCOMM_LIB_PRECISION_BUCKETER_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/communicator.h"
#include "lib/cuda/cuda_api.h"

namespace adaptcomm::bucketer {

class DeviceScratch {
 public:
  // `device`: the CUDA ordinal the scratch lives on (the tensors'). `bound`: each host wait for
  // the scratch's stream.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceScratch>> Create(Communicator& comm,
                                                                             int device,
                                                                             absl::Duration bound);
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  // As Communicator::Allgather / Allreduce(kMax) of int64 host arrays: copied up, collected on the
  // scratch's stream, copied back, waited for (bounded). timeout: as the *Options' (unset: the
  // communicator's).
  [[nodiscard]] absl::Status Allgather(const int64_t* mine, size_t count, int64_t* all,
                                       std::optional<absl::Duration> timeout);
  [[nodiscard]] absl::Status AllreduceMax(int64_t* data, size_t count,
                                          std::optional<absl::Duration> timeout);

  // A device buffer of `bytes` for tensor `index`, zeroed on the scratch's stream (queued: work on
  // that stream after it sees zeros). Kept for the next step that leaves the tensor unmarked.
  [[nodiscard]] absl::StatusOr<TensorView> Zeros(int index, const TensorView& like);

  // Fused device buckets. Buffers and events live until the scratch is destroyed. The calls queue
  // work and return; any thread may make them (each sets the device for its own call).
  [[nodiscard]] absl::StatusOr<void*> Buffer(size_t bytes);
  [[nodiscard]] absl::StatusOr<cuda::CudaEvent> NewEvent();
  [[nodiscard]] absl::Status Copy(void* dst, const void* src, size_t bytes, cuda::CudaStream on);
  [[nodiscard]] absl::Status Zero(void* dst, size_t bytes, cuda::CudaStream on);
  [[nodiscard]] absl::Status Record(cuda::CudaEvent event, cuda::CudaStream on);
  // Work queued on `waiter` after this waits for `event`.
  [[nodiscard]] absl::Status Await(cuda::CudaStream waiter, cuda::CudaEvent event);
  // The scratch's own stream: fused buckets are reduced and copied back on it.
  cuda::CudaStream stream() const { return stream_; }

 private:
  DeviceScratch(Communicator& comm, std::shared_ptr<cuda::CudaApi> api, int device,
                absl::Duration bound)
      : comm_(comm), api_(std::move(api)), device_(device), bound_(bound) {}
  absl::Status Cuda(int error, const char* what) const;
  absl::Status Grow(size_t int64s);
  absl::Status HostWait(const char* what);

  Communicator& comm_;
  const std::shared_ptr<cuda::CudaApi> api_;
  const int device_;
  const absl::Duration bound_;
  cuda::CudaStream stream_ = nullptr;
  cuda::CudaEvent done_ = nullptr;
  int64_t* dev_ = nullptr;                         // device scratch
  int64_t* host_ = nullptr;                        // pinned
  size_t have_ = 0;                                // int64s in each
  std::map<int, std::pair<void*, size_t>> zeros_;  // per tensor: device buffer and its bytes
  std::vector<void*> buffers_;
  std::vector<cuda::CudaEvent> events_;
};

}  // namespace adaptcomm::bucketer

#endif  // ADAPTCOMM_LIB_PRECISION_BUCKETER_DEVICE_H_

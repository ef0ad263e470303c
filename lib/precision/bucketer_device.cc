#include "lib/precision/bucketer_device.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "lib/core/communicator/communicator_factory.h"

namespace adaptcomm::bucketer {

absl::StatusOr<std::unique_ptr<DeviceScratch>> DeviceScratch::Create(Communicator& comm, int device,
                                                                     absl::Duration bound) {
  absl::StatusOr<std::shared_ptr<cuda::CudaApi>> api = internal::CommunicatorCudaApi(comm);
  if (!api.ok()) return api.status();
  std::unique_ptr<DeviceScratch> d(new DeviceScratch(comm, *std::move(api), device, bound));
  cuda::ScopedCudaDevice on(*d->api_, device);
  if (absl::Status s = d->Cuda(on.error(), "cudaSetDevice"); !s.ok()) return s;
  if (absl::Status s = d->Cuda(d->api_->StreamCreateNonBlocking(&d->stream_), "cudaStreamCreate");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = d->Cuda(d->api_->EventCreateDisableTiming(&d->done_), "cudaEventCreate");
      !s.ok()) {
    return s;
  }
  return d;
}

DeviceScratch::~DeviceScratch() {
  cuda::ScopedCudaDevice on(*api_, device_);
  // Every use was waited for (HostWait) or belongs to a bucket Wait() waited for.
  if (dev_ != nullptr) (void)api_->Free(dev_);
  if (host_ != nullptr) (void)api_->FreeHost(host_);
  for (auto& [index, zeros] : zeros_) (void)api_->Free(zeros.first);
  for (void* b : buffers_) (void)api_->Free(b);
  for (cuda::CudaEvent e : events_) (void)api_->EventDestroy(e);
  if (done_ != nullptr) (void)api_->EventDestroy(done_);
  if (stream_ != nullptr) (void)api_->StreamDestroy(stream_);
}

absl::Status DeviceScratch::Cuda(int error, const char* what) const {
  if (error == cuda::kCudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("gradient bucketer on cuda:", device_, ": ", what,
                                          " failed: ", api_->ErrorString(error)));
}

absl::Status DeviceScratch::Grow(size_t int64s) {
  if (have_ >= int64s) return absl::OkStatus();
  // Unused now: every earlier exchange was waited for.
  if (dev_ != nullptr) (void)api_->Free(dev_);
  if (host_ != nullptr) (void)api_->FreeHost(host_);
  dev_ = host_ = nullptr;
  have_ = 0;
  void* dev = nullptr;
  void* host = nullptr;
  if (absl::Status s = Cuda(api_->Malloc(&dev, int64s * sizeof(int64_t)), "cudaMalloc"); !s.ok()) {
    return s;
  }
  dev_ = static_cast<int64_t*>(dev);
  if (absl::Status s = Cuda(api_->HostAlloc(&host, int64s * sizeof(int64_t)), "cudaHostAlloc");
      !s.ok()) {
    return s;
  }
  host_ = static_cast<int64_t*>(host);
  have_ = int64s;
  return absl::OkStatus();
}

// A bounded wait for the scratch's stream: an event polled, never cudaStreamSynchronize.
absl::Status DeviceScratch::HostWait(const char* what) {
  if (absl::Status s = Cuda(api_->EventRecord(done_, stream_), "cudaEventRecord"); !s.ok()) {
    return s;
  }
  const absl::Time deadline = absl::Now() + bound_;
  for (int i = 0;; ++i) {
    const int q = api_->EventQuery(done_);
    if (q == cuda::kCudaSuccess) return absl::OkStatus();
    if (q != cuda::kCudaErrorNotReady) return Cuda(q, "cudaEventQuery");
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("gradient bucketer on cuda:", device_, ": ",
                                                      what, " did not finish within ",
                                                      absl::FormatDuration(bound_)));
    }
    cuda::PollPause(i);
  }
}

absl::Status DeviceScratch::Allgather(const int64_t* mine, size_t count, int64_t* all,
                                      std::optional<absl::Duration> timeout) {
  const size_t world = static_cast<size_t>(comm_.size());
  cuda::ScopedCudaDevice on(*api_, device_);
  if (absl::Status s = Cuda(on.error(), "cudaSetDevice"); !s.ok()) return s;
  if (absl::Status s = Grow(count * (world + 1)); !s.ok()) return s;
  const size_t bytes = count * sizeof(int64_t);
  std::memcpy(host_, mine, bytes);
  if (absl::Status s =
          Cuda(api_->MemcpyAsync(dev_, host_, bytes, cuda::MemcpyKind::kHostToDevice, stream_),
               "cudaMemcpyAsync");
      !s.ok()) {
    return s;
  }
  const Device d = Device::Cuda(device_);
  AllgatherOptions ao;
  ao.timeout = timeout;
  if (absl::Status s =
          comm_
              .Allgather(TensorView{dev_, count, DType::kI64, d, stream_},
                         TensorView{dev_ + count, count * world, DType::kI64, d, stream_}, ao)
              .Wait();
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Cuda(api_->MemcpyAsync(host_ + count, dev_ + count, bytes * world,
                                              cuda::MemcpyKind::kDeviceToHost, stream_),
                            "cudaMemcpyAsync");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = HostWait("the registration exchange"); !s.ok()) return s;
  std::memcpy(all, host_ + count, bytes * world);
  return absl::OkStatus();
}

absl::Status DeviceScratch::AllreduceMax(int64_t* data, size_t count,
                                         std::optional<absl::Duration> timeout) {
  cuda::ScopedCudaDevice on(*api_, device_);
  if (absl::Status s = Cuda(on.error(), "cudaSetDevice"); !s.ok()) return s;
  if (absl::Status s = Grow(count); !s.ok()) return s;
  const size_t bytes = count * sizeof(int64_t);
  std::memcpy(host_, data, bytes);
  if (absl::Status s =
          Cuda(api_->MemcpyAsync(dev_, host_, bytes, cuda::MemcpyKind::kHostToDevice, stream_),
               "cudaMemcpyAsync");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          comm_
              .Allreduce(TensorView{dev_, count, DType::kI64, Device::Cuda(device_), stream_},
                         {ReduceOp::kMax, timeout})
              .Wait();
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          Cuda(api_->MemcpyAsync(host_, dev_, bytes, cuda::MemcpyKind::kDeviceToHost, stream_),
               "cudaMemcpyAsync");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = HostWait("the error exchange"); !s.ok()) return s;
  std::memcpy(data, host_, bytes);
  return absl::OkStatus();
}

absl::StatusOr<TensorView> DeviceScratch::Zeros(int index, const TensorView& like) {
  cuda::ScopedCudaDevice on(*api_, device_);
  if (absl::Status s = Cuda(on.error(), "cudaSetDevice"); !s.ok()) return s;
  auto& [ptr, have] = zeros_[index];
  if (have < like.bytes()) {
    if (ptr != nullptr) (void)api_->Free(ptr);  // its last allreduce was waited for
    ptr = nullptr;
    have = 0;
    if (absl::Status s = Cuda(api_->Malloc(&ptr, like.bytes()), "cudaMalloc"); !s.ok()) return s;
    have = like.bytes();
  }
  if (absl::Status s = Cuda(api_->MemsetAsync(ptr, 0, like.bytes(), stream_), "cudaMemsetAsync");
      !s.ok()) {
    return s;
  }
  return TensorView{ptr, like.count, like.dtype, like.device, stream_};
}

absl::StatusOr<void*> DeviceScratch::Buffer(size_t bytes) {
  cuda::ScopedCudaDevice on(*api_, device_);
  if (absl::Status s = Cuda(on.error(), "cudaSetDevice"); !s.ok()) return s;
  void* p = nullptr;
  if (absl::Status s = Cuda(api_->Malloc(&p, bytes), "cudaMalloc of a bucket"); !s.ok()) return s;
  buffers_.push_back(p);
  return p;
}

absl::StatusOr<cuda::CudaEvent> DeviceScratch::NewEvent() {
  cuda::ScopedCudaDevice on(*api_, device_);
  if (absl::Status s = Cuda(on.error(), "cudaSetDevice"); !s.ok()) return s;
  cuda::CudaEvent e = nullptr;
  if (absl::Status s = Cuda(api_->EventCreateDisableTiming(&e), "cudaEventCreate"); !s.ok()) {
    return s;
  }
  events_.push_back(e);
  return e;
}

absl::Status DeviceScratch::Copy(void* dst, const void* src, size_t bytes, cuda::CudaStream on) {
  cuda::ScopedCudaDevice d(*api_, device_);
  if (absl::Status s = Cuda(d.error(), "cudaSetDevice"); !s.ok()) return s;
  return Cuda(api_->MemcpyAsync(dst, src, bytes, cuda::MemcpyKind::kDeviceToDevice, on),
              "cudaMemcpyAsync of a bucket slot");
}

absl::Status DeviceScratch::Zero(void* dst, size_t bytes, cuda::CudaStream on) {
  cuda::ScopedCudaDevice d(*api_, device_);
  if (absl::Status s = Cuda(d.error(), "cudaSetDevice"); !s.ok()) return s;
  return Cuda(api_->MemsetAsync(dst, 0, bytes, on), "cudaMemsetAsync of a bucket slot");
}

absl::Status DeviceScratch::Record(cuda::CudaEvent event, cuda::CudaStream on) {
  cuda::ScopedCudaDevice d(*api_, device_);
  if (absl::Status s = Cuda(d.error(), "cudaSetDevice"); !s.ok()) return s;
  return Cuda(api_->EventRecord(event, on), "cudaEventRecord");
}

absl::Status DeviceScratch::Await(cuda::CudaStream waiter, cuda::CudaEvent event) {
  cuda::ScopedCudaDevice d(*api_, device_);
  if (absl::Status s = Cuda(d.error(), "cudaSetDevice"); !s.ok()) return s;
  return Cuda(api_->StreamWaitEvent(waiter, event), "cudaStreamWaitEvent");
}

}  // namespace adaptcomm::bucketer

#include "lib/nccl/staged_backend.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/backend/backend_base.h"
#include "lib/backend/op_checks.h"
#include "lib/base/log.h"
#include "lib/base/op_views.h"
#include "lib/cuda/device_memory.h"
#include "lib/nccl/stream_order.h"

namespace adaptcomm::nccl {
namespace {

using cuda::CudaApi;
using cuda::CudaEvent;
using cuda::CudaStream;
using cuda::kCudaErrorNotReady;
using cuda::kCudaSuccess;
using cuda::MemcpyKind;
using cuda::PointerInfo;
using cuda::ScopedCudaDevice;

struct PinnedBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};

// The inner backend's capabilities, on device memory as well.
Capabilities WithDeviceMemory(Capabilities c) {
  c.device_memory = true;
  return c;
}

class StagedBackend final : public BackendBase {
 public:
  StagedBackend(std::unique_ptr<Backend> inner, std::shared_ptr<CudaApi> cuda, int device_count)
      : BackendBase({.name = absl::StrCat(inner->name(), "+staged"),
                     .rank = inner->rank(),
                     .size = inner->size(),
                     .capabilities = WithDeviceMemory(inner->capabilities())}),
        inner_(std::move(inner)),
        cuda_(std::move(cuda)),
        device_count_(device_count),
        device_memory_(cuda::MakeCudaDeviceMemory(cuda_)) {}
  ~StagedBackend() override;

  absl::Status Init(size_t initial_bytes) {
    if (initial_bytes == 0) return absl::OkStatus();
    if (absl::Status s = Reserve(in_, initial_bytes); !s.ok()) return s;
    return Reserve(out_, initial_bytes);
  }

  absl::Status Supports(const OpDesc& op) const override;
  absl::Status Run(const OpDesc& op) override;
  // This backend's failure (a copy's), else the inner backend's.
  absl::Status health() const override {
    if (absl::Status s = BackendBase::health(); !s.ok()) return s;
    return inner_->health();
  }
  std::shared_ptr<DeviceMemory> device_memory() const override { return device_memory_; }

 private:
  void Interrupt(const absl::Status& reason) override { inner_->Abort(reason); }
  absl::Status CheckDeviceView(const OpDesc& op, const TensorView& v, const char* which) const;
  absl::Status Reserve(PinnedBuffer& buffer, size_t bytes);
  // Waits until the work queued so far on `stream` of `device` is done.
  absl::Status Sync(int device, CudaStream stream, absl::Time deadline, const std::string& what);
  absl::Status Copy(void* dst, const void* src, size_t bytes, MemcpyKind kind,
                    const TensorView& view, const std::string& what);

  const std::unique_ptr<Backend> inner_;
  const std::shared_ptr<CudaApi> cuda_;
  const int device_count_;
  const std::shared_ptr<DeviceMemory> device_memory_;
  // Used by Run() only, which the communicator calls from one thread at a time.
  PinnedBuffer in_;
  PinnedBuffer out_;
  std::map<int, CudaEvent> events_;  // one per device: an event records on its own device only

  bool copies_abandoned_ = false;  // a copy timed out: the DMA may still target the buffers
};

StagedBackend::~StagedBackend() {
  if (copies_abandoned_) {
    ADAPTCOMM_LOG(kWarning, name(),
                  ": a device copy timed out; its pinned staging memory is "
                  "leaked rather than freed under a possibly running copy");
    return;
  }
  for (auto& [device, event] : events_) {
    (void)cuda_->SetDevice(device);
    (void)cuda_->EventDestroy(event);
  }
  if (in_.data != nullptr) (void)cuda_->FreeHost(in_.data);
  if (out_.data != nullptr) (void)cuda_->FreeHost(out_.data);
}

absl::Status StagedBackend::CheckDeviceView(const OpDesc& op, const TensorView& v,
                                            const char* which) const {
  const char* kind = OpKindName(op.kind);
  if (v.device.index < 0 || v.device.index >= device_count_) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), " backend: view ", which, " of ", kind, " is on cuda:", v.device.index,
                     ", which does not exist (", device_count_, " CUDA device(s) visible)"));
  }
  if (v.data != nullptr && v.count > 0) {
    PointerInfo info;
    const int e = cuda_->PointerGetAttributes(v.data, &info);
    if (e != kCudaSuccess || !info.is_device) {
      return absl::InvalidArgumentError(absl::StrCat(name(), " backend: view ", which, " of ", kind,
                                                     " is tagged cuda:", v.device.index,
                                                     " but its pointer is host memory"));
    }
  }
  return absl::OkStatus();
}

absl::Status StagedBackend::Supports(const OpDesc& op) const {
  OpDesc host = op;
  const bool in_dev = UsesInput(op.kind) && op.input.device.is_cuda();
  const bool out_dev = UsesOutput(op.kind) && op.output.device.is_cuda();
  if (in_dev) {
    if (absl::Status s = CheckDeviceView(op, op.input, "input"); !s.ok()) return s;
    host.input.device = Device::Cpu();
  }
  if (out_dev) {
    if (absl::Status s = CheckDeviceView(op, op.output, "output"); !s.ok()) return s;
    host.output.device = Device::Cpu();
  }
  // CUDA graphs: the staging copies and the host's wait for them (an event query) cannot be
  // captured. Asked here, on the issuing thread (the communicator calls Supports before it queues
  // the op): the refusal is then the op's alone, before anything touched the stream.
  auto what = [&] {
    return absl::StrCat(name(), " ", OpKindName(op.kind),
                        op.seq != 0 ? absl::StrCat(" seq ", op.seq) : std::string(), " (rank ",
                        inner_->rank(), ")");
  };
  if (in_dev) {
    if (absl::Status s = RefuseIfCapturing(*cuda_, op.input.stream, "input", what); !s.ok()) {
      return s;
    }
  }
  if (out_dev && (!in_dev || op.output.stream != op.input.stream)) {
    if (absl::Status s = RefuseIfCapturing(*cuda_, op.output.stream, "output", what); !s.ok()) {
      return s;
    }
  }
  return inner_->Supports(host);
}

absl::Status StagedBackend::Reserve(PinnedBuffer& buffer, size_t bytes) {
  if (buffer.bytes >= bytes) return absl::OkStatus();
  const size_t grown = std::max(bytes, buffer.bytes + buffer.bytes / 2);
  if (buffer.data != nullptr) (void)cuda_->FreeHost(buffer.data);
  buffer = PinnedBuffer{};
  void* p = nullptr;
  if (int e = cuda_->HostAlloc(&p, grown); e != kCudaSuccess || p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name(), ": cannot allocate ", grown,
                     " bytes of pinned staging memory: ", cuda_->ErrorString(e)));
  }
  buffer = PinnedBuffer{p, grown};
  return absl::OkStatus();
}

absl::Status StagedBackend::Sync(int device, CudaStream stream, absl::Time deadline,
                                 const std::string& what) {
  auto it = events_.find(device);
  if (it == events_.end()) {
    CudaEvent ev = nullptr;
    if (int e = cuda_->EventCreateDisableTiming(&ev); e != kCudaSuccess) {
      return absl::UnavailableError(
          absl::StrCat(what, ": cudaEventCreate: ", cuda_->ErrorString(e)));
    }
    it = events_.emplace(device, ev).first;
  }
  if (int e = cuda_->EventRecord(it->second, stream); e != kCudaSuccess) {
    return Fail(
        absl::UnavailableError(absl::StrCat(what, ": cudaEventRecord: ", cuda_->ErrorString(e))));
  }
  for (int i = 0;; ++i) {
    const int q = cuda_->EventQuery(it->second);
    if (q == kCudaSuccess) return absl::OkStatus();
    if (q != kCudaErrorNotReady) {
      return Fail(
          absl::UnavailableError(absl::StrCat(what, ": cudaEventQuery: ", cuda_->ErrorString(q))));
    }
    if (aborted() || absl::Now() > deadline) {
      copies_abandoned_ = true;
      if (aborted()) return health();
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(what, ": the device copy did not finish in time")));
    }
    cuda::PollPause(i);
  }
}

absl::Status StagedBackend::Copy(void* dst, const void* src, size_t bytes, MemcpyKind kind,
                                 const TensorView& view, const std::string& what) {
  if (bytes == 0) return absl::OkStatus();
  if (int e = cuda_->SetDevice(view.device.index); e != kCudaSuccess) {
    return Fail(
        absl::UnavailableError(absl::StrCat(what, ": cudaSetDevice: ", cuda_->ErrorString(e))));
  }
  if (int e = cuda_->MemcpyAsync(dst, src, bytes, kind, view.stream); e != kCudaSuccess) {
    return Fail(
        absl::UnavailableError(absl::StrCat(what, ": cudaMemcpyAsync: ", cuda_->ErrorString(e))));
  }
  return absl::OkStatus();
}

absl::Status StagedBackend::Run(const OpDesc& op) {
  const bool in_dev = UsesInput(op.kind) && op.input.device.is_cuda();
  const bool out_dev = UsesOutput(op.kind) && op.output.device.is_cuda();
  if (!in_dev && !out_dev) return inner_->Run(op);
  if (absl::Status s = health(); !s.ok()) {
    return BrokenBackendRefusal(name(), op, s);
  }
  if (absl::Status s = Supports(op); !s.ok()) return s;
  // Copies and events run on the view's device; the caller's current device is restored after.
  ScopedCudaDevice device(*cuda_, (in_dev ? op.input : op.output).device.index);
  const absl::Time deadline = absl::Now() + op.timeout;
  const std::string what = absl::StrCat(name(), " ", OpKindName(op.kind), " seq ", op.seq);
  const int rank = inner_->rank();

  OpDesc host = op;
  if (in_dev) {
    if (absl::Status s = Reserve(in_, op.input.bytes()); !s.ok()) return s;
    host.input.data = in_.data;
    host.input.device = Device::Cpu();
    host.input.stream = nullptr;
    if (absl::Status s = Copy(in_.data, op.input.data, op.input.bytes(), MemcpyKind::kDeviceToHost,
                              op.input, what);
        !s.ok()) {
      return s;
    }
  }
  if (out_dev) {
    if (absl::Status s = Reserve(out_, op.output.bytes()); !s.ok()) return s;
    host.output.data = out_.data;
    host.output.device = Device::Cpu();
    host.output.stream = nullptr;
    if (ReadsOutputOn(op, rank)) {
      if (absl::Status s = Copy(out_.data, op.output.data, op.output.bytes(),
                                MemcpyKind::kDeviceToHost, op.output, what);
          !s.ok()) {
        return s;
      }
    }
  }
  if (in_dev) {
    if (absl::Status s = Sync(op.input.device.index, op.input.stream, deadline, what); !s.ok()) {
      return s;
    }
  }
  if (out_dev && ReadsOutputOn(op, rank) &&
      (!in_dev || op.output.stream != op.input.stream ||
       op.output.device.index != op.input.device.index)) {
    if (absl::Status s = Sync(op.output.device.index, op.output.stream, deadline, what); !s.ok()) {
      return s;
    }
  }
  host.timeout = std::max(deadline - absl::Now(), absl::Milliseconds(1));
  if (absl::Status s = inner_->Run(host); !s.ok()) return s;
  if (out_dev && WritesOutputOn(op, rank)) {
    if (absl::Status s = Copy(op.output.data, out_.data, op.output.bytes(),
                              MemcpyKind::kHostToDevice, op.output, what);
        !s.ok()) {
      return s;
    }
    // Waited for: the next op reuses the staging memory this copy reads.
    return Sync(op.output.device.index, op.output.stream, deadline, what);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateStagedBackend(std::unique_ptr<Backend> inner,
                                                             std::shared_ptr<CudaApi> cuda,
                                                             const StagingOptions& options) {
  if (inner == nullptr || cuda == nullptr) {
    return absl::InvalidArgumentError("CreateStagedBackend: inner backend and CUDA API required");
  }
  int device_count = 0;
  if (int e = cuda->GetDeviceCount(&device_count); e != kCudaSuccess) device_count = 0;
  auto staged = std::make_unique<StagedBackend>(std::move(inner), std::move(cuda), device_count);
  if (absl::Status s = staged->Init(options.initial_bytes); !s.ok()) return s;
  return std::unique_ptr<Backend>(std::move(staged));
}

}  // namespace adaptcomm::nccl

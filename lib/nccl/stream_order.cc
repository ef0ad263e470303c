#include "lib/nccl/stream_order.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/nccl/device_timing.h"
#include "lib/nccl/nccl_backend.h"

namespace adaptcomm::nccl {

using cuda::CudaEvent;
using cuda::kCudaErrorNotReady;
using cuda::kCudaSuccess;
using cuda::ScopedCudaDevice;

EventPool::~EventPool() {
  std::vector<CudaEvent> events;
  {
    SpinLockHold hold(&mu_);
    events.swap(free_);
  }
  for (CudaEvent event : events) (void)api_->EventDestroy(event);
}

absl::StatusOr<CudaEvent> EventPool::Take() {
  {
    SpinLockHold hold(&mu_);
    if (!free_.empty()) {
      CudaEvent event = free_.back();
      free_.pop_back();
      return event;
    }
  }
  ScopedCudaDevice device(*api_, device_);
  CudaEvent event = nullptr;
  int e = device.error();
  if (e == kCudaSuccess) {
    e = timing_ ? api_->EventCreateWithTiming(&event) : api_->EventCreateDisableTiming(&event);
  }
  if (e != kCudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("cudaEventCreate on cuda:", device_, ": ", api_->ErrorString(e)));
  }
  return event;
}

absl::Status EventPool::TakeTwo(CudaEvent* first, CudaEvent* second) {
  {
    SpinLockHold hold(&mu_);
    if (free_.size() >= 2) {
      *first = free_.back();
      free_.pop_back();
      *second = free_.back();
      free_.pop_back();
      return absl::OkStatus();
    }
  }
  absl::StatusOr<CudaEvent> a = Take();
  if (!a.ok()) return a.status();
  absl::StatusOr<CudaEvent> b = Take();
  if (!b.ok()) {
    Give(*a);
    return b.status();
  }
  *first = *a;
  *second = *b;
  return absl::OkStatus();
}

void EventPool::Give(CudaEvent event, CudaEvent other) {
  SpinLockHold hold(&mu_);
  if (event != nullptr) free_.push_back(event);
  if (other != nullptr) free_.push_back(other);
}

std::string LaunchedOp::Name() const {
  return absl::StrCat("nccl ", OpKindName(kind), " seq ", seq, " (rank ", rank, ", cuda:", device,
                      ")");
}

absl::Status RefuseIfCapturing(cuda::CudaApi& api, cuda::CudaStream stream, const char* which,
                               absl::FunctionRef<std::string()> what) {
  cuda::CaptureStatus capture = cuda::CaptureStatus::kNone;
  const int e = api.StreamIsCapturing(stream, &capture);
  if (e == kCudaSuccess && capture == cuda::CaptureStatus::kNone) return absl::OkStatus();
  if (e != kCudaSuccess && !cuda::IsStreamCaptureError(e)) return absl::OkStatus();
  const std::string state =
      e != kCudaSuccess ? api.ErrorString(e)
                        : (capture == cuda::CaptureStatus::kActive ? "active" : "invalidated");
  return absl::FailedPreconditionError(absl::StrCat(
      what(), " refused: the ", which, " view's stream ",
      stream == nullptr ? std::string("(legacy default stream)")
                        : absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(stream))),
      " is capturing a CUDA graph (cudaStreamIsCapturing: ", state,
      "). CUDA graph capture of adaptcomm ops is not supported: issue the op outside the capture "
      "(before cudaStreamBeginCapture or after cudaStreamEndCapture). Nothing was queued on the "
      "stream and the communicator is unaffected"));
}

absl::Status CommHealth::Check(const LaunchedOp& op) {
  absl::ReaderMutexLock lock(&mu_);
  if (!live_) return retired_;
  NcclResult state = NcclResult::kSuccess;
  NcclResult r = api_->CommGetAsyncError(comm_, &state);
  if (r != NcclResult::kSuccess) state = r;
  if (state == NcclResult::kSuccess || state == NcclResult::kInProgress) return absl::OkStatus();
  return MapNcclResult(state, absl::StrCat(op.Name(), " (asynchronous error)"),
                       api_->GetLastError(comm_));
}

void CommHealth::Retire(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (!live_) return;
  live_ = false;
  retired_ = std::move(why);
}

NcclOpEvents::~NcclOpEvents() {
  shared_->pool.Give(issued_, done_);
  if (timing_start_ != nullptr) shared_->timing.Give(timing_start_, timing_end_);
}

std::optional<absl::Duration> NcclOpEvents::DeviceTime() {
  return ReadDeviceTime(shared_->timing.api(), timing_start_, timing_end_);
}

absl::StatusOr<bool> NcclOpEvents::Poll() {
  // The event first: ncclCommAbort also ends the kernels, so a done event counts only while the
  // communicator was not retired (an op it ended must fail, not pass as done).
  // The watchdog polls while a trainer's thread may be capturing a CUDA graph: in CUDA's default
  // (global) capture mode an event query from any thread invalidates that capture and fails. This
  // thread captures nothing, so it asks in thread-local mode.
  int q = kCudaSuccess;
  {
    cuda::ScopedCaptureModeThreadLocal relaxed(shared_->pool.api());
    q = shared_->pool.api().EventQuery(done_);
  }
  if (absl::Status s = shared_->health.Check(op_); !s.ok()) return s;
  if (q == kCudaSuccess) return true;
  if (q == kCudaErrorNotReady) return false;
  return absl::UnavailableError(
      absl::StrCat(op_.Name(), ": cudaEventQuery: ", shared_->pool.api().ErrorString(q)));
}

absl::Status NcclOpEvents::MakeStreamWait(void* stream) {
  if (int e = shared_->pool.api().StreamWaitEvent(stream, done_); e != kCudaSuccess) {
    if (cuda::IsStreamCaptureError(e)) {
      // Waited for inside a capture: the graph would wait on an event of this one run (CUDA
      // refuses a capturing stream's wait on an event recorded outside the capture).
      return absl::FailedPreconditionError(absl::StrCat(
          op_.Name(), ": Wait() on a stream that is capturing a CUDA graph (cudaStreamWaitEvent: ",
          shared_->pool.api().ErrorString(e),
          "); CUDA graph capture of adaptcomm ops is not supported: wait for the op before "
          "cudaStreamBeginCapture or after cudaStreamEndCapture"));
    }
    return absl::UnavailableError(
        absl::StrCat(op_.Name(), ": cudaStreamWaitEvent: ", shared_->pool.api().ErrorString(e)));
  }
  return absl::OkStatus();
}

}  // namespace adaptcomm::nccl

// The seam between adaptcomm and the CUDA runtime: just the calls the library makes (device
// selection, pointer queries, streams, events, copies, device and pinned memory, the cast kernels
// of the device mixed-precision path), in our own types, so that tests and a build without CUDA
// compile without any CUDA header. The real implementation (cuda_api_runtime.cc) calls the
// statically linked CUDA runtime; tests inject a fake (tests/fake_nccl_api.h). Whoever needs the
// runtime receives a CudaApi (the NCCL backend, staging, the device mixed-precision path through
// the communicator it runs on); nothing reaches it through a process global but LoadCudaApi().
//
// Error values are cudaError_t's (the real implementation static_asserts those named here).
#ifndef ADAPTCOMM_LIB_CUDA_CUDA_API_H_
#define ADAPTCOMM_LIB_CUDA_CUDA_API_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace adaptcomm::cuda {

// Opaque handles: a cudaStream_t (nullptr = legacy default stream), a cudaEvent_t.
using CudaStream = void*;
using CudaEvent = void*;

// cudaError_t values this code tells apart; any other value is passed through as an int.
inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorInsufficientDriver = 35;
inline constexpr int kCudaErrorNoDevice = 100;
inline constexpr int kCudaErrorNotReady = 600;
// Returned by the CudaApi calls that an implementation does not provide.
inline constexpr int kCudaErrorNotSupported = 801;
// Stream capture (CUDA graphs): the errors CUDA returns for what a capture forbids.
inline constexpr int kCudaErrorStreamCaptureUnsupported = 900;  // not allowed during a capture
inline constexpr int kCudaErrorStreamCaptureInvalidated = 901;  // the capture was invalidated
inline constexpr int kCudaErrorStreamCaptureIsolation = 905;    // wait on an event outside capture
inline constexpr int kCudaErrorStreamCaptureImplicit = 906;     // legacy stream during a capture
inline constexpr int kCudaErrorCapturedEvent = 907;  // query/sync of an event recorded in capture
// True for the cudaErrorStreamCapture* / cudaErrorCapturedEvent family (900-908).
inline bool IsStreamCaptureError(int error) { return error >= 900 && error <= 908; }

// cudaStreamCaptureStatus: whether a stream is capturing a CUDA graph (cudaStreamIsCapturing).
// An invalidated capture is still a capture (its stream stays in capture mode until it ends).
enum class CaptureStatus : int { kNone = 0, kActive = 1, kInvalidated = 2 };
// cudaStreamCaptureMode: which calls of this thread a capture forbids
// (cudaThreadExchangeStreamCaptureMode). kGlobal (the default) forbids "potentially unsafe" calls
// (cudaMalloc, cudaEventQuery, ...) while this thread or any thread capturing in kGlobal mode has a
// capture open; kThreadLocal only while this thread does; kRelaxed never.
enum class CaptureMode : int { kGlobal = 0, kThreadLocal = 1, kRelaxed = 2 };

enum class MemcpyKind : int { kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3 };

// What CudaApi::LaunchCast converts. Same semantics, bit for bit, as lib/precision's CPU casts
// (adaptcomm/precision.h): round to nearest even, NaN kept (quiet, sign and top payload bits),
// fp32 -> fp16 overflow to +-Inf counted.
// kF32ToF32 is a multiply by `scale` (dst may equal src), for the plain fp32 wire.
enum class CastDirection : int {
  kF32ToBF16 = 0,
  kF32ToF16 = 1,
  kBF16ToF32 = 2,
  kF16ToF32 = 3,
  kF32ToF32 = 4,
};

// Device counters a cast adds to (atomically: several casts may share one set). Zero them
// (MemsetAsync) before the first cast that should be counted alone.
struct DeviceCastCounters {
  unsigned long long overflow;   // finite inputs that became +-Inf (narrowing only)
  unsigned long long nonfinite;  // NaN/Inf inputs
};

struct PointerInfo {
  bool is_device = false;  // device or managed memory (what NCCL can use)
  int device = -1;
};

// The CUDA runtime calls adaptcomm makes. Every method may be called from any thread (CUDA's
// current device is per thread: callers set it before device-specific calls).
class CudaApi {
 public:
  virtual ~CudaApi() = default;
  virtual int GetDeviceCount(int* count) = 0;
  virtual int SetDevice(int device) = 0;
  virtual int DriverVersion(int* version) = 0;  // 12040 = 12.4; 0 = no driver
  virtual int RuntimeVersion(int* version) = 0;
  virtual int PointerGetAttributes(const void* ptr, PointerInfo* info) = 0;
  virtual int StreamCreateNonBlocking(CudaStream* stream) = 0;
  virtual int StreamDestroy(CudaStream stream) = 0;
  virtual int EventCreateDisableTiming(CudaEvent* event) = 0;
  virtual int EventRecord(CudaEvent event, CudaStream stream) = 0;
  // kCudaSuccess when the work recorded before the event is done, kCudaErrorNotReady if not yet.
  virtual int EventQuery(CudaEvent event) = 0;
  virtual int EventDestroy(CudaEvent event) = 0;
  virtual int MemcpyAsync(void* dst, const void* src, size_t bytes, MemcpyKind kind,
                          CudaStream stream) = 0;
  virtual int Malloc(void** ptr, size_t bytes) = 0;
  virtual int Free(void* ptr) = 0;
  // Pinned, portable host memory (usable by every device's copies).
  virtual int HostAlloc(void** ptr, size_t bytes) = 0;
  virtual int FreeHost(void* ptr) = 0;
  // Queues fn(arg) on `stream` (work after it waits for it); bench/gpu_check stalls a stream with
  // it to force a timeout.
  virtual int LaunchHostFunc(CudaStream stream, void (*fn)(void*), void* arg) = 0;
  virtual std::string ErrorString(int error) = 0;

  // Stream ordering for the device mixed-precision path (lib/precision/mixed_device.cc). The
  // defaults return kCudaErrorNotSupported, so implementations that predate them still build.
  // Work queued on `stream` after this call waits until `event`'s recorded work is done.
  // The calling thread's current device (ScopedCudaDevice restores it).
  virtual int GetDevice(int* /*device*/) { return kCudaErrorNotSupported; }
  virtual int StreamWaitEvent(CudaStream /*stream*/, CudaEvent /*event*/) {
    return kCudaErrorNotSupported;
  }
  // Blocks until everything queued on `stream` is done (unbounded: prefer an event and a bounded
  // EventQuery poll where a wait must have a bound).
  virtual int StreamSynchronize(CudaStream /*stream*/) { return kCudaErrorNotSupported; }
  // The device `stream` belongs to (cudaStreamGetDevice, CUDA 12.8+).
  virtual int StreamGetDevice(CudaStream /*stream*/, int* /*device*/) {
    return kCudaErrorNotSupported;
  }
  virtual int MemsetAsync(void* /*ptr*/, int /*value*/, size_t /*bytes*/, CudaStream /*stream*/) {
    return kCudaErrorNotSupported;
  }
  // Whether `stream` is capturing a CUDA graph (cudaStreamIsCapturing: a host-side query that
  // neither waits nor touches the stream's work). kCudaErrorStreamCaptureImplicit for the legacy
  // stream while a blocking stream captures.
  virtual int StreamIsCapturing(CudaStream /*stream*/, CaptureStatus* /*status*/) {
    return kCudaErrorNotSupported;
  }
  // Sets this thread's capture mode to *mode and returns the previous one in *mode
  // (cudaThreadExchangeStreamCaptureMode; use it push-pop, as ScopedCaptureModeThreadLocal does).
  virtual int ThreadExchangeStreamCaptureMode(CaptureMode* /*mode*/) {
    return kCudaErrorNotSupported;
  }
  // Device-side timing of the NCCL backend's ops (lib/nccl/stream_order.h, "Device timing").
  // An event created with timing enabled (cudaEventCreateWithFlags(cudaEventDefault)): it costs
  // more to record than a cudaEventDisableTiming one, so only sampled ops take them.
  virtual int EventCreateWithTiming(CudaEvent* /*event*/) { return kCudaErrorNotSupported; }
  // *ms = the time between two completed events created with timing (cudaEventElapsedTime; about
  // half a microsecond of resolution). Never waits: kCudaErrorNotReady while either is not
  // complete, an invalid-handle error for an event created with cudaEventDisableTiming.
  virtual int EventElapsedTime(float* /*ms*/, CudaEvent /*start*/, CudaEvent /*end*/) {
    return kCudaErrorNotSupported;
  }
  // Queues the conversion of `count` elements src -> dst on `stream` (lib/cuda/cast_kernels.cu;
  // the current device must be the memory's). Widening multiplies by `scale` in fp32 (scale 1:
  // exact). `counters`: null, or device memory the cast adds its counts to. src and dst must not
  // overlap (except kF32ToF32 in place); any alignment works (unaligned buffers take the scalar
  // loop). A widening cast with dst == nullptr only counts (the NaN/Inf of a wire result).
  virtual int LaunchCast(CastDirection /*direction*/, const void* /*src*/, void* /*dst*/,
                         size_t /*count*/, float /*scale*/, CudaStream /*stream*/,
                         DeviceCastCounters* /*counters*/) {
    return kCudaErrorNotSupported;
  }
};

// Makes `device` current on this thread for the scope and restores the caller's device after: a
// library must not leave a trainer's thread on another GPU. error() is the cudaSetDevice result.
class ScopedCudaDevice {
 public:
  ScopedCudaDevice(CudaApi& api, int device) : api_(api) {
    if (api_.GetDevice(&previous_) != kCudaSuccess) previous_ = -1;
    error_ = previous_ == device ? kCudaSuccess : api_.SetDevice(device);
    if (previous_ == device) previous_ = -1;  // nothing to restore
  }
  ~ScopedCudaDevice() {
    if (previous_ >= 0) (void)api_.SetDevice(previous_);
  }
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;
  int error() const { return error_; }

 private:
  CudaApi& api_;
  int previous_ = -1;
  int error_ = kCudaSuccess;
};

// Puts this thread in CaptureMode::kThreadLocal for the scope and restores its mode after: a
// library thread that polls events (the watchdog) then does not invalidate a CUDA graph another
// thread is capturing in kGlobal mode (CUDA forbids an event query from any thread during such a
// capture, even of an event recorded outside it). What this thread captures itself, if anything,
// is still protected. Two calls of a thread-local setting: cheap, never blocking.
class ScopedCaptureModeThreadLocal {
 public:
  explicit ScopedCaptureModeThreadLocal(CudaApi& api) : api_(api) {
    set_ = api_.ThreadExchangeStreamCaptureMode(&previous_) == kCudaSuccess;
  }
  ~ScopedCaptureModeThreadLocal() {
    if (set_) (void)api_.ThreadExchangeStreamCaptureMode(&previous_);
  }
  ScopedCaptureModeThreadLocal(const ScopedCaptureModeThreadLocal&) = delete;
  ScopedCaptureModeThreadLocal& operator=(const ScopedCaptureModeThreadLocal&) = delete;

 private:
  CudaApi& api_;
  CaptureMode previous_ = CaptureMode::kThreadLocal;
  bool set_ = false;
};

// One pause of a loop that polls a CUDA event (or NCCL's asynchronous state): yields for the first
// iterations (GPU ops of small messages finish in microseconds), then sleeps 10 us doubling to
// 640 us.
void PollPause(int iteration);

// True when this adaptcomm was built with the CUDA toolkit (the real CUDA runtime and NCCL loader).
bool CudaBuiltIn();
// True when the CUDA cast kernels (lib/cuda/cast_kernels.cu) were compiled in: CudaBuiltIn() and
// nvcc worked at build time. Without them the real CudaApi::LaunchCast returns
// kCudaErrorNotSupported.
bool CastKernelsBuiltIn();

// The process's CUDA runtime (statically linked; one object per process). FailedPrecondition when
// not built with CUDA.
absl::StatusOr<std::shared_ptr<CudaApi>> LoadCudaApi();

}  // namespace adaptcomm::cuda

#endif  // ADAPTCOMM_LIB_CUDA_CUDA_API_H_

// The real CUDA seam: the statically linked CUDA runtime.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "lib/cuda/cuda_api.h"
#ifdef ADAPTCOMM_HAVE_CAST_KERNELS
#include "lib/cuda/cast_kernels_cuda.h"
#endif

namespace adaptcomm::cuda {
namespace {

static_assert(kCudaErrorNotReady == cudaErrorNotReady);
static_assert(kCudaErrorNoDevice == cudaErrorNoDevice);
static_assert(kCudaErrorInsufficientDriver == cudaErrorInsufficientDriver);
static_assert(kCudaErrorNotSupported == cudaErrorNotSupported);
static_assert(kCudaErrorStreamCaptureUnsupported == cudaErrorStreamCaptureUnsupported);
static_assert(kCudaErrorStreamCaptureInvalidated == cudaErrorStreamCaptureInvalidated);
static_assert(kCudaErrorStreamCaptureIsolation == cudaErrorStreamCaptureIsolation);
static_assert(kCudaErrorStreamCaptureImplicit == cudaErrorStreamCaptureImplicit);
static_assert(kCudaErrorCapturedEvent == cudaErrorCapturedEvent);
static_assert(cudaErrorStreamCaptureUnsupported == 900 && cudaErrorStreamCaptureWrongThread == 908);
static_assert(static_cast<int>(CaptureStatus::kNone) == cudaStreamCaptureStatusNone);
static_assert(static_cast<int>(CaptureStatus::kActive) == cudaStreamCaptureStatusActive);
static_assert(static_cast<int>(CaptureStatus::kInvalidated) == cudaStreamCaptureStatusInvalidated);
static_assert(static_cast<int>(CaptureMode::kGlobal) == cudaStreamCaptureModeGlobal);
static_assert(static_cast<int>(CaptureMode::kThreadLocal) == cudaStreamCaptureModeThreadLocal);
static_assert(static_cast<int>(CaptureMode::kRelaxed) == cudaStreamCaptureModeRelaxed);
#ifdef ADAPTCOMM_HAVE_CAST_KERNELS
static_assert(static_cast<int>(CastDirection::kF32ToBF16) == kernels::kCastF32ToBF16);
static_assert(static_cast<int>(CastDirection::kF32ToF16) == kernels::kCastF32ToF16);
static_assert(static_cast<int>(CastDirection::kBF16ToF32) == kernels::kCastBF16ToF32);
static_assert(static_cast<int>(CastDirection::kF16ToF32) == kernels::kCastF16ToF32);
static_assert(static_cast<int>(CastDirection::kF32ToF32) == kernels::kCastF32ToF32);
static_assert(sizeof(DeviceCastCounters) == 2 * sizeof(unsigned long long));
#endif

class CudaRuntime final : public CudaApi {
 public:
  int GetDeviceCount(int* count) override { return cudaGetDeviceCount(count); }
  int SetDevice(int device) override { return cudaSetDevice(device); }
  int GetDevice(int* device) override { return cudaGetDevice(device); }
  int DriverVersion(int* version) override { return cudaDriverGetVersion(version); }
  int RuntimeVersion(int* version) override { return cudaRuntimeGetVersion(version); }
  int PointerGetAttributes(const void* ptr, PointerInfo* info) override {
    cudaPointerAttributes attr{};
    cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky, but do not leave it for the next caller
      return e;
    }
    info->is_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
    info->device = attr.device;
    return cudaSuccess;
  }
  int StreamCreateNonBlocking(CudaStream* stream) override {
    cudaStream_t s = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    *stream = s;
    return e;
  }
  int StreamDestroy(CudaStream stream) override {
    return cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
  int EventCreateDisableTiming(CudaEvent* event) override {
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    *event = ev;
    return e;
  }
  int EventCreateWithTiming(CudaEvent* event) override {
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDefault);
    *event = ev;
    return e;
  }
  int EventElapsedTime(float* ms, CudaEvent start, CudaEvent end) override {
    return cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end));
  }
  int EventRecord(CudaEvent event, CudaStream stream) override {
    return cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
  }
  int EventQuery(CudaEvent event) override {
    return cudaEventQuery(static_cast<cudaEvent_t>(event));
  }
  int EventDestroy(CudaEvent event) override {
    return cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  int MemcpyAsync(void* dst, const void* src, size_t bytes, MemcpyKind kind,
                  CudaStream stream) override {
    cudaMemcpyKind k = cudaMemcpyDefault;
    switch (kind) {
      case MemcpyKind::kHostToDevice:
        k = cudaMemcpyHostToDevice;
        break;
      case MemcpyKind::kDeviceToHost:
        k = cudaMemcpyDeviceToHost;
        break;
      case MemcpyKind::kDeviceToDevice:
        k = cudaMemcpyDeviceToDevice;
        break;
    }
    return cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream));
  }
  int Malloc(void** ptr, size_t bytes) override { return cudaMalloc(ptr, bytes); }
  int Free(void* ptr) override { return cudaFree(ptr); }
  int HostAlloc(void** ptr, size_t bytes) override {
    return cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
  }
  int FreeHost(void* ptr) override { return cudaFreeHost(ptr); }
  int LaunchHostFunc(CudaStream stream, void (*fn)(void*), void* arg) override {
    return cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), fn, arg);
  }
  int StreamWaitEvent(CudaStream stream, CudaEvent event) override {
    return cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event),
                               0);
  }
  int StreamSynchronize(CudaStream stream) override {
    return cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  }
  int StreamGetDevice(CudaStream stream, int* device) override {
    return cudaStreamGetDevice(static_cast<cudaStream_t>(stream), device);
  }
  int MemsetAsync(void* ptr, int value, size_t bytes, CudaStream stream) override {
    return cudaMemsetAsync(ptr, value, bytes, static_cast<cudaStream_t>(stream));
  }
  int StreamIsCapturing(CudaStream stream, CaptureStatus* status) override {
    cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &s);
    *status = static_cast<CaptureStatus>(s);
    return e;
  }
  int ThreadExchangeStreamCaptureMode(CaptureMode* mode) override {
    auto m = static_cast<cudaStreamCaptureMode>(*mode);
    const cudaError_t e = cudaThreadExchangeStreamCaptureMode(&m);
    *mode = static_cast<CaptureMode>(m);
    return e;
  }
  int LaunchCast(CastDirection direction, const void* src, void* dst, size_t count, float scale,
                 CudaStream stream, DeviceCastCounters* counters) override {
#ifdef ADAPTCOMM_HAVE_CAST_KERNELS
    return kernels::LaunchCastKernel(static_cast<int>(direction), src, dst, count, scale, stream,
                                     reinterpret_cast<unsigned long long*>(counters));
#else
    (void)direction, (void)src, (void)dst, (void)count, (void)scale, (void)stream, (void)counters;
    return cudaErrorNotSupported;
#endif
  }
  std::string ErrorString(int error) override {
    return absl::StrCat(cudaGetErrorName(static_cast<cudaError_t>(error)), ": ",
                        cudaGetErrorString(static_cast<cudaError_t>(error)));
  }
};

}  // namespace

bool CudaBuiltIn() { return true; }

bool CastKernelsBuiltIn() {
#ifdef ADAPTCOMM_HAVE_CAST_KERNELS
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::shared_ptr<CudaApi>> LoadCudaApi() {
  static auto* const runtime = new std::shared_ptr<CudaApi>(std::make_shared<CudaRuntime>());
  return *runtime;
}

}  // namespace adaptcomm::cuda

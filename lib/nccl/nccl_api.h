// The seam between adaptcomm and NCCL + the CUDA runtime: just the calls the NCCL backend and the
// staging backend make, in our own types, so that tests (and a build without CUDA) compile without
// any CUDA or NCCL header. The real implementation (nccl_api_dlopen.cc) dlopen()s libnccl.so.2 and
// uses the statically linked CUDA runtime; tests/fake_nccl_api.h injects faults.
//
// Values of the enums mirror ncclResult_t, ncclDataType_t, ncclRedOp_t and cudaError_t, so the real
// implementation converts with a cast (static_asserts there keep that true).
#ifndef ADAPTCOMM_LIB_NCCL_NCCL_API_H_
#define ADAPTCOMM_LIB_NCCL_NCCL_API_H_

#include <climits>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace adaptcomm::nccl {

enum class NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};
const char* NcclResultName(NcclResult r);  // "ncclSystemError", ...

enum class NcclDataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
};

enum class NcclRedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };

struct NcclUniqueId {
  char internal[128] = {};
};

// Opaque handles: an ncclComm_t, a cudaStream_t (nullptr = legacy default stream), a cudaEvent_t.
struct NcclCommOpaque;
using NcclComm = NcclCommOpaque*;
using CudaStream = void*;
using CudaEvent = void*;

// ncclConfig_t's settable fields; kUndefInt / empty keeps NCCL's default (NCCL_CONFIG_UNDEF_INT).
inline constexpr int kUndefInt = INT_MIN;
struct NcclCommConfig {
  int blocking = kUndefInt;
  int cga_cluster_size = kUndefInt;
  int min_ctas = kUndefInt;
  int max_ctas = kUndefInt;
  std::string net_name;
  int split_share = kUndefInt;
  int traffic_class = kUndefInt;  // NCCL 2.26+
  std::string comm_name;          // NCCL 2.27+
  int cta_policy = kUndefInt;     // NCCL 2.27+
  int nvls_ctas = kUndefInt;      // NCCL 2.27+
};

// cudaError_t values this code tells apart; any other value is passed through as an int.
inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorInsufficientDriver = 35;
inline constexpr int kCudaErrorNoDevice = 100;
inline constexpr int kCudaErrorNotReady = 600;

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

// Returned by the CudaApi calls that an implementation does not provide.
inline constexpr int kCudaErrorNotSupported = 801;

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
  // Queues the conversion of `count` elements src -> dst on `stream` (lib/nccl/cast_kernels.cu;
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

// NCCL's calls (plus the CUDA runtime it runs on). Methods mirror nccl.h one to one.
class NcclApi : public CudaApi {
 public:
  // The file actually loaded ("/usr/local/cuda/lib64/libnccl.so.2"), or a fake's description.
  virtual std::string library_path() const = 0;
  virtual NcclResult GetVersion(int* version) = 0;
  virtual NcclResult GetUniqueId(NcclUniqueId* id) = 0;
  virtual NcclResult CommInitRankConfig(NcclComm* comm, int nranks, const NcclUniqueId& id,
                                        int rank, const NcclCommConfig& config) = 0;
  virtual NcclResult CommGetAsyncError(NcclComm comm, NcclResult* async_error) = 0;
  virtual NcclResult CommFinalize(NcclComm comm) = 0;
  virtual NcclResult CommDestroy(NcclComm comm) = 0;
  virtual NcclResult CommAbort(NcclComm comm) = 0;
  virtual std::string GetErrorString(NcclResult result) = 0;
  virtual std::string GetLastError(NcclComm comm) = 0;
  virtual NcclResult GroupStart() = 0;
  virtual NcclResult GroupEnd() = 0;
  virtual NcclResult AllReduce(const void* send, void* recv, size_t count, NcclDataType dtype,
                               NcclRedOp op, NcclComm comm, CudaStream stream) = 0;
  virtual NcclResult Broadcast(const void* send, void* recv, size_t count, NcclDataType dtype,
                               int root, NcclComm comm, CudaStream stream) = 0;
  virtual NcclResult Reduce(const void* send, void* recv, size_t count, NcclDataType dtype,
                            NcclRedOp op, int root, NcclComm comm, CudaStream stream) = 0;
  virtual NcclResult AllGather(const void* send, void* recv, size_t send_count, NcclDataType dtype,
                               NcclComm comm, CudaStream stream) = 0;
  virtual NcclResult ReduceScatter(const void* send, void* recv, size_t recv_count,
                                   NcclDataType dtype, NcclRedOp op, NcclComm comm,
                                   CudaStream stream) = 0;
  virtual NcclResult Send(const void* send, size_t count, NcclDataType dtype, int peer,
                          NcclComm comm, CudaStream stream) = 0;
  virtual NcclResult Recv(void* recv, size_t count, NcclDataType dtype, int peer, NcclComm comm,
                          CudaStream stream) = 0;
};

// Makes `device` current on this thread for the scope and restores the caller's device after:
// adaptcomm runs ops on the caller's thread too (Work::Wait helps), and a library must not leave a
// trainer's thread on another GPU. error() is the cudaSetDevice result.
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

// The oldest NCCL with everything the backend calls: ncclCommInitRankConfig, nonblocking
// communicators, ncclCommFinalize (2.14); ncclAvg and bf16 (2.10); ncclGetLastError (2.13).
inline constexpr int kMinNcclVersion = 21400;

// "2.28.9" from a version code: X*10000+Y*100+Z from 2.9 on, X*1000+Y*100+Z before.
std::string NcclVersionString(int code);
// The code normalised to the 2.9+ scheme (2.8.4 = 2804 -> 20804), so codes compare.
int NormalizeNcclVersion(int code);

// True when this adaptcomm was built with the CUDA toolkit (lib/nccl has its real loader).
bool CudaBuiltIn();
// True when the CUDA cast kernels (lib/nccl/cast_kernels.cu) were compiled in: CudaBuiltIn() and
// nvcc worked at build time. Without them the real CudaApi::LaunchCast returns
// kCudaErrorNotSupported.
bool CastKernelsBuiltIn();

// The process's CUDA runtime (statically linked). FailedPrecondition when not built with CUDA.
absl::StatusOr<std::shared_ptr<CudaApi>> LoadCudaApi();

// dlopen()s NCCL once per process: `path` if given, else $ADAPTCOMM_NCCL_LIBRARY, else
// "libnccl.so.2". Every required symbol is checked; errors: FailedPrecondition "NCCL backend not
// built: ..." (no CUDA at build time), Unavailable with dlerror()'s text ("libnccl.so.2: cannot
// open shared object file: ..."), or Unavailable naming the first missing symbol. A successful load
// is cached per path; a failed one is retried on the next call.
absl::StatusOr<std::shared_ptr<NcclApi>> LoadNcclApi(const std::string& path = "");

// The CudaApi the device mixed-precision path uses: LoadCudaApi() (loaded once), unless a test
// rank thread installed its own (below). Thread-safe.
absl::StatusOr<std::shared_ptr<CudaApi>> ProcessCudaApi();
// Tests running ranks as threads: ProcessCudaApi() on the calling thread returns `api` (each rank
// its own fake, as each process has its own CUDA runtime); nullptr clears it. Wins over the above.
void SetThreadCudaApiForTesting(std::shared_ptr<CudaApi> api);

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_NCCL_API_H_

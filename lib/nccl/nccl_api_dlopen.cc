// The real seam: the statically linked CUDA runtime, and NCCL loaded with dlopen() so that one
// build of adaptcomm runs on nodes with and without NCCL (and with whatever NCCL version the node
// has, from kMinNcclVersion on; the version check is the caller's).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>
#include <nccl.h>

#include <cstdlib>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/log.h"
#include "lib/nccl/nccl_api.h"
#ifdef ADAPTCOMM_HAVE_CAST_KERNELS
#include "lib/nccl/cast_kernels_cuda.h"
#endif

namespace adaptcomm::nccl {
namespace {

static_assert(static_cast<int>(NcclResult::kInProgress) == ncclInProgress);
static_assert(static_cast<int>(NcclResult::kRemoteError) == ncclRemoteError);
static_assert(static_cast<int>(NcclDataType::kBfloat16) == ncclBfloat16);
static_assert(static_cast<int>(NcclDataType::kFloat16) == ncclFloat16);
static_assert(static_cast<int>(NcclRedOp::kAvg) == ncclAvg);
static_assert(kCudaErrorNotReady == cudaErrorNotReady);
static_assert(kCudaErrorNoDevice == cudaErrorNoDevice);
static_assert(kCudaErrorInsufficientDriver == cudaErrorInsufficientDriver);
static_assert(kUndefInt == NCCL_CONFIG_UNDEF_INT);
static_assert(sizeof(NcclUniqueId) == sizeof(ncclUniqueId));
static_assert(kCudaErrorNotSupported == cudaErrorNotSupported);
#ifdef ADAPTCOMM_HAVE_CAST_KERNELS
static_assert(static_cast<int>(CastDirection::kF32ToBF16) == cuda::kCastF32ToBF16);
static_assert(static_cast<int>(CastDirection::kF32ToF16) == cuda::kCastF32ToF16);
static_assert(static_cast<int>(CastDirection::kBF16ToF32) == cuda::kCastBF16ToF32);
static_assert(static_cast<int>(CastDirection::kF16ToF32) == cuda::kCastF16ToF32);
static_assert(static_cast<int>(CastDirection::kF32ToF32) == cuda::kCastF32ToF32);
static_assert(sizeof(DeviceCastCounters) == 2 * sizeof(unsigned long long));
#endif

// The CUDA half, shared by the plain CUDA runtime object and the NCCL one.
template <typename Base>
class CudaRuntime : public Base {
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
  int LaunchCast(CastDirection direction, const void* src, void* dst, size_t count, float scale,
                 CudaStream stream, DeviceCastCounters* counters) override {
#ifdef ADAPTCOMM_HAVE_CAST_KERNELS
    return cuda::LaunchCastKernel(static_cast<int>(direction), src, dst, count, scale, stream,
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

// Every NCCL entry point the backend calls. A missing one fails the load, naming it.
struct NcclSymbols {
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*CommFinalize)(ncclComm_t);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  const char* (*GetErrorString)(ncclResult_t);
  const char* (*GetLastError)(ncclComm_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*Reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                         cudaStream_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t);
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
};

ncclComm_t C(NcclComm c) { return reinterpret_cast<ncclComm_t>(c); }
ncclDataType_t D(NcclDataType t) { return static_cast<ncclDataType_t>(t); }
ncclRedOp_t O(NcclRedOp op) { return static_cast<ncclRedOp_t>(op); }
cudaStream_t S(CudaStream s) { return static_cast<cudaStream_t>(s); }
NcclResult R(ncclResult_t r) { return static_cast<NcclResult>(r); }

class DlopenNcclApi final : public CudaRuntime<NcclApi> {
 public:
  DlopenNcclApi(void* handle, std::string path, const NcclSymbols& sym)
      : handle_(handle), path_(std::move(path)), sym_(sym) {}
  // The handle is never closed: NCCL keeps threads and CUDA state past its last communicator.

  std::string library_path() const override { return path_; }
  NcclResult GetVersion(int* version) override { return R(sym_.GetVersion(version)); }
  NcclResult GetUniqueId(NcclUniqueId* id) override {
    return R(sym_.GetUniqueId(reinterpret_cast<ncclUniqueId*>(id)));
  }
  NcclResult CommInitRankConfig(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                                const NcclCommConfig& c) override {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = c.blocking;
    config.cgaClusterSize = c.cga_cluster_size;
    config.minCTAs = c.min_ctas;
    config.maxCTAs = c.max_ctas;
    // NCCL copies the strings while parsing the config; `c` outlives this call anyway.
    if (!c.net_name.empty()) config.netName = c.net_name.c_str();
    config.splitShare = c.split_share;
#if NCCL_VERSION_CODE >= 22600
    config.trafficClass = c.traffic_class;
#endif
#if NCCL_VERSION_CODE >= 22700
    if (!c.comm_name.empty()) config.commName = c.comm_name.c_str();
    config.CTAPolicy = c.cta_policy;
    config.nvlsCTAs = c.nvls_ctas;
#endif
    ncclUniqueId uid;
    static_assert(sizeof(uid.internal) == sizeof(id.internal));
    for (size_t i = 0; i < sizeof(uid.internal); ++i) uid.internal[i] = id.internal[i];
    ncclComm_t out = nullptr;
    ncclResult_t r = sym_.CommInitRankConfig(&out, nranks, uid, rank, &config);
    *comm = reinterpret_cast<NcclComm>(out);
    return R(r);
  }
  NcclResult CommGetAsyncError(NcclComm comm, NcclResult* async_error) override {
    ncclResult_t a = ncclSuccess;
    ncclResult_t r = sym_.CommGetAsyncError(C(comm), &a);
    *async_error = R(a);
    return R(r);
  }
  NcclResult CommFinalize(NcclComm comm) override { return R(sym_.CommFinalize(C(comm))); }
  NcclResult CommDestroy(NcclComm comm) override { return R(sym_.CommDestroy(C(comm))); }
  NcclResult CommAbort(NcclComm comm) override { return R(sym_.CommAbort(C(comm))); }
  std::string GetErrorString(NcclResult result) override {
    const char* s = sym_.GetErrorString(static_cast<ncclResult_t>(result));
    return s == nullptr ? std::string() : std::string(s);
  }
  std::string GetLastError(NcclComm comm) override {
    const char* s = sym_.GetLastError(C(comm));
    return s == nullptr ? std::string() : std::string(s);
  }
  NcclResult GroupStart() override { return R(sym_.GroupStart()); }
  NcclResult GroupEnd() override { return R(sym_.GroupEnd()); }
  NcclResult AllReduce(const void* send, void* recv, size_t count, NcclDataType dtype, NcclRedOp op,
                       NcclComm comm, CudaStream stream) override {
    return R(sym_.AllReduce(send, recv, count, D(dtype), O(op), C(comm), S(stream)));
  }
  NcclResult Broadcast(const void* send, void* recv, size_t count, NcclDataType dtype, int root,
                       NcclComm comm, CudaStream stream) override {
    return R(sym_.Broadcast(send, recv, count, D(dtype), root, C(comm), S(stream)));
  }
  NcclResult Reduce(const void* send, void* recv, size_t count, NcclDataType dtype, NcclRedOp op,
                    int root, NcclComm comm, CudaStream stream) override {
    return R(sym_.Reduce(send, recv, count, D(dtype), O(op), root, C(comm), S(stream)));
  }
  NcclResult AllGather(const void* send, void* recv, size_t send_count, NcclDataType dtype,
                       NcclComm comm, CudaStream stream) override {
    return R(sym_.AllGather(send, recv, send_count, D(dtype), C(comm), S(stream)));
  }
  NcclResult ReduceScatter(const void* send, void* recv, size_t recv_count, NcclDataType dtype,
                           NcclRedOp op, NcclComm comm, CudaStream stream) override {
    return R(sym_.ReduceScatter(send, recv, recv_count, D(dtype), O(op), C(comm), S(stream)));
  }
  NcclResult Send(const void* send, size_t count, NcclDataType dtype, int peer, NcclComm comm,
                  CudaStream stream) override {
    return R(sym_.Send(send, count, D(dtype), peer, C(comm), S(stream)));
  }
  NcclResult Recv(void* recv, size_t count, NcclDataType dtype, int peer, NcclComm comm,
                  CudaStream stream) override {
    return R(sym_.Recv(recv, count, D(dtype), peer, C(comm), S(stream)));
  }

 private:
  void* const handle_;
  const std::string path_;
  const NcclSymbols sym_;
};

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* slot, std::string* missing) {
  void* p = dlsym(handle, name);
  if (p == nullptr) {
    if (missing->empty()) *missing = name;
    return false;
  }
  *slot = reinterpret_cast<Fn>(p);
  return true;
}

absl::StatusOr<std::shared_ptr<NcclApi>> Open(const std::string& name) {
  dlerror();
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::UnavailableError(err != nullptr ? std::string(err)
                                                 : absl::StrCat(name, ": dlopen failed"));
  }
  std::string path = name;
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    path = map->l_name;
  }
  NcclSymbols s{};
  std::string missing;
  Resolve(handle, "ncclGetVersion", &s.GetVersion, &missing);
  Resolve(handle, "ncclGetUniqueId", &s.GetUniqueId, &missing);
  Resolve(handle, "ncclCommInitRankConfig", &s.CommInitRankConfig, &missing);
  Resolve(handle, "ncclCommGetAsyncError", &s.CommGetAsyncError, &missing);
  Resolve(handle, "ncclCommFinalize", &s.CommFinalize, &missing);
  Resolve(handle, "ncclCommDestroy", &s.CommDestroy, &missing);
  Resolve(handle, "ncclCommAbort", &s.CommAbort, &missing);
  Resolve(handle, "ncclGetErrorString", &s.GetErrorString, &missing);
  Resolve(handle, "ncclGetLastError", &s.GetLastError, &missing);
  Resolve(handle, "ncclGroupStart", &s.GroupStart, &missing);
  Resolve(handle, "ncclGroupEnd", &s.GroupEnd, &missing);
  Resolve(handle, "ncclAllReduce", &s.AllReduce, &missing);
  Resolve(handle, "ncclBroadcast", &s.Broadcast, &missing);
  Resolve(handle, "ncclReduce", &s.Reduce, &missing);
  Resolve(handle, "ncclAllGather", &s.AllGather, &missing);
  Resolve(handle, "ncclReduceScatter", &s.ReduceScatter, &missing);
  Resolve(handle, "ncclSend", &s.Send, &missing);
  Resolve(handle, "ncclRecv", &s.Recv, &missing);
  if (!missing.empty()) {
    std::string version;
    int code = 0;
    if (s.GetVersion != nullptr && s.GetVersion(&code) == ncclSuccess) {
      version = absl::StrCat(" (NCCL ", NcclVersionString(code), ")");
    }
    dlclose(handle);
    return absl::UnavailableError(absl::StrCat(path, version, " lacks the symbol ", missing,
                                               " that adaptcomm needs (NCCL >= 2.14 exports it)"));
  }
  return std::shared_ptr<NcclApi>(std::make_shared<DlopenNcclApi>(handle, std::move(path), s));
}

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
  static auto* const runtime =
      new std::shared_ptr<CudaApi>(std::make_shared<CudaRuntime<CudaApi>>());
  return *runtime;
}

absl::StatusOr<std::shared_ptr<NcclApi>> LoadNcclApi(const std::string& path) {
  std::string name = path;
  if (name.empty()) {
    const char* env = std::getenv("ADAPTCOMM_NCCL_LIBRARY");
    name = (env != nullptr && env[0] != '\0') ? env : "libnccl.so.2";
  }
  static absl::Mutex mu(absl::kConstInit);
  static auto* const loaded ABSL_GUARDED_BY(mu) =
      new std::map<std::string, std::shared_ptr<NcclApi>>();
  absl::MutexLock lock(&mu);
  auto it = loaded->find(name);
  if (it != loaded->end()) return it->second;
  absl::StatusOr<std::shared_ptr<NcclApi>> api = Open(name);
  if (!api.ok()) return api.status();
  loaded->emplace(name, *api);
  int code = 0;
  (*api)->GetVersion(&code);
  ADAPTCOMM_LOG(kDebug, "loaded NCCL ", NcclVersionString(code), " from ", (*api)->library_path());
  return api;
}

}  // namespace adaptcomm::nccl

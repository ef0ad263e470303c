// The real NCCL seam: NCCL loaded with dlopen() so that one build of adaptcomm runs on nodes with
// and without NCCL (and with whatever NCCL version the node has, from kMinNcclVersion on; the
// version check is the caller's). nccl.h is compiled against only for its types and constants.
#include <dlfcn.h>
#include <link.h>
#include <nccl.h>

#include <cstdlib>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/log.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl {
namespace {

static_assert(static_cast<int>(NcclResult::kInProgress) == ncclInProgress);
static_assert(static_cast<int>(NcclResult::kRemoteError) == ncclRemoteError);
static_assert(static_cast<int>(NcclDataType::kBfloat16) == ncclBfloat16);
static_assert(static_cast<int>(NcclDataType::kFloat16) == ncclFloat16);
static_assert(static_cast<int>(NcclRedOp::kAvg) == ncclAvg);
static_assert(kUndefInt == NCCL_CONFIG_UNDEF_INT);
static_assert(sizeof(NcclUniqueId) == sizeof(ncclUniqueId));

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
  // Optional (null when the loaded NCCL lacks it): ncclCommSplit, NCCL 2.18+.
  ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*);
  // Optional (null when the loaded NCCL lacks it): ncclCommShrink, NCCL 2.27+.
  ncclResult_t (*CommShrink)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
  // Optional: ncclAlltoAll, NCCL 2.28+ (typed here, not taken from nccl.h, which older NCCLs
  // lack it in).
  ncclResult_t (*AlltoAll)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
};

#ifdef NCCL_SPLIT_NOCOLOR
static_assert(kSplitNoColor == NCCL_SPLIT_NOCOLOR);
#endif
#if NCCL_VERSION_CODE >= 22700
static_assert(kShrinkDefault == NCCL_SHRINK_DEFAULT);
static_assert(kShrinkAbort == NCCL_SHRINK_ABORT);
#endif

ncclComm_t C(NcclComm c) { return reinterpret_cast<ncclComm_t>(c); }
ncclDataType_t D(NcclDataType t) { return static_cast<ncclDataType_t>(t); }
ncclRedOp_t O(NcclRedOp op) { return static_cast<ncclRedOp_t>(op); }
cudaStream_t S(cuda::CudaStream s) { return static_cast<cudaStream_t>(s); }
NcclResult R(ncclResult_t r) { return static_cast<NcclResult>(r); }

// NCCL copies the strings while parsing the config; `c` outlives the call that uses the result.
ncclConfig_t ToConfig(const NcclCommConfig& c) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = c.blocking;
  config.cgaClusterSize = c.cga_cluster_size;
  config.minCTAs = c.min_ctas;
  config.maxCTAs = c.max_ctas;
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
  return config;
}

class DlopenNcclApi final : public NcclApi {
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
    ncclConfig_t config = ToConfig(c);
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
                       NcclComm comm, cuda::CudaStream stream) override {
    return R(sym_.AllReduce(send, recv, count, D(dtype), O(op), C(comm), S(stream)));
  }
  NcclResult Broadcast(const void* send, void* recv, size_t count, NcclDataType dtype, int root,
                       NcclComm comm, cuda::CudaStream stream) override {
    return R(sym_.Broadcast(send, recv, count, D(dtype), root, C(comm), S(stream)));
  }
  NcclResult Reduce(const void* send, void* recv, size_t count, NcclDataType dtype, NcclRedOp op,
                    int root, NcclComm comm, cuda::CudaStream stream) override {
    return R(sym_.Reduce(send, recv, count, D(dtype), O(op), root, C(comm), S(stream)));
  }
  NcclResult AllGather(const void* send, void* recv, size_t send_count, NcclDataType dtype,
                       NcclComm comm, cuda::CudaStream stream) override {
    return R(sym_.AllGather(send, recv, send_count, D(dtype), C(comm), S(stream)));
  }
  NcclResult ReduceScatter(const void* send, void* recv, size_t recv_count, NcclDataType dtype,
                           NcclRedOp op, NcclComm comm, cuda::CudaStream stream) override {
    return R(sym_.ReduceScatter(send, recv, recv_count, D(dtype), O(op), C(comm), S(stream)));
  }
  NcclResult Send(const void* send, size_t count, NcclDataType dtype, int peer, NcclComm comm,
                  cuda::CudaStream stream) override {
    return R(sym_.Send(send, count, D(dtype), peer, C(comm), S(stream)));
  }
  NcclResult Recv(void* recv, size_t count, NcclDataType dtype, int peer, NcclComm comm,
                  cuda::CudaStream stream) override {
    return R(sym_.Recv(recv, count, D(dtype), peer, C(comm), S(stream)));
  }
  bool has_comm_split() const override { return sym_.CommSplit != nullptr; }
  NcclResult CommSplit(NcclComm comm, int color, int key, NcclComm* newcomm,
                       const NcclCommConfig* c) override {
    *newcomm = nullptr;
    if (sym_.CommSplit == nullptr) return NcclResult::kInvalidUsage;
    ncclConfig_t config;
    if (c != nullptr) config = ToConfig(*c);
    ncclComm_t out = nullptr;
    ncclResult_t r = sym_.CommSplit(C(comm), color, key, &out, c != nullptr ? &config : nullptr);
    *newcomm = reinterpret_cast<NcclComm>(out);
    return R(r);
  }
  bool has_alltoall() const override { return sym_.AlltoAll != nullptr; }
  NcclResult AlltoAll(const void* send, void* recv, size_t count, NcclDataType dtype, NcclComm comm,
                      cuda::CudaStream stream) override {
    if (sym_.AlltoAll == nullptr) return NcclResult::kInvalidUsage;
    return R(sym_.AlltoAll(send, recv, count, D(dtype), C(comm), S(stream)));
  }
  bool has_comm_shrink() const override { return sym_.CommShrink != nullptr; }
  NcclResult CommShrink(NcclComm comm, const std::vector<int>& exclude_ranks, NcclComm* newcomm,
                        const NcclCommConfig* c, int shrink_flags) override {
    *newcomm = nullptr;
    if (sym_.CommShrink == nullptr) return NcclResult::kInvalidUsage;
    std::vector<int> exclude = exclude_ranks;  // ncclCommShrink takes a non-const list
    ncclConfig_t config;
    if (c != nullptr) config = ToConfig(*c);
    ncclComm_t out = nullptr;
    ncclResult_t r = sym_.CommShrink(C(comm), exclude.data(), static_cast<int>(exclude.size()),
                                     &out, c != nullptr ? &config : nullptr, shrink_flags);
    *newcomm = reinterpret_cast<NcclComm>(out);
    return R(r);
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
  std::string optional_missing;  // optional symbols: a null slot is what has_comm_shrink() reads
  Resolve(handle, "ncclCommSplit", &s.CommSplit, &optional_missing);
  Resolve(handle, "ncclCommShrink", &s.CommShrink, &optional_missing);
  Resolve(handle, "ncclAlltoAll", &s.AlltoAll, &optional_missing);
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

// The seam between adaptcomm and NCCL: just the calls the NCCL backend makes, in our own types, so
// that tests (and a build without CUDA) compile without any CUDA or NCCL header. The real
// implementation (nccl_api_dlopen.cc) dlopen()s libnccl.so.2; tests/fake_nccl_api.h injects
// faults. The CUDA runtime is a seam of its own (lib/cuda/cuda_api.h), one layer below.
//
// Values of the enums mirror ncclResult_t, ncclDataType_t and ncclRedOp_t, so the real
// implementation converts with a cast (static_asserts there keep that true).
#ifndef ADAPTCOMM_LIB_NCCL_NCCL_API_H_
#define ADAPTCOMM_LIB_NCCL_NCCL_API_H_

#include <climits>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lib/cuda/cuda_api.h"

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

// An opaque ncclComm_t. Streams are the CUDA seam's cudaStream_t (cuda::CudaStream).
struct NcclCommOpaque;
using NcclComm = NcclCommOpaque*;

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

// ncclCommShrink's shrinkFlags (NCCL 2.27+): NCCL_SHRINK_DEFAULT shrinks a healthy communicator;
// NCCL_SHRINK_ABORT first terminates the parent's ongoing operations (a parent in error, or one
// with a collective stuck on an excluded rank), then shrinks.
inline constexpr int kShrinkDefault = 0;
inline constexpr int kShrinkAbort = 1;
// ncclCommSplit's color for a rank that takes part in the split and joins no child
// (NCCL_SPLIT_NOCOLOR).
inline constexpr int kSplitNoColor = -1;

// NCCL's calls. Methods mirror nccl.h one to one; the CUDA runtime NCCL runs on is a separate seam
// (lib/cuda/cuda_api.h) that callers receive alongside.
class NcclApi {
 public:
  virtual ~NcclApi() = default;
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
                               NcclRedOp op, NcclComm comm, cuda::CudaStream stream) = 0;
  virtual NcclResult Broadcast(const void* send, void* recv, size_t count, NcclDataType dtype,
                               int root, NcclComm comm, cuda::CudaStream stream) = 0;
  virtual NcclResult Reduce(const void* send, void* recv, size_t count, NcclDataType dtype,
                            NcclRedOp op, int root, NcclComm comm, cuda::CudaStream stream) = 0;
  virtual NcclResult AllGather(const void* send, void* recv, size_t send_count, NcclDataType dtype,
                               NcclComm comm, cuda::CudaStream stream) = 0;
  virtual NcclResult ReduceScatter(const void* send, void* recv, size_t recv_count,
                                   NcclDataType dtype, NcclRedOp op, NcclComm comm,
                                   cuda::CudaStream stream) = 0;
  virtual NcclResult Send(const void* send, size_t count, NcclDataType dtype, int peer,
                          NcclComm comm, cuda::CudaStream stream) = 0;
  virtual NcclResult Recv(void* recv, size_t count, NcclDataType dtype, int peer, NcclComm comm,
                          cuda::CudaStream stream) = 0;

  // Optional entry points: a loaded NCCL may lack them (the loader does not fail for them).
  // ncclCommShrink (NCCL 2.27+): the survivors of `comm` (every rank but `exclude_ranks`, in its
  // numbering) build `*newcomm`, renumbered densely; `config` null: the parent's. Nonblocking:
  // poll CommGetAsyncError(*newcomm). Without the symbol: ncclInvalidUsage.
  // ncclAlltoAll (NCCL 2.28+): `count` elements to and from every rank. Without the symbol:
  // ncclInvalidUsage.
  virtual bool has_alltoall() const { return false; }
  virtual NcclResult AlltoAll(const void* send, void* recv, size_t count, NcclDataType dtype,
                              NcclComm comm, cuda::CudaStream stream) {
    (void)send;
    (void)recv;
    (void)count;
    (void)dtype;
    (void)comm;
    (void)stream;
    return NcclResult::kInvalidUsage;
  }
  // ncclCommSplit (NCCL 2.18+): a collective over every rank of `comm`; the ranks passing the same
  // `color` build `*newcomm`, ranked by `key`, then by their rank in `comm`; kSplitNoColor gives
  // a null `*newcomm`. `config` null: the parent's. Nonblocking: poll CommGetAsyncError(*newcomm).
  // Without the symbol: ncclInvalidUsage.
  virtual bool has_comm_split() const { return false; }
  virtual NcclResult CommSplit(NcclComm comm, int color, int key, NcclComm* newcomm,
                               const NcclCommConfig* config) {
    (void)comm;
    (void)color;
    (void)key;
    (void)config;
    *newcomm = nullptr;
    return NcclResult::kInvalidUsage;
  }
  virtual bool has_comm_shrink() const { return false; }
  virtual NcclResult CommShrink(NcclComm comm, const std::vector<int>& exclude_ranks,
                                NcclComm* newcomm, const NcclCommConfig* config, int shrink_flags) {
    (void)comm;
    (void)exclude_ranks;
    (void)config;
    (void)shrink_flags;
    *newcomm = nullptr;
    return NcclResult::kInvalidUsage;
  }
};

// The oldest NCCL with everything the backend calls: ncclCommInitRankConfig, nonblocking
// communicators, ncclCommFinalize (2.14); ncclAvg and bf16 (2.10); ncclGetLastError (2.13).
inline constexpr int kMinNcclVersion = 21400;

// "2.28.9" from a version code: X*10000+Y*100+Z from 2.9 on, X*1000+Y*100+Z before.
std::string NcclVersionString(int code);
// The code normalised to the 2.9+ scheme (2.8.4 = 2804 -> 20804), so codes compare.
int NormalizeNcclVersion(int code);

// api->CommAbort(comm) on a thread of its own, waited for at most `bound`: ncclCommAbort itself
// can hang (a peer stuck in a kernel). DeadlineExceeded past the bound (the call is abandoned and
// its resources leak until the process exits), Unavailable naming NCCL's error.
[[nodiscard]] absl::Status CommAbortBounded(const std::shared_ptr<NcclApi>& api, NcclComm comm,
                                            absl::Duration bound);

// dlopen()s NCCL once per process: `path` if given, else $ADAPTCOMM_NCCL_LIBRARY, else
// "libnccl.so.2". Every required symbol is checked (optional ones, ncclCommSplit, ncclCommShrink
// and ncclAlltoAll, are resolved when present: has_comm_split(), has_comm_shrink(),
// has_alltoall()); errors:
// FailedPrecondition "NCCL backend not built: ..." (no CUDA at build time), Unavailable with
// dlerror()'s text ("libnccl.so.2: cannot open shared object file: ..."), or Unavailable naming the
// first missing symbol. A successful load is cached per path; a failed one is retried on the next
// call.
absl::StatusOr<std::shared_ptr<NcclApi>> LoadNcclApi(const std::string& path = "");

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_NCCL_API_H_

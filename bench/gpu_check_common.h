// What bench/gpu_check's checks share: the failure count and CHECK_OK, the process's CUDA runtime,
// device buffers, and the communicator options every check uses. One GPU check program; its
// checks are split by concern across bench/gpu_check*.cc.
#ifndef ADAPTCOMM_BENCH_GPU_CHECK_COMMON_H_
#define ADAPTCOMM_BENCH_GPU_CHECK_COMMON_H_

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "adaptcomm/communicator.h"
#include "lib/cuda/cuda_api.h"

namespace adaptcomm::gpu_check {

// Checks that failed so far (the program's exit code says whether any did).
extern int failures;
#define CHECK_OK(expr, what)                                                            \
  do {                                                                                  \
    absl::Status _s = (expr);                                                           \
    if (!_s.ok()) {                                                                     \
      ++failures;                                                                       \
      std::printf("  FAIL %s: %s\n", std::string(what).c_str(), _s.ToString().c_str()); \
    }                                                                                   \
  } while (0)

// The process's CUDA runtime (set by main).
extern std::shared_ptr<cuda::CudaApi> g_cuda;

// Blocks until `stream` has run what was queued on it (bounded: 60 s).
void Sync(void* stream);

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf(size_t n) : bytes(n) {
    if (g_cuda->Malloc(&p, n == 0 ? 1 : n) != cuda::kCudaSuccess) p = nullptr;
  }
  ~DevBuf() {
    if (p) g_cuda->Free(p);
  }
  TensorView View(DType t, int device, void* stream) const {
    return TensorView{p, bytes / DTypeSize(t), t, Device::Cuda(device), stream};
  }
  void Put(const std::vector<char>& h, void* stream) {
    g_cuda->MemcpyAsync(p, h.data(), h.size(), cuda::MemcpyKind::kHostToDevice, stream);
    Sync(stream);
  }
  std::vector<char> Get(void* stream) const {
    std::vector<char> h(bytes);
    g_cuda->MemcpyAsync(h.data(), p, bytes, cuda::MemcpyKind::kDeviceToHost, stream);
    Sync(stream);
    return h;
  }
};

// The options of every communicator the checks create (fallback denied, 120 s bounds);
// retry_attempts unset: the profile's.
CommunicatorOptions Options(const std::string& name, BackendChoice b, int rank, int world, int port,
                            std::shared_ptr<Store> store, std::optional<int> retry_attempts);

// [6] Host overhead against ncclAllReduce itself (bench/gpu_check_overhead.cc). `comm` has
// coordinated retry on, `lean` off.
void OverheadCheck(Communicator& comm, Communicator& lean, Store& store, int device, void* stream);
// Where an 8-byte op's host time goes, per CUDA/NCCL call and thread.
void BreakdownCheck(int rank, int world, int port, const std::shared_ptr<Store>& store, int device,
                    void* stream);

}  // namespace adaptcomm::gpu_check

#endif  // ADAPTCOMM_BENCH_GPU_CHECK_COMMON_H_

// Timing decorators of the CUDA and NCCL seams, for bench/gpu_check's breakdown of a
// stream-ordered op's host cost on a real GPU: every call is counted and timed, split between the
// thread that made the SeamTimes (the trainer's, which issues and waits) and every other thread
// (the library's: watchdog, executor). Each call adds two clock reads (~50 ns) to what it times.
#ifndef ADAPTCOMM_BENCH_TIMED_SEAMS_H_
#define ADAPTCOMM_BENCH_TIMED_SEAMS_H_

#include <time.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lib/cuda/cuda_api.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::bench {

#define ADAPTCOMM_SEAM_CALLS(X)                                                                   \
  X(GetDeviceCount)                                                                               \
  X(SetDevice)                                                                                    \
  X(DriverVersion) X(RuntimeVersion) X(PointerGetAttributes) X(StreamCreateNonBlocking)           \
      X(StreamDestroy) X(EventCreateDisableTiming) X(EventRecord) X(EventQuery) X(EventDestroy)   \
          X(MemcpyAsync) X(Malloc) X(Free) X(HostAlloc) X(FreeHost) X(LaunchHostFunc)             \
              X(ErrorString) X(GetDevice) X(StreamWaitEvent) X(StreamSynchronize)                 \
                  X(StreamGetDevice) X(MemsetAsync) X(LaunchCast) X(ncclGetVersion)               \
                      X(ncclGetUniqueId) X(ncclCommInitRankConfig) X(ncclCommGetAsyncError)       \
                          X(ncclCommFinalize) X(ncclCommDestroy) X(ncclCommAbort)                 \
                              X(ncclGetErrorString) X(ncclGetLastError) X(ncclGroupStart)         \
                                  X(ncclGroupEnd) X(ncclAllReduce) X(ncclBroadcast) X(ncclReduce) \
                                      X(ncclAllGather) X(ncclReduceScatter) X(ncclSend)           \
                                          X(ncclRecv) X(ncclCommShrink)

enum class SeamCall : int {
#define ADAPTCOMM_SEAM_ENUM(name) k##name,
  ADAPTCOMM_SEAM_CALLS(ADAPTCOMM_SEAM_ENUM)
#undef ADAPTCOMM_SEAM_ENUM
      kCount
};

class SeamTimes {
 public:
  SeamTimes() : owner_(std::this_thread::get_id()) {}

  void Add(SeamCall call, int64_t ns) {
    Slot& s = slots_[static_cast<size_t>(call)];
    const int who = std::this_thread::get_id() == owner_ ? 0 : 1;
    s.calls[who].fetch_add(1, std::memory_order_relaxed);
    s.ns[who].fetch_add(ns, std::memory_order_relaxed);
  }
  void Reset() {
    for (Slot& s : slots_) {
      for (int who = 0; who < 2; ++who) s.calls[who] = 0, s.ns[who] = 0;
    }
  }
  // Microseconds per op that the caller's thread spent in the seams.
  double CallerMicrosPerOp(int ops) const {
    int64_t ns = 0;
    for (const Slot& s : slots_) ns += s.ns[0].load();
    return static_cast<double>(ns) / 1e3 / ops;
  }
  // One line per call made, per op: "name: N calls X us on the caller's thread, M calls Y us on
  // others"; then the caller thread's total in the seams.
  void Print(int ops) const {
    static constexpr const char* kNames[] = {
#define ADAPTCOMM_SEAM_NAME(name) #name,
        ADAPTCOMM_SEAM_CALLS(ADAPTCOMM_SEAM_NAME)
#undef ADAPTCOMM_SEAM_NAME
    };
    double caller_us = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.calls[0] == 0 && s.calls[1] == 0) continue;
      const double us0 = static_cast<double>(s.ns[0].load()) / 1e3 / ops;
      const double us1 = static_cast<double>(s.ns[1].load()) / 1e3 / ops;
      caller_us += us0;
      std::printf(
          "      %-26s caller %5.2f calls %6.2f us | library threads %6.2f calls %6.2f us\n",
          kNames[i], static_cast<double>(s.calls[0].load()) / ops, us0,
          static_cast<double>(s.calls[1].load()) / ops, us1);
    }
    std::printf("      in the seams on the caller's thread: %.2f us per op\n", caller_us);
  }

 private:
  struct Slot {
    std::atomic<int64_t> calls[2] = {0, 0};
    std::atomic<int64_t> ns[2] = {0, 0};
  };
  const std::thread::id owner_;
  std::array<Slot, static_cast<size_t>(SeamCall::kCount)> slots_;
};

// Times one call from construction to destruction.
class SeamTimer {
 public:
  SeamTimer(SeamTimes& times, SeamCall call) : times_(times), call_(call), start_(Now()) {}
  ~SeamTimer() { times_.Add(call_, Now() - start_); }

 private:
  static int64_t Now() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }
  SeamTimes& times_;
  SeamCall call_;
  int64_t start_;
};

#define ADAPTCOMM_TIMED(name, ...)               \
  {                                              \
    SeamTimer timer(*times_, SeamCall::k##name); \
    return __VA_ARGS__;                          \
  }

class TimedCudaApi final : public cuda::CudaApi {
 public:
  TimedCudaApi(std::shared_ptr<cuda::CudaApi> inner, std::shared_ptr<SeamTimes> times)
      : inner_(std::move(inner)), times_(std::move(times)) {}
  int GetDeviceCount(int* c) override
      ADAPTCOMM_TIMED(GetDeviceCount, inner_->GetDeviceCount(c)) int SetDevice(int d) override
      ADAPTCOMM_TIMED(SetDevice, inner_->SetDevice(d)) int DriverVersion(int* v) override
      ADAPTCOMM_TIMED(DriverVersion, inner_->DriverVersion(v)) int RuntimeVersion(int* v) override
      ADAPTCOMM_TIMED(RuntimeVersion, inner_->RuntimeVersion(v)) int PointerGetAttributes(
          const void* p, cuda::PointerInfo* i) override
      ADAPTCOMM_TIMED(PointerGetAttributes,
                      inner_->PointerGetAttributes(
                          p, i)) int StreamCreateNonBlocking(cuda::CudaStream* s) override
      ADAPTCOMM_TIMED(
          StreamCreateNonBlocking,
          inner_->StreamCreateNonBlocking(s)) int StreamDestroy(cuda::CudaStream s) override
      ADAPTCOMM_TIMED(StreamDestroy, inner_->StreamDestroy(s)) int EventCreateDisableTiming(
          cuda::CudaEvent* e) override
      ADAPTCOMM_TIMED(EventCreateDisableTiming, inner_->EventCreateDisableTiming(
                                                    e)) int EventRecord(cuda::CudaEvent e,
                                                                        cuda::CudaStream s) override
      ADAPTCOMM_TIMED(EventRecord,
                      inner_->EventRecord(e, s)) int EventQuery(cuda::CudaEvent e) override
      ADAPTCOMM_TIMED(EventQuery,
                      inner_->EventQuery(e)) int EventDestroy(cuda::CudaEvent e) override
      ADAPTCOMM_TIMED(EventDestroy,
                      inner_->EventDestroy(e)) int MemcpyAsync(void* d, const void* s, size_t n,
                                                               cuda::MemcpyKind k,
                                                               cuda::CudaStream st) override
      ADAPTCOMM_TIMED(MemcpyAsync,
                      inner_->MemcpyAsync(d, s, n, k, st)) int Malloc(void** p, size_t n) override
      ADAPTCOMM_TIMED(Malloc, inner_->Malloc(p, n)) int Free(void* p) override
      ADAPTCOMM_TIMED(Free, inner_->Free(p)) int HostAlloc(void** p, size_t n) override
      ADAPTCOMM_TIMED(HostAlloc, inner_->HostAlloc(p, n)) int FreeHost(void* p) override
      ADAPTCOMM_TIMED(FreeHost, inner_->FreeHost(p)) int LaunchHostFunc(cuda::CudaStream s,
                                                                        void (*fn)(void*),
                                                                        void* a) override
      ADAPTCOMM_TIMED(LaunchHostFunc, inner_->LaunchHostFunc(s, fn, a)) std::string
      ErrorString(int e) override
      ADAPTCOMM_TIMED(ErrorString, inner_->ErrorString(e)) int GetDevice(int* d) override
      ADAPTCOMM_TIMED(GetDevice,
                      inner_->GetDevice(d)) int StreamWaitEvent(cuda::CudaStream s,
                                                                cuda::CudaEvent e) override
      ADAPTCOMM_TIMED(StreamWaitEvent,
                      inner_->StreamWaitEvent(s,
                                              e)) int StreamSynchronize(cuda::CudaStream s) override
      ADAPTCOMM_TIMED(StreamSynchronize,
                      inner_->StreamSynchronize(s)) int StreamGetDevice(cuda::CudaStream s,
                                                                        int* d) override
      ADAPTCOMM_TIMED(StreamGetDevice,
                      inner_->StreamGetDevice(s, d)) int MemsetAsync(void* p, int v, size_t n,
                                                                     cuda::CudaStream s) override
      ADAPTCOMM_TIMED(MemsetAsync, inner_->MemsetAsync(p, v, n, s)) int LaunchCast(
          cuda::CastDirection d, const void* s, void* t, size_t n, float k, cuda::CudaStream st,
          cuda::DeviceCastCounters* c) override
      ADAPTCOMM_TIMED(LaunchCast, inner_->LaunchCast(d, s, t, n, k, st, c))

          private : std::shared_ptr<cuda::CudaApi> inner_;
  std::shared_ptr<SeamTimes> times_;
};

class TimedNcclApi final : public nccl::NcclApi {
 public:
  using R = nccl::NcclResult;
  using T = nccl::NcclDataType;
  using S = cuda::CudaStream;
  TimedNcclApi(std::shared_ptr<nccl::NcclApi> inner, std::shared_ptr<SeamTimes> times)
      : inner_(std::move(inner)), times_(std::move(times)) {}
  std::string library_path() const override { return inner_->library_path(); }
  R GetVersion(int* v) override ADAPTCOMM_TIMED(ncclGetVersion, inner_->GetVersion(v)) R
      GetUniqueId(nccl::NcclUniqueId* id) override
      ADAPTCOMM_TIMED(ncclGetUniqueId, inner_->GetUniqueId(id)) R
      CommInitRankConfig(nccl::NcclComm* c, int n, const nccl::NcclUniqueId& id, int r,
                         const nccl::NcclCommConfig& cfg) override
      ADAPTCOMM_TIMED(ncclCommInitRankConfig, inner_->CommInitRankConfig(c, n, id, r, cfg)) R
      CommGetAsyncError(nccl::NcclComm c, R* e) override
      ADAPTCOMM_TIMED(ncclCommGetAsyncError, inner_->CommGetAsyncError(c, e)) R
      CommFinalize(nccl::NcclComm c) override
      ADAPTCOMM_TIMED(ncclCommFinalize, inner_->CommFinalize(c)) R
      CommDestroy(nccl::NcclComm c) override
      ADAPTCOMM_TIMED(ncclCommDestroy, inner_->CommDestroy(c)) R
      CommAbort(nccl::NcclComm c) override
      ADAPTCOMM_TIMED(ncclCommAbort, inner_->CommAbort(c)) std::string GetErrorString(R r) override
      ADAPTCOMM_TIMED(ncclGetErrorString, inner_->GetErrorString(r)) std::string
      GetLastError(nccl::NcclComm c) override
      ADAPTCOMM_TIMED(ncclGetLastError, inner_->GetLastError(c)) R GroupStart() override
      ADAPTCOMM_TIMED(ncclGroupStart, inner_->GroupStart()) R GroupEnd() override
      ADAPTCOMM_TIMED(ncclGroupEnd, inner_->GroupEnd()) R
      AllReduce(const void* s, void* r, size_t n, T t, nccl::NcclRedOp o, nccl::NcclComm c,
                S st) override
      ADAPTCOMM_TIMED(ncclAllReduce, inner_->AllReduce(s, r, n, t, o, c, st)) R
      Broadcast(const void* s, void* r, size_t n, T t, int root, nccl::NcclComm c, S st) override
      ADAPTCOMM_TIMED(ncclBroadcast, inner_->Broadcast(s, r, n, t, root, c, st)) R
      Reduce(const void* s, void* r, size_t n, T t, nccl::NcclRedOp o, int root, nccl::NcclComm c,
             S st) override
      ADAPTCOMM_TIMED(ncclReduce, inner_->Reduce(s, r, n, t, o, root, c, st)) R
      AllGather(const void* s, void* r, size_t n, T t, nccl::NcclComm c, S st) override
      ADAPTCOMM_TIMED(ncclAllGather, inner_->AllGather(s, r, n, t, c, st)) R
      ReduceScatter(const void* s, void* r, size_t n, T t, nccl::NcclRedOp o, nccl::NcclComm c,
                    S st) override
      ADAPTCOMM_TIMED(ncclReduceScatter, inner_->ReduceScatter(s, r, n, t, o, c, st)) R
      Send(const void* s, size_t n, T t, int peer, nccl::NcclComm c, S st) override
      ADAPTCOMM_TIMED(ncclSend, inner_->Send(s, n, t, peer, c, st)) R
      Recv(void* r, size_t n, T t, int peer, nccl::NcclComm c, S st) override
      ADAPTCOMM_TIMED(ncclRecv,
                      inner_->Recv(r, n, t, peer, c, st)) bool has_comm_shrink() const override {
    return inner_->has_comm_shrink();
  }
  R CommShrink(nccl::NcclComm c, const std::vector<int>& ex, nccl::NcclComm* n,
               const nccl::NcclCommConfig* cfg, int flags) override
      ADAPTCOMM_TIMED(ncclCommShrink, inner_->CommShrink(c, ex, n, cfg, flags))

          private : std::shared_ptr<nccl::NcclApi> inner_;
  std::shared_ptr<SeamTimes> times_;
};

#undef ADAPTCOMM_TIMED

}  // namespace adaptcomm::bench

#endif  // ADAPTCOMM_BENCH_TIMED_SEAMS_H_

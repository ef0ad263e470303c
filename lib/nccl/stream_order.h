// The parts of the NCCL backend's stream-ordered path (adaptcomm/ext/backend.h, StreamOrdered) that
// outlive the backend that made them: CUDA events recycled through a pool, the point of the
// caller's stream an op was issued at, and the completion a Work polls, possibly after a retry
// replaced the backend that launched it.
//
// Per op: an event recorded on the caller's stream at issue (MarkIssue), the communicator's
// stream waiting for it, the NCCL call on that stream, and an event recorded after it (Launch);
// Work::Wait makes the caller's stream wait for that last event. Four CUDA/NCCL calls, none of
// which waits for the device. A sampled op also records two timing events around its NCCL call on
// the communicator's stream, which nothing waits for (lib/nccl/device_timing.h).
#ifndef ADAPTCOMM_LIB_NCCL_STREAM_ORDER_H_
#define ADAPTCOMM_LIB_NCCL_STREAM_ORDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/ext/backend.h"
#include "lib/base/spin_lock.h"
#include "lib/cuda/cuda_api.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl {

// CUDA events of one device, created on demand and reused (creating one per op would cost more
// than the op's launch). Thread-safe (a SpinLock: every op takes two and gives them back);
// shared by a backend and everything it handed out.
class EventPool {
 public:
  // `timing`: events created with timing enabled (device timing), else with cudaEventDisableTiming.
  EventPool(std::shared_ptr<cuda::CudaApi> api, int device, bool timing = false)
      : api_(std::move(api)), device_(device), timing_(timing) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A free event, else a new one (created on the pool's device; the calling thread's current
  // device is restored). Unavailable naming the CUDA error.
  absl::StatusOr<cuda::CudaEvent> Take();
  // Two events under one hold of the pool's lock (an op's issue and end events).
  absl::Status TakeTwo(cuda::CudaEvent* first, cuda::CudaEvent* second);
  // REQUIRES: each non-null event came from Take or TakeTwo and no one will record or wait on it
  // through its holder.
  void Give(cuda::CudaEvent event, cuda::CudaEvent other = nullptr);
  cuda::CudaApi& api() const { return *api_; }

 private:
  const std::shared_ptr<cuda::CudaApi> api_;
  const int device_;
  const bool timing_;
  SpinLock mu_;
  std::vector<cuda::CudaEvent> free_ ABSL_GUARDED_BY(mu_);
};

// Which op a completion belongs to, for its error messages: a plain value, so that a launch costs
// neither a string nor a heap-allocated callable; Name() builds the text only when one is reported.
struct LaunchedOp {
  OpKind kind = OpKind::kAllreduce;
  uint64_t seq = 0;
  int rank = 0;
  int device = 0;
  // "nccl allreduce seq 12 (rank 1, cuda:1)"
  std::string Name() const;
};

// CUDA graphs: adaptcomm's device ops cannot be captured (docs/gpu.md, "CUDA graphs"). OK when
// `stream` is not capturing, else FailedPrecondition: "<what()> refused: the <which> view's stream
// 0x.. is capturing a CUDA graph ...", saying to issue the op outside the capture. One
// cudaStreamIsCapturing (a host-side query); what() is called only for a refusal. A CudaApi that
// cannot tell (kCudaErrorNotSupported) or another error of the query passes: the op's first real
// call on the stream reports a bad stream as it always did.
absl::Status RefuseIfCapturing(cuda::CudaApi& api, cuda::CudaStream stream, const char* which,
                               absl::FunctionRef<std::string()> what);

// Whether a communicator may still be asked about its asynchronous errors: a completion must not
// touch it once ncclCommAbort or ncclCommDestroy may run. Shared by the backend and its
// completions.
class CommHealth {
 public:
  CommHealth(std::shared_ptr<NcclApi> api, NcclComm comm) : api_(std::move(api)), comm_(comm) {}
  // OK while the communicator is live and NCCL reports no asynchronous error (ncclInProgress is
  // no error); else the mapped NCCL error naming `op`, or why the communicator was retired.
  absl::Status Check(const LaunchedOp& op);
  // After this returns no Check() touches the communicator; later ones return `why`. The first
  // reason wins.
  void Retire(absl::Status why);

 private:
  const std::shared_ptr<NcclApi> api_;
  const NcclComm comm_;
  absl::Mutex mu_;
  bool live_ ABSL_GUARDED_BY(mu_) = true;
  absl::Status retired_ ABSL_GUARDED_BY(mu_);
};

// What a backend shares with the events objects of its ops (NcclOpEvents), in one allocation: an
// op's object holds both parts through one reference (an atomic operation when it is made and one
// when it goes, where a reference to each part cost two).
struct OpEventsShared {
  OpEventsShared(std::shared_ptr<cuda::CudaApi> cuda, int device, std::shared_ptr<NcclApi> nccl,
                 NcclComm comm)
      : pool(cuda, device),
        timing(std::move(cuda), device, /*timing=*/true),
        health(std::move(nccl), comm) {}
  EventPool pool;
  EventPool timing;  // the sampled ops' timing events (lib/nccl/device_timing.h)
  CommHealth health;
};

// One stream-ordered op's two events: the point of its caller's stream it was issued at (the
// StreamPosition, recorded by MarkIssue) and its end on the communicator's stream (the
// DeviceCompletion, recorded by Launch). One allocation and one pool hold for both, which a
// separate position and completion per op would each cost twice. Both events go back to the pool
// when the last holder of either role lets go (the Work's OpDesc holds the position).
class NcclOpEvents final : public StreamPosition, public DeviceCompletion {
 public:
  // `issued` is null for a completion launched from a position it could not claim (ClaimLaunch);
  // `op` names the op in errors (LaunchedOp::Name, only when one is reported).
  NcclOpEvents(std::shared_ptr<OpEventsShared> shared, cuda::CudaEvent issued, cuda::CudaEvent done,
               const LaunchedOp& op)
      : shared_(std::move(shared)), issued_(issued), done_(done), op_(op) {}
  ~NcclOpEvents() override;
  cuda::CudaEvent issued() const { return issued_; }
  cuda::CudaEvent done() const { return done_; }
  // Whether `op` may record its end on this object's done event: it is the op this position was
  // made for (a renumbered op names another seq) and the first launch from it (a relaunch takes
  // a fresh completion, since a Work may still poll the first).
  // REQUIRES: called by the thread that launches (one at a time, StreamOrdered::Launch), so that a
  // load and a store claim it without an atomic exchange.
  bool ClaimLaunch(const LaunchedOp& op) const {
    if (op.kind != op_.kind || op.seq != op_.seq || launched_.load(std::memory_order_acquire)) {
      return false;
    }
    launched_.store(true, std::memory_order_release);
    return true;
  }
  // Whether an op was launched from this position with its end on done().
  bool WasLaunched() const { return launched_.load(std::memory_order_acquire); }
  // The communicator stream (an id unique in the process) that already waits for issued(): the
  // retry record's copy made it wait, so the launch right after need not queue the wait again.
  void MarkAwaitedOn(uint64_t stream_id) const { awaited_on_.store(stream_id); }
  bool AwaitedOn(uint64_t stream_id) const { return awaited_on_.load() == stream_id; }
  // A sampled op's two timing events around its NCCL call (from shared->timing), given back with
  // the others. REQUIRES: called by the launching thread before the completion is handed out.
  void SetTiming(cuda::CudaEvent start, cuda::CudaEvent end) {
    timing_start_ = start;
    timing_end_ = end;
  }
  bool timed() const { return timing_start_ != nullptr; }
  absl::StatusOr<bool> Poll() override;
  absl::Status MakeStreamWait(void* stream) override;
  // ReadDeviceTime of the timing events; nullopt for an op not sampled.
  std::optional<absl::Duration> DeviceTime() override;

 private:
  const std::shared_ptr<OpEventsShared> shared_;  // its pool and its communicator's health
  const cuda::CudaEvent issued_;
  const cuda::CudaEvent done_;
  cuda::CudaEvent timing_start_ = nullptr;
  cuda::CudaEvent timing_end_ = nullptr;
  const LaunchedOp op_;
  mutable std::atomic<bool> launched_{false};
  mutable std::atomic<uint64_t> awaited_on_{0};
};

// The events behind a position MarkIssue made (null for another kind of position). NcclOpEvents is
// final: a typeid check is a pointer compare where a dynamic_cast through its two bases walks the
// class hierarchy on every op.
inline const NcclOpEvents* EventsOf(const StreamPosition* position) {
  return position != nullptr && typeid(*position) == typeid(NcclOpEvents)
             ? static_cast<const NcclOpEvents*>(position)
             : nullptr;
}

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_STREAM_ORDER_H_

// The parts of the NCCL backend's stream-ordered path (adaptcomm/backend.h, StreamOrdered) that
// outlive the backend that made them: CUDA events recycled through a pool, the point of the
// caller's stream an op was issued at, and the completion a Work polls, possibly after a retry
// replaced the backend that launched it.
//
// Per op: an event recorded on the caller's stream at issue (MarkIssue), the communicator's
// stream waiting for it, the NCCL call on that stream, and an event recorded after it (Launch);
// Work::Wait makes the caller's stream wait for that last event. Four CUDA/NCCL calls, none of
// which waits for the device.
#ifndef ADAPTCOMM_LIB_NCCL_STREAM_ORDER_H_
#define ADAPTCOMM_LIB_NCCL_STREAM_ORDER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/backend.h"
#include "lib/cuda/cuda_api.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl {

// CUDA events of one device, created on demand and reused (creating one per op would cost more
// than the op's launch). Thread-safe; shared by a backend and everything it handed out.
class EventPool {
 public:
  EventPool(std::shared_ptr<cuda::CudaApi> api, int device)
      : api_(std::move(api)), device_(device) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A free event, else a new one (created on the pool's device; the calling thread's current
  // device is restored). Unavailable naming the CUDA error.
  absl::StatusOr<cuda::CudaEvent> Take();
  // REQUIRES: `event` came from Take() and no one will record or wait on it through its holder.
  void Give(cuda::CudaEvent event);
  cuda::CudaApi& api() const { return *api_; }

 private:
  const std::shared_ptr<cuda::CudaApi> api_;
  const int device_;
  absl::Mutex mu_;
  std::vector<cuda::CudaEvent> free_ ABSL_GUARDED_BY(mu_);
};

// Whether a communicator may still be asked about its asynchronous errors: a completion must not
// touch it once ncclCommAbort or ncclCommDestroy may run. Shared by the backend and its
// completions.
class CommHealth {
 public:
  CommHealth(std::shared_ptr<NcclApi> api, NcclComm comm) : api_(std::move(api)), comm_(comm) {}
  // OK while the communicator is live and NCCL reports no asynchronous error (ncclInProgress is
  // no error); else the mapped NCCL error naming `what`, or why the communicator was retired.
  absl::Status Check(const std::function<std::string()>& what);
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

// The point of a caller's stream an op was issued at: an event recorded there.
class NcclStreamPosition final : public StreamPosition {
 public:
  NcclStreamPosition(std::shared_ptr<EventPool> pool, cuda::CudaEvent event)
      : pool_(std::move(pool)), event_(event) {}
  ~NcclStreamPosition() override { pool_->Give(event_); }
  cuda::CudaEvent event() const { return event_; }

 private:
  const std::shared_ptr<EventPool> pool_;
  const cuda::CudaEvent event_;
};

// An op on the communicator's stream, done when the event recorded after it is.
class NcclCompletion final : public DeviceCompletion {
 public:
  // `what` names the op in errors ("nccl allreduce seq 12 (rank 1, cuda:1)"); built only when one
  // is reported, so that a launch costs no string.
  NcclCompletion(std::shared_ptr<EventPool> pool, std::shared_ptr<CommHealth> health,
                 cuda::CudaEvent done, std::function<std::string()> what)
      : pool_(std::move(pool)), health_(std::move(health)), done_(done), what_(std::move(what)) {}
  ~NcclCompletion() override { pool_->Give(done_); }
  absl::StatusOr<bool> Poll() override;
  absl::Status MakeStreamWait(void* stream) override;

 private:
  const std::shared_ptr<EventPool> pool_;
  const std::shared_ptr<CommHealth> health_;
  const cuda::CudaEvent done_;
  const std::function<std::string()> what_;
};

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_STREAM_ORDER_H_

// NcclBackend, the Backend over one NCCL communicator: its class, shared by the file that runs
// ops (nccl_backend.cc) and the one that creates, shrinks and releases it
// (nccl_backend_create.cc). Internal to lib/nccl.
#ifndef ADAPTCOMM_LIB_NCCL_NCCL_BACKEND_CLASS_H_
#define ADAPTCOMM_LIB_NCCL_NCCL_BACKEND_CLASS_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <typeinfo>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/backend/backend_base.h"
#include "lib/base/block_recycler.h"
#include "lib/base/log.h"
#include "lib/base/op_views.h"
#include "lib/cuda/device_memory.h"
#include "lib/nccl/alltoall_staging.h"
#include "lib/nccl/nccl_backend.h"
#include "lib/nccl/nccl_init.h"
#include "lib/nccl/nccl_translate.h"
#include "lib/nccl/stream_order.h"

namespace adaptcomm::nccl {

using cuda::CudaApi;
using cuda::CudaEvent;
using cuda::CudaStream;
using cuda::kCudaErrorNotReady;
using cuda::kCudaErrorNotSupported;
using cuda::kCudaSuccess;
using cuda::PointerInfo;
using cuda::ScopedCudaDevice;

inline bool InFlight(NcclResult r) {
  return r == NcclResult::kSuccess || r == NcclResult::kInProgress;
}

// Names a communicator stream for NcclOpEvents::AwaitedOn: unlike its handle, never reused by a
// later backend generation.
inline uint64_t NextStreamId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

// Its health, its refusal of ops once broken and its Abort() come from BackendBase; what is its own
// is the communicator's abort, which must not race with an NCCL call on it: a call in flight
// (BeginCall .. FinishCall) aborts the communicator itself after an Abort(), an idle backend in
// Interrupt().
class NcclBackend final : public BackendBase, public StreamOrdered, public GroupRunner {
 public:
  NcclBackend(std::shared_ptr<NcclApi> api, std::shared_ptr<CudaApi> cuda,
              const NcclBackendOptions& options, NcclComm comm, int device_count, CudaEvent event,
              CudaStream stream, void* scratch)
      : BackendBase(BackendIdentity{.name = "nccl",
                                    .rank = options.rank,
                                    .size = options.size,
                                    .capabilities = NcclCapabilities()}),
        api_(std::move(api)),
        cuda_(std::move(cuda)),
        options_(options),
        comm_(comm),
        device_count_(device_count),
        event_(event),
        stream_(stream),
        scratch_(scratch),
        device_memory_(cuda::MakeCudaDeviceMemory(cuda_)),
        staging_(cuda_, options_.device),
        op_events_(std::make_shared<OpEventsShared>(cuda_, options_.device, api_, comm_)) {}
  ~NcclBackend() override;

  static Capabilities NcclCapabilities() {
    Capabilities c;
    c.host_memory = false;
    c.device_memory = true;
    c.native_bf16 = true;
    c.native_avg = true;
    c.send_recv = true;
    c.abortable = true;
    c.stream_ordered = true;
    return c;
  }
  absl::Status Supports(const OpDesc& op) const override;
  absl::Status Run(const OpDesc& op) override;
  std::shared_ptr<DeviceMemory> device_memory() const override { return device_memory_; }
  StreamOrdered* stream_ordered() override { return this; }
  GroupRunner* groups() override { return this; }
  // The group's ops in one ncclGroupStart/ncclGroupEnd on the communicator's stream, behind the
  // work queued on each op's stream when it runs; returns once the device finished them. For a
  // group whose ops have no stream positions (nccl_group.cc).
  absl::Status RunGroup(const std::vector<OpDesc>& ops) override;
  absl::StatusOr<std::shared_ptr<const StreamPosition>> MarkIssue(const OpDesc& op) override;
  absl::StatusOr<std::shared_ptr<DeviceCompletion>> Launch(const OpDesc& op) override;
  // The group's ops in one ncclGroupStart/ncclGroupEnd on the communicator's stream, behind each
  // op's issue point; returns once queued (nccl_group.cc).
  absl::StatusOr<std::shared_ptr<DeviceCompletion>> LaunchGroup(
      const std::vector<OpDesc>& ops) override;
  absl::Status CopyAt(const StreamPosition& at, void* dst, const void* src, size_t bytes) override;

  // ShrinkNcclBackend / CanShrinkNccl / ReleaseNcclComm (nccl_backend.h).
  absl::Status CanShrink() const;
  absl::StatusOr<std::unique_ptr<Backend>> Shrink(const std::vector<int>& exclude_ranks,
                                                  const NcclBackendOptions& options);
  void ReleaseComm() { AbortCommOnce(/*allow_park=*/false); }
  // SplitNcclComm / CanSplitNccl (nccl_backend.h; nccl_split.cc).
  absl::Status CanSplit() const;
  absl::StatusOr<std::shared_ptr<NcclSplitComm>> Split(int color, int key, absl::Duration bound);

 private:
  // BackendBase's: aborts the communicator unless a call is in flight (it does so in FinishCall).
  void Interrupt(const absl::Status& reason) override;
  // BackendBase's: the first failure that broke the backend aborts the communicator, so that the
  // peers waiting in the op fail too.
  void OnBroken(const absl::Status& failure) override;
  // Marks the op running (or refuses it on a broken backend); FinishCall undoes it, aborting the
  // communicator if an Abort() came meanwhile, and returns what the caller should see.
  absl::Status BeginCall(const OpDesc& op);
  // For a call on the communicator that is not an op (ncclCommShrink, ncclCommSplit): marks it
  // running, or refuses (FailedPrecondition naming `who`) while an op runs or once the communicator
  // was aborted. Returns whether the communicator is parked for a shrink.
  absl::StatusOr<bool> BeginCommCall(const std::string& who);
  absl::Status FinishCall(absl::Status result);
  absl::Status CheckView(const OpDesc& op, const TensorView& v, const char* which) const;
  // Queues `op` on `stream`; the raw NCCL result of the call (or of the group).
  NcclResult Enqueue(const OpDesc& op, CudaStream stream);
  // Enqueue's calls without a group of their own: for a caller that opened one.
  NcclResult EnqueueMember(const OpDesc& op, CudaStream stream);
  // For each op of `ops` that needs it (an in-place alltoall, NeedsAlltoallStaging), queues on
  // `stream` the copy of its input into the staging buffer and points its input there, so that the
  // NCCL call queued next on `stream` sends from the copy. The errors of AlltoallStaging::Reserve
  // (FailedPrecondition leaves the backend usable; the others break it), Unavailable for a failed
  // copy (broken).
  absl::Status StageOverlappingInputs(absl::Span<OpDesc> ops, CudaStream stream);
  // `op` itself, or for an in-place alltoall *staged: a copy of `op` whose input was staged on
  // `stream` (StageOverlappingInputs, whose errors it returns).
  absl::StatusOr<const OpDesc*> WithStagedInput(const OpDesc& op, CudaStream stream,
                                                OpDesc* staged);
  // Two timing events for a sampled op, or nulls (then the op runs untimed) when the runtime has
  // none; after the first failure it no longer asks.
  void TakeTimingEvents(CudaEvent* start, CudaEvent* end);
  // RunGroup's and LaunchGroup's part once the communicator's stream waits for the callers' work:
  // stages in-place alltoalls, then queues the collectives in issue order and the sends and
  // receives by tag in one ncclGroupStart/ncclGroupEnd. OK once queued (*queued: kSuccess or, on a
  // nonblocking communicator, kInProgress); a refusal as Launch's.
  absl::Status EnqueueGroup(const std::vector<OpDesc>& ops, NcclResult* queued);
  // The first op of `ops` (not empty) with the largest timeout of the group: the group's name and
  // bound; or the refusal (Supports) of its first op this backend cannot run.
  absl::StatusOr<OpDesc> GroupBound(const std::vector<OpDesc>& ops) const;
  // The first op of a group named with the group's extent, for messages.
  std::string WhatGroup(const std::vector<OpDesc>& ops) const;
  // The completion of `op` once launched: its position's done event when the position is its own
  // (MarkIssue's, not claimed by an earlier launch), else a fresh one. Errors break the backend.
  absl::StatusOr<std::shared_ptr<DeviceCompletion>> CompletionOf(const OpDesc& op);
  // After a launch that returned `r`: waits (bounded by op.timeout) until a nonblocking
  // communicator says the launch is done. Errors break the backend.
  absl::Status AwaitLaunchDone(NcclResult r, const OpDesc& op);
  // Waits for the event recorded on `stream` after `op`, polling async errors; the op's status.
  absl::Status WaitDone(const OpDesc& op, CudaStream stream, absl::Time deadline);
  // Aborts the communicator once; with keep_comm_for_shrink and `allow_park`, only parks it (the
  // ops end through health_, ncclCommAbort waits for a shrink or ReleaseComm).
  void AbortCommOnce(bool allow_park = true);
  LaunchedOp Launched(const OpDesc& op) const {
    return LaunchedOp{op.kind, op.seq, options_.rank, options_.device};
  }
  std::string What(const OpDesc& op) const { return Launched(op).Name(); }

  const std::shared_ptr<NcclApi> api_;
  const std::shared_ptr<CudaApi> cuda_;
  const NcclBackendOptions options_;
  const NcclComm comm_;
  const int device_count_;
  const CudaEvent event_;
  const CudaStream stream_;  // the communicator's stream: barriers and stream-ordered ops
  const uint64_t stream_id_ = NextStreamId();
  void* const scratch_;  // barrier's one-element device buffer
  const std::shared_ptr<DeviceMemory> device_memory_;
  AlltoallStaging staging_;  // used only by the thread running an op (BeginCall .. FinishCall)
  const std::shared_ptr<OpEventsShared> op_events_;  // the event pool and the comm's health
  EventPool& events_ = op_events_->pool;
  CommHealth& health_ = op_events_->health;

  std::atomic<bool> timing_unavailable_{false};           // TakeTimingEvents failed once
  std::atomic<CudaStream> last_checked_stream_{nullptr};  // on options_.device (MarkIssue)
  // Device pointers of options_.device that CheckView found valid, by PointerSlot.
  static constexpr size_t kCheckedPointers = 16;
  static size_t PointerSlot(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) >> 8) % kCheckedPointers;
  }
  mutable std::array<std::atomic<const void*>, kCheckedPointers> checked_pointers_{};
  // An op (or a shrink) is making NCCL calls on comm_: Abort() then leaves ncclCommAbort to it
  // (FinishCall). Set and cleared by the executing thread without mu_ (BeginCall, FinishCall: every
  // op); Abort() sets aborted() before Interrupt() reads running_, and a call sets running_ before
  // it reads aborted(), so that (both sequentially consistent) at least one of them sees the
  // other.
  std::atomic<bool> running_{false};
  // The communicator's state. BackendBase's lock may be taken under it (health()), never the
  // reverse: the base calls Interrupt() and OnBroken() without its lock.
  mutable absl::Mutex mu_;
  bool comm_aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool comm_parked_ ABSL_GUARDED_BY(mu_) = false;
};

// The backend around a ready communicator: its CUDA event, stream and barrier scratch.
absl::StatusOr<std::unique_ptr<Backend>> FinishNcclBackend(std::shared_ptr<NcclApi> api,
                                                           std::shared_ptr<cuda::CudaApi> cuda,
                                                           const NcclBackendOptions& o,
                                                           NcclComm comm, int device_count,
                                                           const std::string& who);

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_NCCL_BACKEND_CLASS_H_

#include "lib/nccl/nccl_backend.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <typeinfo>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/block_recycler.h"
#include "lib/base/log.h"
#include "lib/base/op_views.h"
#include "lib/cuda/device_memory.h"
#include "lib/nccl/nccl_init.h"
#include "lib/nccl/nccl_translate.h"
#include "lib/nccl/stream_order.h"

namespace adaptcomm::nccl {
namespace {

using cuda::CudaApi;
using cuda::CudaEvent;
using cuda::CudaStream;
using cuda::kCudaErrorNotReady;
using cuda::kCudaErrorNotSupported;
using cuda::kCudaSuccess;
using cuda::PointerInfo;
using cuda::ScopedCudaDevice;

bool InFlight(NcclResult r) { return r == NcclResult::kSuccess || r == NcclResult::kInProgress; }

// Names a communicator stream for NcclOpEvents::AwaitedOn: unlike its handle, never reused by a
// later backend generation.
uint64_t NextStreamId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

class NcclBackend final : public Backend, public StreamOrdered {
 public:
  NcclBackend(std::shared_ptr<NcclApi> api, std::shared_ptr<CudaApi> cuda,
              const NcclBackendOptions& options, NcclComm comm, int device_count, CudaEvent event,
              CudaStream stream, void* scratch)
      : api_(std::move(api)),
        cuda_(std::move(cuda)),
        options_(options),
        comm_(comm),
        device_count_(device_count),
        event_(event),
        stream_(stream),
        scratch_(scratch),
        device_memory_(cuda::MakeCudaDeviceMemory(cuda_)),
        op_events_(std::make_shared<OpEventsShared>(cuda_, options_.device, api_, comm_)) {}
  ~NcclBackend() override;

  const char* name() const override { return "nccl"; }
  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  Capabilities capabilities() const override {
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
  void Abort(const absl::Status& reason) override;
  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return broken_;
  }
  std::shared_ptr<DeviceMemory> device_memory() const override { return device_memory_; }
  StreamOrdered* stream_ordered() override { return this; }
  absl::StatusOr<std::shared_ptr<const StreamPosition>> MarkIssue(const OpDesc& op) override;
  absl::StatusOr<std::shared_ptr<DeviceCompletion>> Launch(const OpDesc& op) override;
  absl::Status CopyAt(const StreamPosition& at, void* dst, const void* src, size_t bytes) override;

  // ShrinkNcclBackend / CanShrinkNccl / ReleaseNcclComm (nccl_backend.h).
  absl::Status CanShrink() const;
  absl::StatusOr<std::unique_ptr<Backend>> Shrink(const std::vector<int>& exclude_ranks,
                                                  const NcclBackendOptions& options);
  void ReleaseComm() { AbortCommOnce(/*allow_park=*/false); }

 private:
  // Marks the op running (or refuses it on a broken backend); FinishCall undoes it, aborting the
  // communicator if an Abort() came meanwhile, and returns what the caller should see.
  absl::Status BeginCall(const OpDesc& op);
  absl::Status FinishCall(absl::Status result);
  absl::Status CheckView(const OpDesc& op, const TensorView& v, const char* which) const;
  // Queues `op` on `stream`; the raw NCCL result of the call (or of the group).
  NcclResult Enqueue(const OpDesc& op, CudaStream stream);
  // Waits for the event recorded after `op`, polling async errors; the op's final status.
  absl::Status WaitDone(const OpDesc& op, absl::Time deadline);
  // Records `status` as the reason the backend is broken, aborts the communicator, returns the
  // status the caller should see (the abort's, if Abort() came first).
  absl::Status Break(absl::Status status);
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
  const std::shared_ptr<OpEventsShared> op_events_;  // the event pool and the comm's health
  EventPool& events_ = op_events_->pool;
  CommHealth& health_ = op_events_->health;

  std::atomic<bool> abort_requested_{false};
  std::atomic<CudaStream> last_checked_stream_{nullptr};  // on options_.device (MarkIssue)
  // Device pointers of options_.device that CheckView found valid, by PointerSlot.
  static constexpr size_t kCheckedPointers = 16;
  static size_t PointerSlot(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) >> 8) % kCheckedPointers;
  }
  mutable std::array<std::atomic<const void*>, kCheckedPointers> checked_pointers_{};
  // An op (or a shrink) is making NCCL calls on comm_: Abort() then leaves ncclCommAbort to it
  // (FinishCall). Set and cleared by the executing thread without mu_ (BeginCall, FinishCall: every
  // op); Abort() sets abort_requested_ before it reads running_, and a call sets running_ before
  // it reads abort_requested_, so that (both sequentially consistent) at least one of them sees the
  // other.
  std::atomic<bool> running_{false};
  // Set with broken_ (never cleared): BeginCall's check without mu_.
  std::atomic<bool> broken_seen_{false};
  mutable absl::Mutex mu_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool comm_aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool comm_parked_ ABSL_GUARDED_BY(mu_) = false;
};

NcclBackend::~NcclBackend() {
  bool aborted = false;
  bool broken = false;
  {
    absl::MutexLock lock(&mu_);
    aborted = comm_aborted_;
    broken = !broken_.ok();
  }
  health_.Retire(absl::FailedPreconditionError(absl::StrCat(
      "nccl backend of rank ", options_.rank, " was destroyed before the op completed")));
  (void)cuda_->SetDevice(options_.device);
  if (!aborted && broken) {
    AbortCommOnce(/*allow_park=*/false);
    aborted = true;
  }
  if (!aborted) {
    // Finalize flushes outstanding work (nonblocking: poll); destroy then frees the resources.
    NcclResult r = api_->CommFinalize(comm_);
    const absl::Time deadline = absl::Now() + options_.shutdown_timeout;
    NcclResult state = r;
    while (r == NcclResult::kSuccess || r == NcclResult::kInProgress) {
      if (api_->CommGetAsyncError(comm_, &state) != NcclResult::kSuccess) break;
      if (state != NcclResult::kInProgress || absl::Now() > deadline) break;
      cuda::PollPause(1000);
    }
    if (state == NcclResult::kSuccess) {
      r = api_->CommDestroy(comm_);
      if (r != NcclResult::kSuccess) {
        ADAPTCOMM_LOG(kWarning, "nccl backend rank ", options_.rank,
                      ": ncclCommDestroy: ", NcclResultName(r));
      }
    } else {
      ADAPTCOMM_LOG(kWarning, "nccl backend rank ", options_.rank, ": ncclCommFinalize ",
                    state == NcclResult::kInProgress
                        ? absl::StrCat("did not finish within ",
                                       absl::FormatDuration(options_.shutdown_timeout))
                        : std::string(NcclResultName(state)),
                    "; aborting the communicator");
      AbortCommOnce(/*allow_park=*/false);
    }
  }
  if (event_ != nullptr) (void)cuda_->EventDestroy(event_);
  if (stream_ != nullptr) (void)cuda_->StreamDestroy(stream_);
  if (scratch_ != nullptr) (void)cuda_->Free(scratch_);
}

absl::Status NcclBackend::CheckView(const OpDesc& op, const TensorView& v,
                                    const char* which) const {
  if (!v.device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl backend needs device memory: view ", which, " of ", OpKindName(op.kind),
                     " is a host (cpu) buffer; pass a cuda:N view or use the gloo backend"));
  }
  if (v.device.index < 0 || v.device.index >= device_count_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl backend: view ", which, " of ", OpKindName(op.kind), " is on cuda:", v.device.index,
        ", which does not exist (", device_count_, " CUDA device(s) visible)"));
  }
  if (v.device.index != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl backend: view ", which, " of ", OpKindName(op.kind), " is on cuda:", v.device.index,
        " but this communicator's NCCL communicator runs on cuda:", options_.device));
  }
  if (DTypeSize(v.dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("nccl backend: view ", which, " of ",
                                                   OpKindName(op.kind), " has unknown dtype ",
                                                   static_cast<int>(v.dtype)));
  }
  // A training loop reuses a few buffers: each is asked about once while it stays among the last
  // few checked (device allocations keep their addresses out of the host's until freed, and CUDA
  // does not hand a freed device range to host allocations).
  std::atomic<const void*>& checked = checked_pointers_[PointerSlot(v.data)];
  if (v.data != nullptr && checked.load(std::memory_order_relaxed) != v.data) {
    PointerInfo info;
    const int e = cuda_->PointerGetAttributes(v.data, &info);
    if (e != kCudaSuccess || !info.is_device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "nccl backend: view ", which, " of ", OpKindName(op.kind),
          " is tagged cuda:", v.device.index, " but its pointer is host memory",
          e != kCudaSuccess ? absl::StrCat(" (", cuda_->ErrorString(e), ")") : std::string()));
    }
    if (info.device != v.device.index) {
      return absl::InvalidArgumentError(absl::StrCat(
          "nccl backend: view ", which, " of ", OpKindName(op.kind),
          " is tagged cuda:", v.device.index, " but its memory is on cuda:", info.device));
    }
    checked.store(v.data, std::memory_order_relaxed);  // device memory of options_.device
  }
  return absl::OkStatus();
}

absl::Status NcclBackend::Supports(const OpDesc& op) const {
  if (!IsKnownOpKind(op.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl backend: unknown op kind ", static_cast<int>(op.kind)));
  }
  if (UsesInput(op.kind)) {
    if (absl::Status s = CheckView(op, op.input, "input"); !s.ok()) return s;
  }
  if (UsesOutput(op.kind)) {
    if (absl::Status s = CheckView(op, op.output, "output"); !s.ok()) return s;
  }
  if (UsesInput(op.kind) && UsesOutput(op.kind) && op.input.stream != op.output.stream) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl backend: ", OpKindName(op.kind),
                     " input and output views are on different CUDA streams; NCCL runs an op on "
                     "one stream (order them on one)"));
  }
  if (IsReduction(op.kind) && op.reduce == ReduceOp::kAvg && !IsFloatingPoint(op.output.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl backend: ", OpKindName(op.kind),
                     " avg is defined for floating-point dtypes only, not ",
                     DTypeName(op.output.dtype), " (an integer average would truncate)"));
  }
  if ((op.kind == OpKind::kSend || op.kind == OpKind::kRecv) &&
      (op.peer < 0 || op.peer >= options_.size || op.peer == options_.rank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl backend: ", OpKindName(op.kind), " peer ", op.peer, " must be another rank in [0, ",
        options_.size, "), not this rank ", options_.rank));
  }
  if (op.kind == OpKind::kAlltoall && op.input.count % static_cast<size_t>(options_.size) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("nccl backend: alltoall count ", op.input.count,
                                                   " is not a multiple of ", options_.size));
  }
  return absl::OkStatus();
}

NcclResult NcclBackend::Enqueue(const OpDesc& op, CudaStream stream) {
  const TensorView& in = op.input;
  const TensorView& out = op.output;
  switch (op.kind) {
    case OpKind::kAllreduce:
      return api_->AllReduce(out.data, out.data, out.count, ToNccl(out.dtype), ToNccl(op.reduce),
                             comm_, stream);
    case OpKind::kBroadcast:
      return api_->Broadcast(out.data, out.data, out.count, ToNccl(out.dtype), op.root, comm_,
                             stream);
    case OpKind::kReduce:
      return api_->Reduce(out.data, out.data, out.count, ToNccl(out.dtype), ToNccl(op.reduce),
                          op.root, comm_, stream);
    case OpKind::kAllgather:
      return api_->AllGather(in.data, out.data, in.count, ToNccl(in.dtype), comm_, stream);
    case OpKind::kReduceScatter:
      return api_->ReduceScatter(in.data, out.data, out.count, ToNccl(out.dtype), ToNccl(op.reduce),
                                 comm_, stream);
    case OpKind::kBarrier:
      return api_->AllReduce(scratch_, scratch_, 1, NcclDataType::kFloat32, NcclRedOp::kSum, comm_,
                             stream);
    case OpKind::kSend:
    case OpKind::kRecv:
    case OpKind::kAlltoall: {
      NcclResult r = api_->GroupStart();
      if (r != NcclResult::kSuccess) return r;
      NcclResult first_error = NcclResult::kSuccess;
      auto note = [&first_error](NcclResult x) {
        if (!InFlight(x) && first_error == NcclResult::kSuccess) first_error = x;
      };
      if (op.kind == OpKind::kSend) {
        note(api_->Send(in.data, in.count, ToNccl(in.dtype), op.peer, comm_, stream));
      } else if (op.kind == OpKind::kRecv) {
        note(api_->Recv(out.data, out.count, ToNccl(out.dtype), op.peer, comm_, stream));
      } else {
        const size_t block = in.count / static_cast<size_t>(options_.size);
        const size_t block_bytes = block * DTypeSize(in.dtype);
        for (int peer = 0; peer < options_.size; ++peer) {
          const size_t off = block_bytes * static_cast<size_t>(peer);
          note(api_->Send(static_cast<const char*>(in.data) + off, block, ToNccl(in.dtype), peer,
                          comm_, stream));
          note(api_->Recv(static_cast<char*>(out.data) + off, block, ToNccl(out.dtype), peer, comm_,
                          stream));
        }
      }
      // The group must be closed even when a member was refused.
      r = api_->GroupEnd();
      return first_error != NcclResult::kSuccess ? first_error : r;
    }
  }
  return NcclResult::kInvalidArgument;
}

absl::Status NcclBackend::BeginCall(const OpDesc& op) {
  running_.store(true);
  if (!abort_requested_.load() && !broken_seen_.load()) return absl::OkStatus();
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);  // after Abort() or Break() set broken_ (they hold mu_ meanwhile)
    refused = absl::FailedPreconditionError(absl::StrCat("nccl backend is broken; ",
                                                         OpKindName(op.kind), " seq ", op.seq,
                                                         " not run: ", broken_.ToString()));
  }
  (void)FinishCall(refused);  // an Abort() that saw this call running left ncclCommAbort to it
  return refused;
}

absl::Status NcclBackend::FinishCall(absl::Status result) {
  running_.store(false);
  if (!abort_requested_.load()) return result;
  bool abort_now = false;
  {
    absl::MutexLock lock(&mu_);
    abort_now = !comm_aborted_;
  }
  if (abort_now) AbortCommOnce();
  if (!result.ok() && !absl::IsInvalidArgument(result)) return health();
  return result;
}

absl::Status NcclBackend::Run(const OpDesc& op) {
  if (absl::Status s = BeginCall(op); !s.ok()) return s;
  return FinishCall([&]() -> absl::Status {
    if (absl::Status s = Supports(op); !s.ok()) return s;
    const absl::Time deadline = absl::Now() + op.timeout;
    ScopedCudaDevice device(*cuda_, options_.device);
    if (int e = device.error(); e != kCudaSuccess) {
      return Break(absl::UnavailableError(absl::StrCat(
          What(op), ": cudaSetDevice(", options_.device, "): ", cuda_->ErrorString(e))));
    }
    CudaStream stream = op.kind == OpKind::kBarrier ? stream_
                        : UsesOutput(op.kind)       ? op.output.stream
                                                    : op.input.stream;
    if (op.kind != OpKind::kBarrier) {
      // Run waits for the op through an event on `stream`, which a capture forbids (MarkIssue).
      if (absl::Status s = RefuseIfCapturing(
              *cuda_, stream, UsesOutput(op.kind) ? "output" : "input", [&] { return What(op); });
          !s.ok()) {
        return s;
      }
    }
    const NcclResult r = Enqueue(op, stream);
    if (r == NcclResult::kInvalidArgument || r == NcclResult::kInvalidUsage) {
      // Refused before anything was queued: the communicator is still usable.
      return MapNcclResult(r, What(op), api_->GetLastError(comm_));
    }
    if (!InFlight(r)) return Break(MapNcclResult(r, What(op), api_->GetLastError(comm_)));
    return WaitDone(op, deadline);
  }());
}

absl::StatusOr<std::shared_ptr<const StreamPosition>> NcclBackend::MarkIssue(const OpDesc& op) {
  const bool output = UsesOutput(op.kind);
  const TensorView& view = output ? op.output : op.input;
  const char* which = output ? "output" : "input";
  int stream_device = options_.device;
  // A training loop issues on the same stream or two: check each new one once.
  const int g = view.stream == last_checked_stream_.load(std::memory_order_relaxed)
                    ? kCudaSuccess
                    : cuda_->StreamGetDevice(view.stream, &stream_device);
  if (g == kCudaSuccess && stream_device != options_.device) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl ", OpKindName(op.kind), " on rank ", options_.rank, ": the ", which,
                     " view's stream belongs to cuda:", stream_device,
                     ", the view and the communicator to cuda:", options_.device));
  }
  if (g != kCudaSuccess && g != kCudaErrorNotSupported) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl ", OpKindName(op.kind), " on rank ", options_.rank, ": the ", which,
        " view's stream is not usable (cudaStreamGetDevice: ", cuda_->ErrorString(g), ")"));
  }
  if (g == kCudaSuccess) last_checked_stream_.store(view.stream, std::memory_order_relaxed);
  // Before anything touches the caller's stream: an event recorded there during a capture would
  // pull the communicator's stream into the caller's graph, and the watchdog's query of the op's
  // end would fail and break the communicator (docs/gpu.md, "CUDA graphs").
  if (absl::Status s =
          RefuseIfCapturing(*cuda_, view.stream, which,
                            [&] { return absl::StrCat(What(op), " (its seq is not taken)"); });
      !s.ok()) {
    return s;
  }
  CudaEvent issued = nullptr, done = nullptr;
  if (absl::Status s = events_.TakeTwo(&issued, &done); !s.ok()) return s;
  if (int e = cuda_->EventRecord(issued, view.stream); e != kCudaSuccess) {
    events_.Give(issued, done);
    return absl::UnavailableError(absl::StrCat("nccl ", OpKindName(op.kind), " on rank ",
                                               options_.rank, ": cudaEventRecord on the ", which,
                                               " view's stream: ", cuda_->ErrorString(e)));
  }
  // A recycled block: a trainer holds a step's Works, and with them their ops' events.
  return MakeRecycled<NcclOpEvents>(op_events_, issued, done, Launched(op));
}

// The events behind a position MarkIssue made (null for another kind of position). NcclOpEvents is
// final: a typeid check is a pointer compare where a dynamic_cast through its two bases walks the
// class hierarchy on every op.
const NcclOpEvents* EventsOf(const StreamPosition* position) {
  return position != nullptr && typeid(*position) == typeid(NcclOpEvents)
             ? static_cast<const NcclOpEvents*>(position)
             : nullptr;
}

absl::Status NcclBackend::CopyAt(const StreamPosition& at, void* dst, const void* src,
                                 size_t bytes) {
  const NcclOpEvents* events = EventsOf(&at);
  if (events == nullptr || events->issued() == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl rank ", options_.rank, ": a copy at a stream position MarkIssue did not make"));
  }
  if (bytes == 0) return absl::OkStatus();
  ScopedCudaDevice device(*cuda_, options_.device);
  if (int e = device.error(); e != kCudaSuccess) {
    return absl::UnavailableError(absl::StrCat("nccl rank ", options_.rank, ": cudaSetDevice(",
                                               options_.device, "): ", cuda_->ErrorString(e)));
  }
  // A copy for an op launched already (a restore, or a re-run's scratch) reads a record taken on
  // the stream of that launch, maybe another backend generation's: it waits for that launch's end
  // too (an aborted collective ends; one that never does holds the copy, and the re-run behind it
  // is the watchdog's, rather than reading a record not taken yet).
  for (CudaEvent after : {events->issued(), events->WasLaunched() ? events->done() : nullptr}) {
    if (after == nullptr) continue;
    if (int e = cuda_->StreamWaitEvent(stream_, after); e != kCudaSuccess) {
      return absl::UnavailableError(absl::StrCat("nccl rank ", options_.rank,
                                                 ": cudaStreamWaitEvent before a copy of ", bytes,
                                                 " bytes: ", cuda_->ErrorString(e)));
    }
  }
  events->MarkAwaitedOn(stream_id_);
  if (absl::Status s =
          device_memory_->CopyAsync(dst, src, bytes, Device::Cuda(options_.device), stream_);
      !s.ok() || events->WasLaunched()) {
    return s;
  }
  // Not launched yet: this is the retry record's copy (or a restore into the op's own buffer).
  // The issue point moves behind it, so that whoever waits for the op's position later waits for
  // the copy too: a restore on a rebuilt communicator's stream, for an op whose launch never
  // happened (refused after an abort), would otherwise read a record still queued on this stream.
  if (int e = cuda_->EventRecord(events->issued(), stream_); e != kCudaSuccess) {
    return absl::UnavailableError(absl::StrCat("nccl rank ", options_.rank,
                                               ": cudaEventRecord after a copy of ", bytes,
                                               " bytes: ", cuda_->ErrorString(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DeviceCompletion>> NcclBackend::Launch(const OpDesc& op) {
  const NcclOpEvents* issued = EventsOf(op.issued_at.get());
  if (issued == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(What(op), ": launched without a stream position from MarkIssue"));
  }
  if (absl::Status s = BeginCall(op); !s.ok()) return s;
  std::shared_ptr<DeviceCompletion> completion;
  absl::Status status = FinishCall([&]() -> absl::Status {
    // Only the library's own threads launch: the device stays current on them between ops.
    ScopedCudaDevice device(*cuda_, options_.device);
    if (int e = device.error(); e != kCudaSuccess) {
      return Break(absl::UnavailableError(absl::StrCat(
          What(op), ": cudaSetDevice(", options_.device, "): ", cuda_->ErrorString(e))));
    }
    if (int e = issued->AwaitedOn(stream_id_) ? kCudaSuccess
                                              : cuda_->StreamWaitEvent(stream_, issued->issued());
        e != kCudaSuccess) {
      return Break(absl::UnavailableError(
          absl::StrCat(What(op), ": cudaStreamWaitEvent: ", cuda_->ErrorString(e))));
    }
    const NcclResult r = Enqueue(op, stream_);
    if (r == NcclResult::kInvalidArgument || r == NcclResult::kInvalidUsage) {
      return MapNcclResult(r, What(op), api_->GetLastError(comm_));
    }
    if (!InFlight(r)) return Break(MapNcclResult(r, What(op), api_->GetLastError(comm_)));
    // A nonblocking communicator may still be launching: the event may be recorded only once it
    // says the launch is done. The clock is read only if it is not (the deadline is set when the
    // first answer is "in progress"): a launch NCCL finished at once reads none.
    absl::Time deadline = absl::InfiniteFuture();
    for (int i = 0; r == NcclResult::kInProgress; ++i) {
      if (abort_requested_.load()) return health();
      NcclResult state = NcclResult::kSuccess;
      NcclResult q = api_->CommGetAsyncError(comm_, &state);
      if (q != NcclResult::kSuccess) state = q;
      if (state == NcclResult::kSuccess) break;
      if (state != NcclResult::kInProgress) {
        return Break(MapNcclResult(state, absl::StrCat(What(op), " (asynchronous error)"),
                                   api_->GetLastError(comm_)));
      }
      if (i == 0) {
        deadline = absl::Now() + op.timeout;
      } else if (absl::Now() > deadline) {
        return Break(absl::DeadlineExceededError(
            absl::StrCat(What(op), " was still being launched after ",
                         absl::FormatDuration(op.timeout), "; the NCCL communicator was aborted")));
      }
      cuda::PollPause(i);
    }
    const LaunchedOp launched = Launched(op);
    if (issued->ClaimLaunch(launched)) {
      // The position's own done event: the completion shares its allocation. The object was made
      // non-const (MarkIssue); OpDesc only hands it out as a const position.
      completion =
          std::shared_ptr<DeviceCompletion>(op.issued_at, const_cast<NcclOpEvents*>(issued));
    } else {
      absl::StatusOr<CudaEvent> done = events_.Take();
      if (!done.ok()) return Break(done.status());
      completion = MakeRecycled<NcclOpEvents>(op_events_, nullptr, *done, launched);
    }
    const auto* events = static_cast<const NcclOpEvents*>(completion.get());
    if (int e = cuda_->EventRecord(events->done(), stream_); e != kCudaSuccess) {
      completion = nullptr;
      return Break(absl::UnavailableError(
          absl::StrCat(What(op), ": cudaEventRecord: ", cuda_->ErrorString(e))));
    }
    return absl::OkStatus();
  }());
  if (!status.ok()) return status;
  return completion;
}

absl::Status NcclBackend::WaitDone(const OpDesc& op, absl::Time deadline) {
  // Nonblocking communicators may return ncclInProgress before the kernel is even queued: the
  // event may only be recorded once the communicator says the launch is done.
  bool recorded = false;
  for (int i = 0;; ++i) {
    if (abort_requested_.load()) {
      AbortCommOnce();
      return health();
    }
    NcclResult state = NcclResult::kSuccess;
    NcclResult r = api_->CommGetAsyncError(comm_, &state);
    if (r != NcclResult::kSuccess) state = r;
    if (state != NcclResult::kSuccess && state != NcclResult::kInProgress) {
      return Break(MapNcclResult(state, absl::StrCat(What(op), " (asynchronous error)"),
                                 api_->GetLastError(comm_)));
    }
    if (!recorded && state == NcclResult::kSuccess) {
      CudaStream stream = op.kind == OpKind::kBarrier ? stream_
                          : UsesOutput(op.kind)       ? op.output.stream
                                                      : op.input.stream;
      if (int e = cuda_->EventRecord(event_, stream); e != kCudaSuccess) {
        return Break(absl::UnavailableError(
            absl::StrCat(What(op), ": cudaEventRecord: ", cuda_->ErrorString(e))));
      }
      recorded = true;
    }
    if (recorded) {
      const int q = cuda_->EventQuery(event_);
      // An abort that raced the check above also completes the event (ncclCommAbort ends the
      // kernels): the op must then fail, not pass as done.
      if (q == kCudaSuccess && !abort_requested_.load()) return absl::OkStatus();
      if (q == kCudaSuccess) continue;
      if (q != kCudaErrorNotReady) {
        return Break(absl::UnavailableError(
            absl::StrCat(What(op), ": cudaEventQuery: ", cuda_->ErrorString(q))));
      }
    }
    if (absl::Now() > deadline) {
      return Break(absl::DeadlineExceededError(absl::StrCat(
          What(op), " did not complete within ", absl::FormatDuration(op.timeout),
          recorded ? "" : " (still being launched)", "; the NCCL communicator was aborted")));
    }
    cuda::PollPause(i);
  }
}

absl::Status NcclBackend::Break(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (abort_requested_.load() && !broken_.ok()) {
      status = broken_;  // Abort() came first: report it, not the error it caused
    } else if (broken_.ok()) {
      broken_ = status;
      broken_seen_.store(true);
    }
  }
  AbortCommOnce();
  return status;
}

void NcclBackend::Abort(const absl::Status& reason) {
  bool abort_here = false;
  {
    absl::MutexLock lock(&mu_);
    if (abort_requested_.exchange(true)) return;
    const std::string why = reason.ok() ? std::string("no reason given") : reason.ToString();
    broken_ = broken_.ok()
                  ? absl::AbortedError(absl::StrCat("nccl backend aborted: ", why))
                  : absl::AbortedError(absl::StrCat("nccl backend aborted: ", why,
                                                    " (already broken: ", broken_.ToString(), ")"));
    // A running op aborts the communicator from its own polling loop, so that no NCCL call on
    // the communicator races with its destruction by ncclCommAbort.
    broken_seen_.store(true);
    abort_here = !running_.load();
  }
  ADAPTCOMM_LOG(kInfo, "nccl backend rank ", options_.rank, " aborting: ", reason.ToString());
  if (abort_here) AbortCommOnce();
}

void NcclBackend::AbortCommOnce(bool allow_park) {
  const bool park = allow_park && options_.keep_comm_for_shrink;
  {
    absl::MutexLock lock(&mu_);
    if (comm_aborted_ || (park && comm_parked_)) return;
    if (park) {
      comm_parked_ = true;
    } else {
      comm_aborted_ = true;
    }
  }
  health_.Retire(health().ok() ? absl::AbortedError("nccl communicator aborted") : health());
  if (park) {
    ADAPTCOMM_LOG(kInfo, "nccl backend rank ", options_.rank,
                  ": communicator kept (not aborted) for an elastic ncclCommShrink");
    return;
  }
  absl::Status s = CommAbortBounded(api_, comm_, options_.abort_timeout);
  if (!s.ok()) ADAPTCOMM_LOG(kWarning, "nccl backend rank ", options_.rank, ": ", s.message());
}

// The backend around a ready communicator: its CUDA event, stream and barrier scratch.
absl::StatusOr<std::unique_ptr<Backend>> FinishNcclBackend(std::shared_ptr<NcclApi> api,
                                                           std::shared_ptr<CudaApi> cuda,
                                                           const NcclBackendOptions& o,
                                                           NcclComm comm, int device_count,
                                                           const std::string& who) {
  CudaEvent event = nullptr;
  CudaStream stream = nullptr;
  void* scratch = nullptr;
  int e = cuda->EventCreateDisableTiming(&event);
  if (e == kCudaSuccess) e = cuda->StreamCreateNonBlocking(&stream);
  if (e == kCudaSuccess) e = cuda->Malloc(&scratch, 256);
  if (e != kCudaSuccess) {
    // The constructor takes what exists so that the destructor frees it with the communicator.
    NcclBackend cleanup(api, cuda, o, comm, device_count, event, stream, scratch);
    return absl::ResourceExhaustedError(
        absl::StrCat(who, ": creating its CUDA event/stream/scratch: ", cuda->ErrorString(e)));
  }
  int version = 0;
  (void)api->GetVersion(&version);
  ADAPTCOMM_LOG(kDebug, who, ": NCCL ", NcclVersionString(version), " from ", api->library_path(),
                " ready, ", o.size, " ranks");
  return std::unique_ptr<Backend>(std::make_unique<NcclBackend>(
      std::move(api), std::move(cuda), o, comm, device_count, event, stream, scratch));
}

absl::Status NcclBackend::CanShrink() const {
  if (!api_->has_comm_shrink()) {
    return absl::FailedPreconditionError(
        absl::StrCat(api_->library_path(), " has no ncclCommShrink (NCCL 2.27+ exports it)"));
  }
  absl::MutexLock lock(&mu_);
  if (comm_aborted_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL communicator of rank ", options_.rank, " was already aborted"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> NcclBackend::Shrink(const std::vector<int>& exclude,
                                                             const NcclBackendOptions& options) {
  const std::string who =
      absl::StrCat("ncclCommShrink of rank ", options_.rank, " of ", options_.size, " to rank ",
                   options.rank, " of ", options.size, " on cuda:", options_.device);
  int below = 0;
  for (size_t i = 0; i < exclude.size(); ++i) {
    const int r = exclude[i];
    if (r < 0 || r >= options_.size || r == options_.rank ||
        std::find(exclude.begin(), exclude.begin() + static_cast<long>(i), r) !=
            exclude.begin() + static_cast<long>(i)) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": excluded rank ", r,
                                                     " must be another rank in [0, ", options_.size,
                                                     "), listed once"));
    }
    below += r < options_.rank;
  }
  if (options.size != options_.size - static_cast<int>(exclude.size()) ||
      options.rank != options_.rank - below || options.device != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": excluding ", exclude.size(), " rank(s) makes rank ", options_.rank - below, " of ",
        options_.size - static_cast<int>(exclude.size()), " on cuda:", options_.device));
  }
  if (absl::Status s = CanShrink(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(who, ": ", s.message()));
  }
  bool broken = false;
  {
    absl::MutexLock lock(&mu_);
    if (running_.load() || comm_aborted_) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, ": the parent communicator is busy or aborted"));
    }
    running_.store(true);  // Abort() meanwhile must not call ncclCommAbort under ncclCommShrink
    broken = !broken_.ok() || comm_parked_;
  }
  ScopedCudaDevice device(*cuda_, options_.device);
  NcclBackendOptions o = options;
  o.config.blocking = 0;
  NcclComm child = nullptr;
  NcclResult r =
      api_->CommShrink(comm_, exclude, &child, &o.config, broken ? kShrinkAbort : kShrinkDefault);
  NcclResult state = r;
  const absl::Time deadline = absl::Now() + o.init_timeout;
  for (int i = 0; child != nullptr && (r == NcclResult::kSuccess || r == NcclResult::kInProgress);
       ++i) {
    NcclResult q = api_->CommGetAsyncError(child, &state);
    if (q != NcclResult::kSuccess) state = q;
    if (state != NcclResult::kInProgress || absl::Now() > deadline) break;
    cuda::PollPause(64 + i);
  }
  if (!InFlight(r)) state = r;
  const std::string detail = api_->GetLastError(child != nullptr ? child : comm_);
  {
    absl::MutexLock lock(&mu_);
    running_.store(false);
    broken_seen_.store(true);
    if (broken_.ok()) {
      broken_ = absl::FailedPreconditionError(
          absl::StrCat("nccl backend of rank ", options_.rank,
                       " was replaced by its shrunk communicator (ncclCommShrink)"));
    }
  }
  // The parent's part is done (its ops ended with NCCL_SHRINK_ABORT, or it is superseded): its
  // resources go now rather than when the communicator ends.
  AbortCommOnce(/*allow_park=*/false);
  if (state != NcclResult::kSuccess) {
    absl::Status failed = state == NcclResult::kInProgress
                              ? absl::DeadlineExceededError(absl::StrCat(
                                    who, " did not finish within ",
                                    absl::FormatDuration(o.init_timeout), "; ncclCommAbort called"))
                              : MapNcclResult(state, who, detail);
    if (child != nullptr) {
      if (absl::Status a = CommAbortBounded(api_, child, o.abort_timeout); !a.ok()) {
        failed = absl::Status(failed.code(), absl::StrCat(failed.message(), "; ", a.message()));
      }
    }
    return failed;
  }
  return FinishNcclBackend(api_, cuda_, o, child, device_count_, who);
}

}  // namespace

absl::Status CanShrinkNccl(const Backend& parent) {
  const auto* nccl = dynamic_cast<const NcclBackend*>(&parent);
  if (nccl == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the backend to shrink is ", parent.name(), ", not nccl"));
  }
  return nccl->CanShrink();
}

absl::StatusOr<std::unique_ptr<Backend>> ShrinkNcclBackend(Backend& parent,
                                                           const std::vector<int>& exclude_ranks,
                                                           const NcclBackendOptions& options) {
  auto* nccl = dynamic_cast<NcclBackend*>(&parent);
  if (nccl == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("ncclCommShrink: the backend to shrink is ", parent.name(), ", not nccl"));
  }
  return nccl->Shrink(exclude_ranks, options);
}

void ReleaseNcclComm(Backend& backend) {
  auto* nccl = dynamic_cast<NcclBackend*>(&backend);
  if (nccl != nullptr && !nccl->health().ok()) nccl->ReleaseComm();
}

absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(std::shared_ptr<NcclApi> api,
                                                           std::shared_ptr<cuda::CudaApi> cuda,
                                                           const NcclBackendOptions& options) {
  if (api == nullptr) return absl::InvalidArgumentError("CreateNcclBackend: api is null");
  if (cuda == nullptr) return absl::InvalidArgumentError("CreateNcclBackend: cuda is null");
  if (options.store == nullptr) return absl::InvalidArgumentError("CreateNcclBackend: no store");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateNcclBackend: rank ", options.rank, " of ", options.size));
  }
  absl::StatusOr<InitializedComm> init = InitNcclComm(api, *cuda, options);
  if (!init.ok()) return init.status();
  return FinishNcclBackend(std::move(api), std::move(cuda), init->options, init->comm,
                           init->device_count, init->who);
}

}  // namespace adaptcomm::nccl

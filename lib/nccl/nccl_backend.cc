#include <algorithm>
#include <array>
#include <atomic>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/backend/op_checks.h"
#include "lib/base/block_recycler.h"
#include "lib/base/log.h"
#include "lib/base/op_views.h"
#include "lib/cuda/device_memory.h"
#include "lib/nccl/alltoall_staging.h"
#include "lib/nccl/device_timing.h"
#include "lib/nccl/nccl_backend_class.h"  // IWYU pragma: associated
#include "lib/nccl/nccl_init.h"
#include "lib/nccl/nccl_translate.h"
#include "lib/nccl/stream_order.h"

namespace adaptcomm::nccl {

NcclBackend::~NcclBackend() {
  bool aborted = false;
  const bool broken = !health().ok();
  {
    absl::MutexLock lock(&mu_);
    aborted = comm_aborted_;
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
  // NCCL pairs a rank's sends and receives only within a group call; a native all-to-all is one
  // call.
  const bool grouped = op.kind == OpKind::kSend || op.kind == OpKind::kRecv ||
                       (op.kind == OpKind::kAlltoall && !api_->has_alltoall());
  if (!grouped) return EnqueueMember(op, stream);
  NcclResult r = api_->GroupStart();
  if (r != NcclResult::kSuccess) return r;
  const NcclResult first_error = EnqueueMember(op, stream);
  // The group must be closed even when a member was refused.
  r = api_->GroupEnd();
  return first_error != NcclResult::kSuccess ? first_error : r;
}

NcclResult NcclBackend::EnqueueMember(const OpDesc& op, CudaStream stream) {
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
      return api_->Send(in.data, in.count, ToNccl(in.dtype), op.peer, comm_, stream);
    case OpKind::kRecv:
      return api_->Recv(out.data, out.count, ToNccl(out.dtype), op.peer, comm_, stream);
    case OpKind::kAlltoall: {
      const size_t block = in.count / static_cast<size_t>(options_.size);
      if (api_->has_alltoall()) {
        return api_->AlltoAll(in.data, out.data, block, ToNccl(in.dtype), comm_, stream);
      }
      NcclResult first_error = NcclResult::kSuccess;
      auto note = [&first_error](NcclResult x) {
        if (!InFlight(x) && first_error == NcclResult::kSuccess) first_error = x;
      };
      const size_t block_bytes = block * DTypeSize(in.dtype);
      for (int peer = 0; peer < options_.size; ++peer) {
        const size_t off = block_bytes * static_cast<size_t>(peer);
        note(api_->Send(static_cast<const char*>(in.data) + off, block, ToNccl(in.dtype), peer,
                        comm_, stream));
        note(api_->Recv(static_cast<char*>(out.data) + off, block, ToNccl(out.dtype), peer, comm_,
                        stream));
      }
      return first_error;
    }
  }
  return NcclResult::kInvalidArgument;
}

absl::Status NcclBackend::StageOverlappingInputs(absl::Span<OpDesc> ops, CudaStream stream) {
  // Each op's part starts on a 256-byte boundary (what cudaMalloc gives the buffer itself).
  constexpr size_t kAlign = 256;
  auto part = [](const OpDesc& op) { return (op.input.bytes() + kAlign - 1) / kAlign * kAlign; };
  size_t total = 0;
  for (const OpDesc& op : ops) total += NeedsAlltoallStaging(op) ? part(op) : 0;
  if (total == 0) return absl::OkStatus();
  const OpDesc& head = ops.front();
  absl::StatusOr<void*> buffer = staging_.Reserve(total);
  if (!buffer.ok()) {
    absl::Status s(buffer.status().code(),
                   absl::StrCat(What(head), ": ", buffer.status().message()));
    // Refused under a capture before anything was queued: local to this op.
    return absl::IsFailedPrecondition(s) ? s : Break(std::move(s));
  }
  if (stream != stream_) {
    // Run on the op's own stream: the ops launched before on the communicator's stream may still
    // read the buffer (they do not wait for the host), so the copy waits for them.
    int e = cuda_->EventRecord(event_, stream_);
    if (e == kCudaSuccess) e = cuda_->StreamWaitEvent(stream, event_);
    if (e != kCudaSuccess) {
      return Break(absl::UnavailableError(absl::StrCat(
          What(head), ": ordering the alltoall staging copy: ", cuda_->ErrorString(e))));
    }
  }
  size_t offset = 0;
  for (OpDesc& op : ops) {
    if (!NeedsAlltoallStaging(op)) continue;
    void* at = static_cast<char*>(*buffer) + offset;
    if (int e = cuda_->MemcpyAsync(at, op.input.data, op.input.bytes(),
                                   cuda::MemcpyKind::kDeviceToDevice, stream);
        e != kCudaSuccess) {
      return Break(absl::UnavailableError(absl::StrCat(
          What(op), ": cudaMemcpyAsync of the in-place alltoall's input (", op.input.bytes(),
          " bytes) to its staging buffer: ", cuda_->ErrorString(e))));
    }
    offset += part(op);
    op.input.data = at;
  }
  return absl::OkStatus();
}

absl::StatusOr<const OpDesc*> NcclBackend::WithStagedInput(const OpDesc& op, CudaStream stream,
                                                           OpDesc* staged) {
  // Copied only for an in-place alltoall: no other op pays for an OpDesc copy.
  if (!NeedsAlltoallStaging(op)) return &op;
  *staged = op;
  if (absl::Status s = StageOverlappingInputs(absl::MakeSpan(staged, 1), stream); !s.ok()) {
    return s;
  }
  return staged;
}

absl::Status NcclBackend::BeginCall(const OpDesc& op) {
  running_.store(true);
  const bool abort_seen = aborted();   // after running_ is set: see running_
  absl::Status refused = Refused(op);  // after an Abort(), never OK (BackendBase::Abort)
  if (refused.ok() && !abort_seen) return refused;
  (void)FinishCall(refused);  // an Abort() that saw this call running left ncclCommAbort to it
  return refused;
}

absl::Status NcclBackend::FinishCall(absl::Status result) {
  running_.store(false);
  if (!aborted()) return result;
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
    // An in-place alltoall sends from a copy of its input (lib/nccl/alltoall_staging.h).
    OpDesc staged;
    absl::StatusOr<const OpDesc*> run = WithStagedInput(op, stream, &staged);
    if (!run.ok()) return run.status();
    const NcclResult r = Enqueue(**run, stream);
    if (r == NcclResult::kInvalidArgument || r == NcclResult::kInvalidUsage) {
      // Refused before anything was queued: the communicator is still usable.
      return MapNcclResult(r, What(op), api_->GetLastError(comm_));
    }
    if (!InFlight(r)) return Break(MapNcclResult(r, What(op), api_->GetLastError(comm_)));
    return WaitDone(op, stream, deadline);
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
  // The op's device timing events, when it is sampled (lib/nccl/device_timing.h); given back to
  // their pool on every return that does not hand them to the completion.
  CudaEvent timing_start = nullptr, timing_end = nullptr;
  absl::Cleanup give_back_timing = [&] {
    if (timing_start != nullptr) op_events_->timing.Give(timing_start, timing_end);
  };
  absl::Status status = FinishCall([&]() -> absl::Status {
    // Per op, on the device (none of it waits for the host, nor the host for it):
    //  - the caller's stream: the issue event (MarkIssue), which nothing on it waits for;
    //  - the communicator's stream waits for the issue event, then runs the in-place alltoall's
    //    staging copy (if any), the start timing event (sampled ops), the NCCL call, the end
    //    timing event (sampled ops) and the done event;
    //  - the caller's stream waits for the done event when the trainer calls Work::Wait
    //    (MakeStreamWait); no stream ever waits for a timing event.
    // On abort, ncclCommAbort ends the kernels: the done event completes, Poll() reports the abort
    // and the op fails; its timing is never read, and its events go back to their pools when the
    // op's last holder lets go. Under CUDA graph capture nothing gets here: MarkIssue refused the
    // op before recording anything, and the communicator's stream never captures.
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
    // An in-place alltoall sends from a copy of its input, taken on the communicator's stream
    // behind the wait above (lib/nccl/alltoall_staging.h).
    OpDesc staged;
    absl::StatusOr<const OpDesc*> run = WithStagedInput(op, stream_, &staged);
    if (!run.ok()) return run.status();
    if (DeviceTimingSampled(op.seq, options_.device_timing_every)) {
      TakeTimingEvents(&timing_start, &timing_end);
      if (timing_start != nullptr && cuda_->EventRecord(timing_start, stream_) != kCudaSuccess) {
        op_events_->timing.Give(timing_start, timing_end);  // the op runs, untimed
        timing_start = timing_end = nullptr;
      }
    }
    const NcclResult r = Enqueue(**run, stream_);
    if (r == NcclResult::kInvalidArgument || r == NcclResult::kInvalidUsage) {
      return MapNcclResult(r, What(op), api_->GetLastError(comm_));
    }
    if (!InFlight(r)) return Break(MapNcclResult(r, What(op), api_->GetLastError(comm_)));
    if (absl::Status s = AwaitLaunchDone(r, op); !s.ok()) return s;
    absl::StatusOr<std::shared_ptr<DeviceCompletion>> claimed = CompletionOf(op);
    if (!claimed.ok()) return claimed.status();
    completion = *std::move(claimed);
    auto* events = static_cast<NcclOpEvents*>(completion.get());
    // The end timing event, like the done event, only once NCCL says the launch is done.
    if (timing_start != nullptr && cuda_->EventRecord(timing_end, stream_) == kCudaSuccess) {
      events->SetTiming(timing_start, timing_end);
      timing_start = timing_end = nullptr;  // the completion's now
    }
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

absl::StatusOr<std::shared_ptr<DeviceCompletion>> NcclBackend::CompletionOf(const OpDesc& op) {
  const NcclOpEvents* issued = EventsOf(op.issued_at.get());
  const LaunchedOp launched = Launched(op);
  if (issued != nullptr && issued->ClaimLaunch(launched)) {
    // The position's own done event: the completion shares its allocation. The object was made
    // non-const (MarkIssue); OpDesc only hands it out as a const position.
    return std::shared_ptr<DeviceCompletion>(op.issued_at, const_cast<NcclOpEvents*>(issued));
  }
  absl::StatusOr<CudaEvent> done = events_.Take();
  if (!done.ok()) return Break(done.status());
  return MakeRecycled<NcclOpEvents>(op_events_, nullptr, *done, launched);
}

absl::Status NcclBackend::AwaitLaunchDone(NcclResult r, const OpDesc& op) {
  // A nonblocking communicator may still be launching: the event may be recorded only once it
  // says the launch is done. The clock is read only if it is not (the deadline is set when the
  // first answer is "in progress"): a launch NCCL finished at once reads none.
  absl::Time deadline = absl::InfiniteFuture();
  for (int i = 0; r == NcclResult::kInProgress; ++i) {
    if (aborted()) return health();
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
  return absl::OkStatus();
}

void NcclBackend::TakeTimingEvents(CudaEvent* start, CudaEvent* end) {
  if (timing_unavailable_.load(std::memory_order_relaxed)) return;
  if (absl::Status s = op_events_->timing.TakeTwo(start, end); !s.ok()) {
    // A runtime without timing events (or out of them): ops run untimed from here on; once.
    *start = *end = nullptr;
    if (!timing_unavailable_.exchange(true)) {
      ADAPTCOMM_LOG(kWarning, "nccl backend rank ", options_.rank,
                    ": no device timing of its ops (", s.message(), ")");
    }
  }
}

absl::Status NcclBackend::WaitDone(const OpDesc& op, CudaStream stream, absl::Time deadline) {
  // Nonblocking communicators may return ncclInProgress before the kernel is even queued: the
  // event may only be recorded once the communicator says the launch is done.
  bool recorded = false;
  for (int i = 0;; ++i) {
    if (aborted()) {
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
      if (q == kCudaSuccess && !aborted()) return absl::OkStatus();
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

void NcclBackend::Interrupt(const absl::Status& /*reason*/) {
  // A running op aborts the communicator from its own polling loop, so that no NCCL call on the
  // communicator races with its destruction by ncclCommAbort.
  if (!running_.load()) AbortCommOnce();
}

void NcclBackend::OnBroken(const absl::Status& /*failure*/) { AbortCommOnce(); }

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

}  // namespace adaptcomm::nccl

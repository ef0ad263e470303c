// The device path of the mixed-precision collectives: see mixed_device.h.
#include "lib/precision/mixed_device.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/cuda/cuda_api.h"
#include "lib/precision/mixed_fingerprint.h"
#include "lib/precision/mixed_internal.h"

namespace adaptcomm {
namespace {

using cuda::CastDirection;
using cuda::CudaApi;
using cuda::DeviceCastCounters;
using cuda::kCudaSuccess;

constexpr absl::Duration kDefaultStreamWait = absl::Minutes(5);
constexpr size_t kFpFields = mixed::kFingerprintFields;

// Device resources of one context, made on first use and kept.
struct DeviceMixedState {
  std::shared_ptr<CudaApi> api;
  int device = -1;
  cuda::CudaStream comm_stream = nullptr;
  cuda::CudaEvent cast_done = nullptr;
  cuda::CudaEvent coll_done = nullptr;
  cuda::CudaEvent host_wait = nullptr;  // recorded for the bounded host waits
  void* wire_in = nullptr;
  size_t wire_in_bytes = 0;
  void* wire_out = nullptr;
  size_t wire_out_bytes = 0;
  DeviceCastCounters* counters = nullptr;       // device: [0] the cast, [1] the cast back
  DeviceCastCounters* host_counters = nullptr;  // pinned read-back of both
  int64_t* fp_dev = nullptr;                    // fingerprints: this rank's, then every rank's
  int64_t* fp_host = nullptr;                   // pinned
  size_t fp_count = 0;

  ~DeviceMixedState() {
    if (api == nullptr) return;
    (void)api->SetDevice(device);
    for (void* p : {wire_in, wire_out, static_cast<void*>(counters), static_cast<void*>(fp_dev)}) {
      if (p != nullptr) (void)api->Free(p);
    }
    for (void* p : {static_cast<void*>(host_counters), static_cast<void*>(fp_host)}) {
      if (p != nullptr) (void)api->FreeHost(p);
    }
    for (cuda::CudaEvent e : {cast_done, coll_done, host_wait}) {
      if (e != nullptr) (void)api->EventDestroy(e);
    }
    if (comm_stream != nullptr) (void)api->StreamDestroy(comm_stream);
  }
};

class DeviceOp {
 public:
  DeviceOp(const DeviceMixedCall& call, DeviceMixedState& ds)
      : c_(call),
        o_(*call.opts),
        comm_(*call.comm),
        ds_(ds),
        api_(*ds.api),
        d_(call.input.device.index),
        s_(call.input.stream),
        name_(absl::StrCat("mixed ", OpKindName(call.kind), " seq ", call.seq,
                           " on cuda:", call.input.device.index)) {}

  enum class Outcome { kDone, kResendBF16, kResendF32 };
  absl::StatusOr<Outcome> Run(DType wire);
  MixedStats stats;

 private:
  absl::Status Cuda(int e, const char* what) {
    if (e == kCudaSuccess) return absl::OkStatus();
    if (e == cuda::kCudaErrorNotSupported) {
      return absl::FailedPreconditionError(
          absl::StrCat(name_, ": ", what, " is not available (", api_.ErrorString(e),
                       "); CUDA cast kernels built: ", cuda::CastKernelsBuiltIn() ? "yes" : "no"));
    }
    return absl::InternalError(absl::StrCat(name_, ": ", what, ": ", api_.ErrorString(e)));
  }

  // The host waits, bounded, for the work queued on `stream` so far.
  absl::Status HostWait(cuda::CudaStream stream, const char* what) {
    if (absl::Status s = Cuda(api_.EventRecord(ds_.host_wait, stream), "cudaEventRecord");
        !s.ok()) {
      return s;
    }
    const absl::Duration bound = o_.timeout.value_or(kDefaultStreamWait);
    const absl::Time deadline = absl::Now() + bound;
    for (int i = 0;; ++i) {
      const int q = api_.EventQuery(ds_.host_wait);
      if (q == kCudaSuccess) return absl::OkStatus();
      if (q != cuda::kCudaErrorNotReady) return Cuda(q, "cudaEventQuery");
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            name_, ": ", what, " did not finish within ", absl::FormatDuration(bound)));
      }
      cuda::PollPause(i);
    }
  }

  absl::Status Grow(void** p, size_t* have, size_t bytes) {
    if (*have >= bytes) return absl::OkStatus();
    if (*p != nullptr) (void)api_.Free(*p);  // unused: every earlier op was waited for
    *p = nullptr;
    *have = 0;
    if (absl::Status s = Cuda(api_.Malloc(p, bytes), "cudaMalloc of the wire scratch"); !s.ok()) {
      return s;
    }
    *have = bytes;
    return absl::OkStatus();
  }

  TensorView Wire(void* p, size_t count, DType wire) const {
    return TensorView{p, count, wire, Device::Cuda(d_), ds_.comm_stream};
  }

  float Factor() const { return MixedFactor(c_.kind, o_, comm_.size()); }

  Work Issue(TensorView in, TensorView out) {
    return IssueWireCollective(comm_, c_.kind, o_, in, out);
  }

  absl::Status ReadCounters() {
    if (absl::Status s =
            Cuda(api_.MemcpyAsync(ds_.host_counters, ds_.counters, 2 * sizeof(DeviceCastCounters),
                                  cuda::MemcpyKind::kDeviceToHost, s_),
                 "cudaMemcpyAsync of the cast counters");
        !s.ok()) {
      return s;
    }
    return HostWait(s_, "the cast counters' read-back");
  }

  absl::Status Exchange(DType wire, bool* resend);
  bool AnyNonfiniteInput() const {
    return mixed::AnyNonfiniteInput(ds_.fp_host + kFpFields, comm_.size());
  }
  absl::StatusOr<Outcome> RunF32();
  // Run's steps (numbered there).
  absl::Status CastToWire(DType wire, size_t in_count, bool host_barrier);
  absl::Status AfterCollective();
  absl::StatusOr<Outcome> CheckReductionOverflow(void* result, size_t out_count);
  absl::Status CastBack(DType wire, void* result, size_t out_count);

  const DeviceMixedCall& c_;
  const MixedOptions& o_;
  Communicator& comm_;
  DeviceMixedState& ds_;
  CudaApi& api_;
  const int d_;
  const cuda::CudaStream s_;
  const std::string name_;
};

// MixedOpRunner::Exchange (mixed_runner.cc) over device scratch: this rank's fingerprint is copied
// up, allgathered on the communication stream and copied back. Same checks, same messages, same
// result on all ranks.
absl::Status DeviceOp::Exchange(DType wire, bool* resend) {
  const size_t n = static_cast<size_t>(comm_.size());
  const size_t need = kFpFields * (n + 1);
  if (ds_.fp_count < need) {
    if (ds_.fp_dev != nullptr) (void)api_.Free(ds_.fp_dev);
    if (ds_.fp_host != nullptr) (void)api_.FreeHost(ds_.fp_host);
    ds_.fp_dev = nullptr;
    ds_.fp_host = nullptr;
    ds_.fp_count = 0;
    void* dev = nullptr;
    void* host = nullptr;
    if (absl::Status s = Cuda(api_.Malloc(&dev, need * sizeof(int64_t)), "cudaMalloc"); !s.ok()) {
      return s;
    }
    ds_.fp_dev = static_cast<int64_t*>(dev);
    if (absl::Status s = Cuda(api_.HostAlloc(&host, need * sizeof(int64_t)), "cudaHostAlloc");
        !s.ok()) {
      return s;
    }
    ds_.fp_host = static_cast<int64_t*>(host);
    ds_.fp_count = need;
  }
  int64_t* f = ds_.fp_host;
  mixed::Fingerprint fp;
  fp.kind = c_.kind;
  fp.op = o_.op;
  fp.wire = wire;
  fp.count_in = c_.input.count;
  fp.count_out = c_.output.count;
  fp.seq = c_.seq;
  fp.hook_failed = !c_.hook_failure->ok();
  fp.overflow = stats.cast_overflow;
  fp.nonfinite = stats.nonfinite_inputs;
  mixed::EncodeFingerprint(fp, f);
  const size_t bytes = kFpFields * sizeof(int64_t);
  cuda::CudaStream b = ds_.comm_stream;
  if (absl::Status s =
          Cuda(api_.MemcpyAsync(ds_.fp_dev, f, bytes, cuda::MemcpyKind::kHostToDevice, b),
               "cudaMemcpyAsync of the fingerprint");
      !s.ok()) {
    return s;
  }
  AllgatherOptions ao;
  ao.timeout = o_.timeout;
  TensorView mine{ds_.fp_dev, kFpFields, DType::kI64, Device::Cuda(d_), b};
  TensorView all{ds_.fp_dev + kFpFields, kFpFields * n, DType::kI64, Device::Cuda(d_), b};
  if (absl::Status s = comm_.Allgather(mine, all, ao).Wait(); !s.ok()) return s;
  if (absl::Status s = Cuda(api_.MemcpyAsync(f + kFpFields, ds_.fp_dev + kFpFields, bytes * n,
                                             cuda::MemcpyKind::kDeviceToHost, b),
                            "cudaMemcpyAsync of the fingerprints");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = HostWait(b, "the fingerprint read-back"); !s.ok()) return s;
  int64_t total_overflow = 0;
  if (absl::Status j =
          mixed::JudgeFingerprints(f + kFpFields, static_cast<int>(n), fp, *c_.hook_failure,
                                   o_.overflow, &total_overflow, resend);
      !j.ok()) {
    return j;
  }
  stats.global_cast_overflow = total_overflow;
  return absl::OkStatus();
}

// The plain fp32 collective on the caller's buffers and stream (in order after the caller's work:
// no barrier needed), then the scale in fp32.
absl::StatusOr<DeviceOp::Outcome> DeviceOp::RunF32() {
  const absl::Time t0 = absl::Now();
  if (o_.barrier == BarrierLevel::kGlobal) {
    bool unused = false;
    if (absl::Status s = Exchange(DType::kF32, &unused); !s.ok()) return s;
  }
  c_.call_hooks(HookPoint::kBeforeCollective, DType::kF32);
  if (absl::Status s = Issue(c_.input, c_.output).Wait(); !s.ok()) return s;
  c_.call_hooks(HookPoint::kAfterCollective, DType::kF32);
  stats.collective_time = absl::Now() - t0;
  const absl::Time t1 = absl::Now();
  if (absl::Status s = Cuda(api_.MemsetAsync(ds_.counters, 0, 2 * sizeof(DeviceCastCounters), s_),
                            "cudaMemsetAsync");
      !s.ok()) {
    return s;
  }
  const float factor = Factor();
  if (factor != 1.0f) {
    if (absl::Status s =
            Cuda(api_.LaunchCast(CastDirection::kF32ToF32, c_.output.data, c_.output.data,
                                 c_.output.count, factor, s_, &ds_.counters[1]),
                 "the fp32 scale kernel");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = ReadCounters(); !s.ok()) return s;
  stats.cast_back_time = absl::Now() - t1;
  stats.wire_used = DType::kF32;
  if (!c_.hook_failure->ok()) return *c_.hook_failure;
  return Outcome::kDone;
}

// Steps 1 and 2 of Run: the cast to the wire dtype on the caller's stream, then the barrier
// between it and the collective on the communicator's stream (an event, or the host when
// `host_barrier`, which also reads the cast counters).
absl::Status DeviceOp::CastToWire(DType wire, size_t in_count, bool host_barrier) {
  const bool f16 = wire == DType::kF16;
  if (absl::Status s = Cuda(api_.MemsetAsync(ds_.counters, 0, 2 * sizeof(DeviceCastCounters), s_),
                            "cudaMemsetAsync of the cast counters");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          Cuda(api_.LaunchCast(f16 ? CastDirection::kF32ToF16 : CastDirection::kF32ToBF16,
                               c_.input.data, ds_.wire_in, in_count, 1.0f, s_, &ds_.counters[0]),
               "the fp32 -> wire cast kernel");
      !s.ok()) {
    return s;
  }
  if (!host_barrier) {
    if (absl::Status s = Cuda(api_.EventRecord(ds_.cast_done, s_), "cudaEventRecord(cast_done)");
        !s.ok()) {
      return s;
    }
    if (!o_.debug_skip_host_barrier) {
      if (absl::Status s = Cuda(api_.StreamWaitEvent(ds_.comm_stream, ds_.cast_done),
                                "cudaStreamWaitEvent(comm stream, cast_done)");
          !s.ok()) {
        return s;
      }
    }
  } else if (!o_.debug_skip_host_barrier) {
    if (absl::Status s = ReadCounters(); !s.ok()) return s;  // also waits for the cast
    stats.cast_overflow = ds_.host_counters[0].overflow;
    stats.nonfinite_inputs = ds_.host_counters[0].nonfinite;
  }
  return absl::OkStatus();
}

// Step 5 of Run: the barrier between the collective and the cast back on the caller's stream.
absl::Status DeviceOp::AfterCollective() {
  if (o_.barrier == BarrierLevel::kStream) {
    if (absl::Status s =
            Cuda(api_.EventRecord(ds_.coll_done, ds_.comm_stream), "cudaEventRecord(coll_done)");
        !s.ok()) {
      return s;
    }
    return Cuda(api_.StreamWaitEvent(s_, ds_.coll_done),
                "cudaStreamWaitEvent(caller stream, coll_done)");
  }
  if (absl::Status s = HostWait(ds_.comm_stream, "the wire collective"); !s.ok()) return s;
  if (o_.barrier == BarrierLevel::kGlobal) {
    BarrierOptions bo;
    bo.timeout = o_.timeout;
    if (absl::Status s = comm_.Barrier(bo).Wait(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Step 6 of Run: overflow of the fp16 reduction itself (allreduce: the same result on every
// rank, so the same decision everywhere), counted by a store-less widening pass before the output
// is written. kDone: no overflow; a resend outcome, or an error under overflow policy fail.
absl::StatusOr<DeviceOp::Outcome> DeviceOp::CheckReductionOverflow(void* result, size_t out_count) {
  if (absl::Status s = Cuda(api_.MemsetAsync(&ds_.counters[1], 0, sizeof(DeviceCastCounters), s_),
                            "cudaMemsetAsync");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Cuda(api_.LaunchCast(CastDirection::kF16ToF32, result, nullptr, out_count,
                                            1.0f, s_, &ds_.counters[1]),
                            "the fp16 result count");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadCounters(); !s.ok()) return s;
  const size_t nonfinite = ds_.host_counters[1].nonfinite;
  if (nonfinite > 0 && !AnyNonfiniteInput()) {
    stats.result_nonfinite = nonfinite;
    if (o_.overflow == OverflowPolicy::kFail) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fp16 wire overflow in mixed allreduce seq ", c_.seq, ": the fp16 sum of ", nonfinite,
          " elements exceeds 65504; policy=fail. Use a bf16 wire or a resend policy"));
    }
    return o_.overflow == OverflowPolicy::kResendF32 ? Outcome::kResendF32 : Outcome::kResendBF16;
  }
  return Outcome::kDone;
}

// Step 7 of Run: the cast back on the caller's stream with the scale, then the counters (the
// host waits for the stream: the op is synchronous).
absl::Status DeviceOp::CastBack(DType wire, void* result, size_t out_count) {
  const bool f16 = wire == DType::kF16;
  if (absl::Status s = Cuda(api_.MemsetAsync(&ds_.counters[1], 0, sizeof(DeviceCastCounters), s_),
                            "cudaMemsetAsync");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          Cuda(api_.LaunchCast(f16 ? CastDirection::kF16ToF32 : CastDirection::kBF16ToF32, result,
                               c_.output.data, out_count, Factor(), s_, &ds_.counters[1]),
               "the wire -> fp32 cast kernel");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadCounters(); !s.ok()) return s;
  stats.cast_overflow = ds_.host_counters[0].overflow;
  stats.nonfinite_inputs = ds_.host_counters[0].nonfinite;
  stats.result_nonfinite = ds_.host_counters[1].nonfinite;
  return absl::OkStatus();
}

absl::StatusOr<DeviceOp::Outcome> DeviceOp::Run(DType wire) {
  if (wire == DType::kF32) return RunF32();
  const bool f16 = wire == DType::kF16;
  const size_t in_count = c_.input.count;
  const size_t out_count = c_.kind == OpKind::kAllreduce ? in_count : c_.output.count;
  if (absl::Status s = Grow(&ds_.wire_in, &ds_.wire_in_bytes, std::max<size_t>(in_count, 1) * 2);
      !s.ok()) {
    return s;
  }
  if (c_.kind != OpKind::kAllreduce) {
    if (absl::Status s =
            Grow(&ds_.wire_out, &ds_.wire_out_bytes, std::max<size_t>(out_count, 1) * 2);
        !s.ok()) {
      return s;
    }
  }
  void* result = c_.kind == OpKind::kAllreduce ? ds_.wire_in : ds_.wire_out;
  stats.wire_used = wire;
  const bool guard = f16 && o_.overflow != OverflowPolicy::kReport;
  const bool host_barrier = o_.barrier != BarrierLevel::kStream || guard;

  // 1. cast on the caller's stream, 2. the barrier between the cast and the collective on B
  const absl::Time t0 = absl::Now();
  c_.call_hooks(HookPoint::kBeforeCast, wire);
  if (absl::Status s = CastToWire(wire, in_count, host_barrier); !s.ok()) return s;
  c_.call_hooks(HookPoint::kAfterCast, wire);
  const absl::Time t1 = absl::Now();
  stats.cast_time = t1 - t0;

  // 3. agreement
  if (o_.barrier == BarrierLevel::kGlobal || guard) {
    bool resend = false;
    if (absl::Status s = Exchange(wire, &resend); !s.ok()) return s;
    if (resend) {
      return o_.overflow == OverflowPolicy::kResendF32 ? Outcome::kResendF32 : Outcome::kResendBF16;
    }
  }

  // 4. the collective on the wire dtype, on B, 5. the barrier between it and the cast back on S
  c_.call_hooks(HookPoint::kBeforeCollective, wire);
  if (absl::Status s =
          Issue(Wire(ds_.wire_in, in_count, wire), Wire(result, out_count, wire)).Wait();
      !s.ok()) {
    return s;
  }
  if (absl::Status s = AfterCollective(); !s.ok()) return s;
  c_.call_hooks(HookPoint::kAfterCollective, wire);
  const absl::Time t2 = absl::Now();
  stats.collective_time = t2 - t1;

  // 6. overflow of the fp16 reduction itself
  if (guard && c_.kind == OpKind::kAllreduce && stats.global_cast_overflow == 0) {
    absl::StatusOr<Outcome> checked = CheckReductionOverflow(result, out_count);
    if (!checked.ok() || *checked != Outcome::kDone) return checked;
  }

  // 7. cast back on S with the scale
  if (absl::Status s = CastBack(wire, result, out_count); !s.ok()) return s;
  stats.cast_back_time = absl::Now() - t2;
  if (!c_.hook_failure->ok()) return *c_.hook_failure;
  return Outcome::kDone;
}

// The context's device state for device `device`, made (or remade for another device) now.
absl::StatusOr<DeviceMixedState*> EnsureState(std::shared_ptr<void>& slot,
                                              std::shared_ptr<CudaApi> api, int device,
                                              const std::string& name) {
  auto* ds = static_cast<DeviceMixedState*>(slot.get());
  if (ds != nullptr && ds->device == device && ds->api == api) return ds;
  slot.reset();  // frees the old device's resources
  auto fresh = std::make_shared<DeviceMixedState>();
  fresh->api = api;
  fresh->device = device;
  auto check = [&](int e, const char* what) -> absl::Status {
    if (e == kCudaSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(name, ": ", what, ": ", api->ErrorString(e)));
  };
  void* counters = nullptr;
  void* host = nullptr;
  absl::Status s =
      check(api->StreamCreateNonBlocking(&fresh->comm_stream), "creating the communication stream");
  if (s.ok()) s = check(api->EventCreateDisableTiming(&fresh->cast_done), "cudaEventCreate");
  if (s.ok()) s = check(api->EventCreateDisableTiming(&fresh->coll_done), "cudaEventCreate");
  if (s.ok()) s = check(api->EventCreateDisableTiming(&fresh->host_wait), "cudaEventCreate");
  if (s.ok()) {
    s = check(api->Malloc(&counters, 2 * sizeof(DeviceCastCounters)), "cudaMalloc of counters");
    fresh->counters = static_cast<DeviceCastCounters*>(counters);
  }
  if (s.ok()) {
    s = check(api->HostAlloc(&host, 2 * sizeof(DeviceCastCounters)), "cudaHostAlloc");
    fresh->host_counters = static_cast<DeviceCastCounters*>(host);
  }
  if (!s.ok()) return s;  // `fresh` frees what was made
  slot = fresh;
  return fresh.get();
}

}  // namespace

absl::Status ValidateMixedDeviceViews(const char* op_name, const TensorView& input,
                                      const TensorView& output) {
  auto where = [](const TensorView& v) {
    return v.device.is_cuda() ? absl::StrCat("cuda:", v.device.index) : std::string("cpu");
  };
  if (!input.device.is_cuda() || !output.device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mixed ", op_name, ": input is on ", where(input), " but output is on ",
                     where(output), "; both must be on the same CUDA device"));
  }
  if (input.device.index != output.device.index) {
    return absl::InvalidArgumentError(
        absl::StrCat("mixed ", op_name, ": input is on ", where(input), " but output is on ",
                     where(output), "; both must be on the same CUDA device"));
  }
  if (input.stream != output.stream) {
    return absl::InvalidArgumentError(
        absl::StrCat("mixed ", op_name,
                     ": input and output views are on different CUDA streams; the casts run "
                     "on one (the caller's) stream"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MixedStats> RunMixedOnDevice(const DeviceMixedCall& call) {
  const int device = call.input.device.index;
  const std::string name =
      absl::StrCat("mixed ", OpKindName(call.kind), " seq ", call.seq, " on cuda:", device);
  // The CUDA runtime the communicator was built with (the process's, unless injected).
  absl::StatusOr<std::shared_ptr<CudaApi>> api = internal::CommunicatorCudaApi(*call.comm);
  if (!api.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": no CUDA runtime: ", api.status().message()));
  }
  // The caller's current device is restored when this returns.
  cuda::ScopedCudaDevice current(**api, device);
  if (int e = current.error(); e != kCudaSuccess) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": cudaSetDevice(", device, "): ", (*api)->ErrorString(e)));
  }
  absl::StatusOr<DeviceMixedState*> ds = EnsureState(*call.device_state, *api, device, name);
  if (!ds.ok()) return ds.status();
  DeviceOp op(call, **ds);
  DType wire = call.opts->wire;
  bool resent = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<DeviceOp::Outcome> outcome = op.Run(wire);
    if (!outcome.ok()) return outcome.status();
    if (*outcome == DeviceOp::Outcome::kDone) break;
    // A resend: the fp32 input is untouched (the cast back never ran), so start over.
    const MixedStats first = op.stats;
    wire = *outcome == DeviceOp::Outcome::kResendF32 ? DType::kF32 : DType::kBF16;
    resent = true;
    op.stats = MixedStats{};
    op.stats.cast_overflow = first.cast_overflow;
    op.stats.global_cast_overflow = first.global_cast_overflow;
    op.stats.nonfinite_inputs = first.nonfinite_inputs;
  }
  op.stats.resent = resent;
  return op.stats;
}

}  // namespace adaptcomm

// Mixed-precision collectives: cast -> barrier -> collective in the wire dtype -> barrier -> cast
// back, with hooks, fingerprint checks and the fp16 overflow guard (see adaptcomm/precision.h).
//
// Agreement between ranks is what keeps this safe: a rank may only skip or change a collective
// when every rank makes the same decision. Decisions therefore come either from the fingerprint
// allgather (every rank sees every rank's counts and failures) or from data every rank holds
// identically (an allreduce result). Without an exchange (host barrier, no fp16 guard), a local
// hook failure still runs the collective, so the peers are not left hanging, and is reported after.
#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/precision.h"
#include "lib/base/cast_kernels.h"
#include "lib/base/fused_kernels.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/precision/cast_parallel.h"
#include "lib/precision/mixed_device.h"
#include "lib/precision/mixed_fingerprint.h"
#include "lib/precision/mixed_internal.h"
#include "lib/precision/mixed_runner.h"

namespace adaptcomm {

namespace {

absl::Status Validate(Communicator& comm, OpKind kind, const TensorView& in, const TensorView& out,
                      const MixedOptions& opts) {
  const char* name = OpKindName(kind);
  for (const TensorView* v : {&in, &out}) {
    if (v->dtype != DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("mixed ", name, ": buffers must be f32, got ", DTypeName(v->dtype)));
    }
    if (v->device.is_cuda() || in.device.is_cuda()) {  // the device path: mixed_device.cc
      if (absl::Status s = ValidateMixedDeviceViews(name, in, out); !s.ok()) return s;
    }
    if (v->data == nullptr && v->count != 0) {
      return absl::InvalidArgumentError(absl::StrCat("mixed ", name, ": null data"));
    }
  }
  if (opts.wire != DType::kBF16 && opts.wire != DType::kF16 && opts.wire != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("mixed ", name, ": wire dtype must be bf16, ",
                                                   "f16 or f32, got ", DTypeName(opts.wire)));
  }
  if (kind != OpKind::kAllgather && opts.op == ReduceOp::kProd) {
    return absl::InvalidArgumentError(
        absl::StrCat("mixed ", name, ": prod is not supported (products leave the wire range)"));
  }
  const size_t n = static_cast<size_t>(comm.size());
  if (kind == OpKind::kReduceScatter && in.count != out.count * n) {
    return absl::InvalidArgumentError(absl::StrCat("mixed reduce_scatter: input count ", in.count,
                                                   " != output count ", out.count, " x ", n));
  }
  if (kind == OpKind::kAllgather && out.count != in.count * n) {
    return absl::InvalidArgumentError(absl::StrCat("mixed allgather: output count ", out.count,
                                                   " != input count ", in.count, " x ", n));
  }
  if (opts.timeout.has_value() && *opts.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mixed ", name, ": timeout must be positive, got ", absl::FormatDuration(*opts.timeout)));
  }
  if (opts.context != nullptr && &opts.context->communicator() != &comm) {
    return absl::InvalidArgumentError(
        absl::StrCat("mixed ", name, ": the context belongs to another communicator"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MixedStats> MixedOpRunner::Run(Communicator& comm, OpKind kind, TensorView in,
                                              TensorView out, const MixedOptions& requested) {
  MixedOptions opts = requested;
  opts.overflow = ResolveOverflowPolicy(requested.overflow, comm);
  if (absl::Status s = Validate(comm, kind, in, out, opts); !s.ok()) return s;
  std::unique_ptr<MixedPrecisionContext> temporary;
  MixedPrecisionContext* ctx = opts.context;
  if (ctx == nullptr) {
    temporary = std::make_unique<MixedPrecisionContext>(comm);
    ctx = temporary.get();
  }
  MixedPrecisionContext::State& st = *ctx->state_;
  absl::MutexLock lock(&st.call_mu);
  MixedOpRunner runner(st, comm, kind, in, out, opts);
  runner.st.call_mu.AssertHeld();  // the same mutex, for the thread-safety analysis
  runner.seq = ++st.seq;
  if (in.device.is_cuda()) {
    return RunMixedOnDevice({&st.device, &comm, kind, in, out, &opts, runner.seq,
                             &runner.hook_failure,
                             [&](HookPoint p, DType w) { runner.CallHooks(p, w, nullptr, 0); }});
  }
  DType wire = opts.wire;
  bool resent = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<Outcome> outcome = wire == DType::kF32      ? runner.RunF32()
                                      : runner.Fuses(wire)     ? runner.RunFused(wire)
                                      : runner.Pipelines(wire) ? runner.RunPipelined(wire)
                                                               : runner.RunNarrow(wire);
    if (!outcome.ok()) return outcome.status();
    if (*outcome == Outcome::kDone) break;
    // A resend: the user's fp32 input is untouched (the cast back never ran), so start over.
    const MixedStats first = runner.stats;
    wire = *outcome == Outcome::kResendF32 ? DType::kF32 : DType::kBF16;
    resent = true;
    runner.stats = MixedStats{};
    runner.stats.cast_overflow = first.cast_overflow;
    runner.stats.global_cast_overflow = first.global_cast_overflow;
    runner.stats.nonfinite_inputs = first.nonfinite_inputs;
  }
  runner.stats.resent = resent;
  return runner.stats;
}

absl::StatusOr<MixedStats> AllreduceMixed(Communicator& comm, TensorView data,
                                          const MixedOptions& options) {
  return MixedOpRunner::Run(comm, OpKind::kAllreduce, data, data, options);
}
absl::StatusOr<MixedStats> ReduceScatterMixed(Communicator& comm, TensorView input,
                                              TensorView output, const MixedOptions& options) {
  return MixedOpRunner::Run(comm, OpKind::kReduceScatter, input, output, options);
}
absl::StatusOr<MixedStats> AllgatherMixed(Communicator& comm, TensorView input, TensorView output,
                                          const MixedOptions& options) {
  return MixedOpRunner::Run(comm, OpKind::kAllgather, input, output, options);
}

}  // namespace adaptcomm

// Mixed-precision collectives on the host: the fp32, narrow and fused paths of MixedOpRunner
// (mixed_runner.h). The agreement rule of mixed.cc holds for every path here.
#include "lib/precision/mixed_runner.h"

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

namespace adaptcomm {

void MixedOpRunner::CallHooks(HookPoint point, DType wire, const void* wire_data,
                              size_t wire_count) {
  HookInfo info;
  info.point = point;
  info.op = kind;
  info.wire = wire;
  info.count = input.count;
  info.seq = seq;
  info.rank = comm.rank();
  info.wire_data = wire_data;
  info.wire_count = wire_count;
  for (const HookHandle::Registry::Entry& e : st.hooks->Snapshot(point)) {
    try {
      (*e.fn)(info);
    } catch (const std::exception& ex) {
      if (hook_failure.ok()) {
        hook_failure =
            absl::AbortedError(absl::StrCat("mixed-precision hook '", e.name, "' at ",
                                            HookPointName(point), " threw: ", ex.what()));
      }
    } catch (...) {
      if (hook_failure.ok()) {
        hook_failure =
            absl::AbortedError(absl::StrCat("mixed-precision hook '", e.name, "' at ",
                                            HookPointName(point), " threw a non-std exception"));
      }
    }
  }
}

Work MixedOpRunner::Issue(TensorView in, TensorView out) {
  return IssueWireCollective(comm, kind, opts, in, out);
}

mixed::Fingerprint MixedOpRunner::MyFingerprint(DType wire) const {
  mixed::Fingerprint fp;
  fp.kind = kind;
  fp.op = opts.op;
  fp.wire = wire;
  fp.count_in = input.count;
  fp.count_out = output.count;
  fp.seq = seq;
  fp.hook_failed = !hook_failure.ok();
  fp.overflow = stats.cast_overflow;
  fp.nonfinite = stats.nonfinite_inputs;
  return fp;
}

absl::Status MixedOpRunner::Exchange(DType wire, bool* resend_needed) {
  const int n = comm.size();
  st.fp_local.assign(mixed::kFingerprintFields, 0);
  st.fp_all.assign(static_cast<size_t>(mixed::kFingerprintFields) * n, 0);
  mixed::Fingerprint fp = MyFingerprint(wire);
  mixed::EncodeFingerprint(fp, st.fp_local.data());
  AllgatherOptions ao;
  ao.timeout = opts.timeout;
  absl::Status s = comm.Allgather(HostView(st.fp_local.data(), st.fp_local.size()),
                                  HostView(st.fp_all.data(), st.fp_all.size()), ao)
                       .Wait();
  if (!s.ok()) return s;
  int64_t total_overflow = 0;
  if (absl::Status j = mixed::JudgeFingerprints(st.fp_all.data(), n, fp, hook_failure,
                                                opts.overflow, &total_overflow, resend_needed);
      !j.ok()) {
    return j;
  }
  stats.global_cast_overflow = total_overflow;
  return absl::OkStatus();
}

absl::StatusOr<MixedOpRunner::Outcome> MixedOpRunner::RunF32() {
  absl::Time t0 = absl::Now();
  if (opts.barrier == BarrierLevel::kGlobal) {
    bool unused_resend = false;
    absl::Status s = Exchange(DType::kF32, &unused_resend);
    if (!s.ok()) return s;
  }
  CallHooks(HookPoint::kBeforeCollective, DType::kF32, input.data, input.count);
  absl::Status s = Issue(input, output).Wait();
  if (!s.ok()) return s;
  CallHooks(HookPoint::kAfterCollective, DType::kF32, output.data, output.count);
  stats.collective_time = absl::Now() - t0;
  const float factor = Factor();
  if (factor != 1.0f) {
    float* out = static_cast<float*>(output.data);
    for (size_t i = 0; i < output.count; ++i) out[i] *= factor;
  }
  stats.wire_used = DType::kF32;
  if (!hook_failure.ok()) return hook_failure;
  return Outcome::kDone;
}

absl::Status MixedOpRunner::AccumulatedCollective(DType wire, uint16_t* wire_in, size_t block,
                                                  precision::CastJob* late_job, bool* output_done) {
  const size_t total = block * static_cast<size_t>(comm.size());
  if (st.wire_out.size() < total) st.wire_out.resize(total);
  AlltoallOptions ao;
  ao.timeout = opts.timeout;
  absl::Status s =
      comm.Alltoall(TensorView{wire_in, total, wire, Device::Cpu(), nullptr},
                    TensorView{st.wire_out.data(), total, wire, Device::Cpu(), nullptr}, ao)
          .Wait();
  if (late_job != nullptr) JoinLate(late_job, s);
  if (!s.ok()) return s;
  precision::CastRequest acc;
  acc.kind = wire == DType::kF16 ? precision::CastKind::kAccumulateF16
                                 : precision::CastKind::kAccumulateBF16;
  acc.src = st.wire_out.data();
  acc.blocks = comm.size();
  acc.block_stride = block;
  acc.count = block;
  acc.parallel_min_bytes = opts.parallel_cast_min_bytes;
  if (kind == OpKind::kReduceScatter) {
    acc.dst = output.data;
    if (absl::Status js = precision::StartCast(acc)->Join(); !js.ok()) return js;
    const float factor = Factor();
    if (factor != 1.0f) {
      float* out = static_cast<float*>(output.data);
      for (size_t i = 0; i < block; ++i) out[i] *= factor;
    }
    *output_done = true;
    return absl::OkStatus();
  }
  if (st.acc.size() < block) st.acc.resize(block);
  if (st.wire_block.size() < block) st.wire_block.resize(block);
  acc.dst = st.acc.data();
  if (absl::Status js = precision::StartCast(acc)->Join(); !js.ok()) return js;
  precision::CastRequest narrow;
  narrow.kind =
      wire == DType::kF16 ? precision::CastKind::kF32ToF16 : precision::CastKind::kF32ToBF16;
  narrow.src = st.acc.data();
  narrow.dst = st.wire_block.data();
  narrow.count = block;
  narrow.parallel_min_bytes = opts.parallel_cast_min_bytes;
  if (absl::Status js = precision::StartCast(narrow)->Join(); !js.ok()) return js;
  AllgatherOptions go;
  go.timeout = opts.timeout;
  return comm
      .Allgather(TensorView{st.wire_block.data(), block, wire, Device::Cpu(), nullptr},
                 TensorView{wire_in, total, wire, Device::Cpu(), nullptr}, go)
      .Wait();
}

void MixedOpRunner::JoinLate(precision::CastJob* job, absl::Status& status) {
  absl::Status js = job->Wait();
  if (status.ok()) status = js;
  stats.cast_overflow = job->stats().overflow;
  stats.nonfinite_inputs = job->stats().nonfinite_inputs;
}

bool MixedOpRunner::AccumulatesInF32() const {
  return opts.accumulate_fp32 && kind != OpKind::kAllgather &&
         (opts.op == ReduceOp::kSum || opts.op == ReduceOp::kAvg);
}

absl::StatusOr<MixedOpRunner::Outcome> MixedOpRunner::CheckReductionOverflow(
    const uint16_t* wire_out, size_t count) {
  size_t nonfinite = 0;
  for (size_t i = 0; i < count; ++i) nonfinite += (wire_out[i] & 0x7c00u) == 0x7c00u;
  if (nonfinite == 0 || AnyNonfiniteInput()) return Outcome::kDone;
  stats.result_nonfinite = nonfinite;
  if (opts.overflow == OverflowPolicy::kFail) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16 wire overflow in mixed allreduce seq ", seq, ": the fp16 sum of ", nonfinite,
        " elements exceeds 65504; policy=fail. Use a bf16 wire or a resend policy"));
  }
  return opts.overflow == OverflowPolicy::kResendF32 ? Outcome::kResendF32 : Outcome::kResendBF16;
}

absl::StatusOr<MixedOpRunner::Outcome> MixedOpRunner::RunNarrow(DType wire) {
  const bool fp32_acc = AccumulatesInF32();
  const size_t in_count = WireInCount();
  const size_t out_count = WireOutCount();
  const size_t n = static_cast<size_t>(comm.size());
  // The fp32-accumulating allreduce splits the buffer into size() equal blocks (zero padded).
  const size_t block = kind == OpKind::kAllreduce ? (in_count + n - 1) / n : out_count;
  const size_t padded = fp32_acc ? block * n : in_count;
  if (st.wire_in.size() < padded) st.wire_in.resize(padded);
  if (!fp32_acc && st.wire_out.size() < out_count) st.wire_out.resize(out_count);
  uint16_t* wire_in = st.wire_in.data();
  uint16_t* result = kind == OpKind::kAllreduce ? wire_in : st.wire_out.data();
  const size_t result_count = kind == OpKind::kAllreduce ? in_count : out_count;
  std::fill(wire_in + in_count, wire_in + padded, uint16_t{0});
  stats.wire_used = wire;

  // 1. cast
  const absl::Time t0 = absl::Now();
  CallHooks(HookPoint::kBeforeCast, wire, wire_in, in_count);
  precision::CastRequest req;
  req.kind = wire == DType::kF16 ? precision::CastKind::kF32ToF16 : precision::CastKind::kF32ToBF16;
  req.src = input.data;
  req.dst = wire_in;
  req.count = in_count;
  req.parallel_min_bytes = opts.parallel_cast_min_bytes;
  req.debug_delay = opts.debug_cast_delay;
  std::shared_ptr<precision::CastJob> job = precision::StartCast(req);
  // 2. host barrier: every chunk written before anything reads wire_in.
  if (!opts.debug_skip_host_barrier) {
    absl::Status s = job->Join();
    if (!s.ok()) return s;
    stats.cast_overflow = job->stats().overflow;
    stats.nonfinite_inputs = job->stats().nonfinite_inputs;
  }
  CallHooks(HookPoint::kAfterCast, wire, wire_in, in_count);
  const absl::Time t1 = absl::Now();
  stats.cast_time = t1 - t0;

  // 3. global barrier / agreement
  const bool guard = wire == DType::kF16 && opts.overflow != OverflowPolicy::kReport;
  if (opts.barrier == BarrierLevel::kGlobal || guard) {
    bool resend = false;
    absl::Status s = Exchange(wire, &resend);
    if (!s.ok()) {
      (void)job->Wait();  // never leave a cast writing into scratch
      return s;
    }
    if (resend) {
      (void)job->Wait();
      return opts.overflow == OverflowPolicy::kResendF32 ? Outcome::kResendF32
                                                         : Outcome::kResendBF16;
    }
  }

  // 4. collective on the wire dtype
  CallHooks(HookPoint::kBeforeCollective, wire, wire_in, in_count);
  precision::CastJob* late = opts.debug_skip_host_barrier ? job.get() : nullptr;
  bool output_done = false;
  absl::Status cs;
  if (fp32_acc) {
    cs = AccumulatedCollective(wire, wire_in, block, late, &output_done);
  } else {
    cs = Issue(TensorView{wire_in, in_count, wire, Device::Cpu(), nullptr},
               TensorView{result, result_count, wire, Device::Cpu(), nullptr})
             .Wait();
    if (late != nullptr) JoinLate(late, cs);
  }
  if (!cs.ok()) return cs;
  // 5. barrier after the collective: its Work completed (host); every rank done (global).
  if (opts.barrier == BarrierLevel::kGlobal) {
    BarrierOptions bo;
    bo.timeout = opts.timeout;
    absl::Status bs = comm.Barrier(bo).Wait();
    if (!bs.ok()) return bs;
  }
  CallHooks(HookPoint::kAfterCollective, wire, output_done ? nullptr : result,
            output_done ? 0 : result_count);
  const absl::Time t2 = absl::Now();
  stats.collective_time = t2 - t1;
  if (output_done) {  // reduce_scatter summed straight into the fp32 output
    if (!hook_failure.ok()) return hook_failure;
    return Outcome::kDone;
  }
  uint16_t* wire_out = result;

  // 6. overflow of the fp16 reduction itself. Only for allreduce: its result is identical on
  // every rank, so every rank takes the same decision without another exchange.
  if (guard && kind == OpKind::kAllreduce && stats.global_cast_overflow == 0) {
    absl::StatusOr<Outcome> checked = CheckReductionOverflow(wire_out, result_count);
    if (!checked.ok() || *checked != Outcome::kDone) return checked;
  }

  // 7. cast back, scale in fp32
  precision::CastRequest back;
  back.kind =
      wire == DType::kF16 ? precision::CastKind::kF16ToF32 : precision::CastKind::kBF16ToF32;
  back.src = wire_out;
  back.dst = output.data;
  back.count = result_count;
  back.scale = Factor();
  back.stream_stores = StreamsStores(result_count);
  back.parallel_min_bytes = opts.parallel_cast_min_bytes;
  std::shared_ptr<precision::CastJob> bj = precision::StartCast(back);
  absl::Status bs = bj->Join();
  if (!bs.ok()) return bs;
  stats.result_nonfinite = bj->stats().nonfinite_inputs;
  stats.cast_back_time = absl::Now() - t2;
  if (!hook_failure.ok()) return hook_failure;
  return Outcome::kDone;
}

size_t MixedOpRunner::PipelineChunk(DType wire) const {
  const size_t n = static_cast<size_t>(comm.size());
  if (kind != OpKind::kAllreduce || !AccumulatesInF32() || n < 2) return 0;
  if (opts.barrier == BarrierLevel::kGlobal) return 0;
  if (wire == DType::kF16 && opts.overflow != OverflowPolicy::kReport) return 0;
  if (opts.pipeline_chunk_bytes == 0) return SIZE_MAX;
  const size_t align = n * 256;
  return std::max<size_t>(1, opts.pipeline_chunk_bytes / sizeof(float) / align) * align;
}

bool MixedOpRunner::Fuses(DType wire) const {
  return Pipelines(wire) && comm.capabilities().wire_cast && st.hooks->Empty() &&
         !opts.debug_skip_host_barrier && opts.debug_cast_delay == absl::ZeroDuration();
}

absl::StatusOr<MixedOpRunner::Outcome> MixedOpRunner::RunFused(DType wire) {
  stats.wire_used = wire;
  OpDesc d;
  d.kind = OpKind::kAllreduce;
  d.input = output;
  d.output = output;
  d.reduce = ReduceOp::kSum;
  d.wire = wire;
  d.wire_scale = Factor();
  WireStats ws;
  d.wire_stats = &ws;
  const absl::Time t0 = absl::Now();
  if (absl::Status s = internal::SubmitOp(comm, std::move(d), opts.timeout).Wait(); !s.ok())
    return s;
  stats.collective_time = absl::Now() - t0;
  stats.cast_overflow = ws.cast_overflow;
  stats.nonfinite_inputs = ws.nonfinite_inputs;
  stats.result_nonfinite = ws.result_nonfinite;
  return Outcome::kDone;
}

bool MixedOpRunner::AnyNonfiniteInput() const {
  return mixed::AnyNonfiniteInput(st.fp_all.data(), comm.size());
}

}  // namespace adaptcomm

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

namespace adaptcomm {

// ---- the runner ----

namespace {}  // namespace

struct MixedOpRunner {
  enum class Outcome { kDone, kResendBF16, kResendF32 };
  static absl::StatusOr<MixedStats> Run(Communicator& comm, OpKind kind, TensorView in,
                                        TensorView out, const MixedOptions& opts);

  MixedOpRunner(MixedPrecisionContext::State& state, Communicator& c, OpKind k, TensorView in,
                TensorView out, const MixedOptions& o)
      : st(state), comm(c), kind(k), input(in), output(out), opts(o) {}

  MixedPrecisionContext::State& st;
  Communicator& comm;
  const OpKind kind;
  const TensorView input;
  const TensorView output;
  const MixedOptions& opts;
  uint64_t seq = 0;
  MixedStats stats;
  absl::Status hook_failure;

  void CallHooks(HookPoint point, DType wire, const void* wire_data, size_t wire_count) {
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

  size_t WireInCount() const { return input.count; }
  size_t WireOutCount() const { return kind == OpKind::kAllreduce ? 0 : output.count; }

  Work Issue(TensorView in, TensorView out) {
    return IssueWireCollective(comm, kind, opts, in, out);
  }

  float Factor() const { return MixedFactor(kind, opts, comm.size()); }

  mixed::Fingerprint MyFingerprint(DType wire) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu) {
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

  // The fingerprint allgather: mismatch, remote failures, global counts. Same result on all ranks.
  absl::Status Exchange(DType wire, bool* resend_needed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu) {
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

  absl::StatusOr<Outcome> RunF32() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu) {
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

  // Alltoall of wire blocks, an fp32 sum of the `size()` blocks this rank owns, then for allreduce
  // the sum rounded once to the wire dtype and allgathered into wire_in; for reduce_scatter the
  // sum scaled straight into the fp32 output. Same bytes on the wire as a ring allreduce.
  absl::Status AccumulatedCollective(DType wire, uint16_t* wire_in, size_t block,
                                     precision::CastJob* late_job, bool* output_done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu) {
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

  // The test knob's late join: the cast threads are waited for only after the collective read.
  void JoinLate(precision::CastJob* job, absl::Status& status) {
    absl::Status js = job->Wait();
    if (status.ok()) status = js;
    stats.cast_overflow = job->stats().overflow;
    stats.nonfinite_inputs = job->stats().nonfinite_inputs;
  }

  bool AccumulatesInF32() const {
    return opts.accumulate_fp32 && kind != OpKind::kAllgather &&
           (opts.op == ReduceOp::kSum || opts.op == ReduceOp::kAvg);
  }

  // Step 6 of RunNarrow: the fp16 elements of an allreduce's result that overflowed, where no
  // input was already non-finite. kDone: none; else a resend outcome, or an error under policy
  // fail.
  absl::StatusOr<Outcome> CheckReductionOverflow(const uint16_t* wire_out, size_t count) {
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

  absl::StatusOr<Outcome> RunNarrow(DType wire) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu) {
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
    req.kind =
        wire == DType::kF16 ? precision::CastKind::kF32ToF16 : precision::CastKind::kF32ToBF16;
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

  // Whether an op on `count` fp32 writes its large buffers - the cast back into the output, and on
  // the split path the wire blocks that only the socket copy reads next - with non-temporal
  // stores: buffers this large do not stay in cache anyway, and streaming spares the read of every
  // cold destination line. Measured on 2 cores with 2 ranks casting at once: 32 MiB widened
  // 2.9 -> 1.9 ms, 8M elements narrowed 5-6 -> 1.6-2.3 ms.
  static bool StreamsStores(size_t count) { return count * sizeof(float) >= (size_t{16} << 20); }

  // The chunk size of the split allreduce below (a multiple of size() * 256 elements; SIZE_MAX:
  // one chunk), or 0 when this op takes RunNarrow. Only options decide (every rank passes the
  // same), never hooks, which are per rank: the ranks must issue the same collectives.
  size_t PipelineChunk(DType wire) const {
    const size_t n = static_cast<size_t>(comm.size());
    if (kind != OpKind::kAllreduce || !AccumulatesInF32() || n < 2) return 0;
    if (opts.barrier == BarrierLevel::kGlobal) return 0;
    if (wire == DType::kF16 && opts.overflow != OverflowPolicy::kReport) return 0;
    if (opts.pipeline_chunk_bytes == 0) return SIZE_MAX;
    const size_t align = n * 256;
    return std::max<size_t>(1, opts.pipeline_chunk_bytes / sizeof(float) / align) * align;
  }
  bool Pipelines(DType wire) const { return PipelineChunk(wire) != 0; }

  // Whether the backend runs this op whole (OpDesc::wire, Capabilities::wire_cast: shared memory),
  // its casts being the copies into and out of the transport: the split allreduce's cases (same
  // result bits), without hooks (they would see no wire buffer) or test knobs. Hooks are per rank,
  // yet a rank with hooks still issues one allreduce per op, as its peers do: the collective
  // sequence is the same either way.
  bool Fuses(DType wire) const {
    return Pipelines(wire) && comm.capabilities().wire_cast && st.hooks->Empty() &&
           !opts.debug_skip_host_barrier && opts.debug_cast_delay == absl::ZeroDuration();
  }

  // One allreduce of the fp32 buffer over a `wire` wire inside the backend. No barrier is needed:
  // a peer reads this rank's wire data only after the backend published it, cast complete.
  absl::StatusOr<Outcome> RunFused(DType wire) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu) {
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

  // The fp32-accumulating allreduce in chunks (one chunk for buffers up to pipeline_chunk_bytes).
  // Chunk k (input elements [k*chunk, +len)) is split into size() blocks of B = ceil(len/n):
  //   1. the blocks other ranks own are cast (host barrier: joined) and exchanged - an alltoall,
  //      or for two ranks an in-place allgather (no local copy) in which each rank contributes
  //      the block its peer owns; this rank's own block is not cast on its own;
  //   2. one fused pass (fused_kernels.h) over the block this rank owns: the fp32 sum in rank order
  //      of the received blocks and of this rank's input rounded to the wire in registers, the sum
  //      rounded once straight into this rank's slot of the exchange's output (from which an
  //      in-place allgather sends it) and widened, scaled, into the own part of the output;
  //   3. the other blocks of the output are cast back when the allgather is done.
  // Same result bits as RunNarrow (which casts every block first, then sums and rounds). With
  // several chunks the caller works on neighbouring chunks while the communicator transfers;
  // issue order (the same on every rank) is X0 X1 G0 X2 G1 ...
  // A rank with hooks registered issues the same collectives but casts the whole buffer into
  // wire_in (natural order) first and casts back at the end, so its hooks see whole-buffer stages
  // exactly as in RunNarrow.
  absl::StatusOr<Outcome> RunPipelined(DType wire) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu);
  struct PipelinedRun;  // RunPipelined's per-call state and steps (below)

  // Whether any rank had a NaN/Inf input: fingerprints hold every rank's count.
  bool AnyNonfiniteInput() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return mixed::AnyNonfiniteInput(st.fp_all.data(), comm.size());
  }
};

// One call of MixedOpRunner::RunPipelined: the sizes, pointers, pending collectives and casts
// and timings its steps share. Steps 1-3 are those of RunPipelined's comment.
struct MixedOpRunner::PipelinedRun {
  using Jobs = std::vector<std::shared_ptr<precision::CastJob>>;

  // wire_in_scratch, wire_out_scratch: the context's scratch (st.wire_in, st.wire_out), grown to
  // the padded size.
  PipelinedRun(MixedOpRunner& runner, DType w, std::vector<uint16_t>& wire_in_scratch,
               std::vector<uint16_t>& wire_out_scratch)
      : m(runner),
        comm(runner.comm),
        opts(runner.opts),
        stats(runner.stats),
        wire(w),
        n(static_cast<size_t>(comm.size())),
        r(static_cast<size_t>(comm.rank())),
        count(runner.input.count),
        chunk(std::min(runner.PipelineChunk(w), (count + n - 1) / n * n)),
        chunks((count + chunk - 1) / chunk),
        padded((chunks - 1) * chunk + BlockOf(chunks - 1) * n),
        f16(w == DType::kF16),
        pair(n == 2),
        hooked(!runner.st.hooks->Empty()),
        path(precision::ActiveCastPath()),
        factor(runner.Factor()),
        in(static_cast<const float*>(runner.input.data)),
        out(static_cast<float*>(runner.output.data)),
        wire_in(Grown(wire_in_scratch, padded)),
        wire_out(Grown(wire_out_scratch, padded)),
        result(hooked || pair ? wire_in : wire_out),
        stable_exchange(pair || !hooked),
        cast_threads(std::max(
            1, static_cast<int>(std::thread::hardware_concurrency() / static_cast<unsigned>(n)))),
        debug_knobs(opts.debug_skip_host_barrier || opts.debug_cast_delay != absl::ZeroDuration()),
        exchange(chunks),
        allgather(chunks),
        blocks(n) {}

  static uint16_t* Grown(std::vector<uint16_t>& v, size_t size) {
    if (v.size() < size) v.resize(size);
    return v.data();
  }

  size_t LenOf(size_t k) const { return std::min(chunk, count - k * chunk); }
  size_t BlockOf(size_t k) const { return (LenOf(k) + n - 1) / n; }
  // Elements of block j of chunk k that hold input (the rest is zero padding).
  size_t RealOf(size_t k, size_t j) const {
    const size_t b = BlockOf(k), len = LenOf(k);
    return std::min(b, len > j * b ? len - j * b : 0);
  }
  TensorView WireView(uint16_t* q, size_t c) const {
    return TensorView{q, c, wire, Device::Cpu(), nullptr};
  }

  // Every issued collective and cast is waited for before returning, also on failure: they read
  // and write the context's scratch.
  absl::Status Drain(absl::Status s) {
    for (auto& job : late) (void)job->Wait();
    for (size_t k = 0; k < chunks; ++k) {
      for (Work* w : {&exchange[k], &allgather[k]}) {
        if (w->valid()) (void)w->Wait();
      }
    }
    return s;
  }

  // A cast of c elements between the wire and fp32 on cast_threads threads.
  precision::CastRequest Request(precision::CastKind kind, const void* src, void* dst,
                                 size_t c) const {
    precision::CastRequest q;
    q.stream_stores = StreamsStores(count);
    q.threads = cast_threads;
    q.kind = kind;
    q.src = src;
    q.dst = dst;
    q.count = c;
    q.parallel_min_bytes = opts.parallel_cast_min_bytes;
    return q;
  }
  precision::CastRequest NarrowRequest(const float* src, uint16_t* dst, size_t c) const {
    precision::CastRequest q = Request(
        f16 ? precision::CastKind::kF32ToF16 : precision::CastKind::kF32ToBF16, src, dst, c);
    q.debug_delay = opts.debug_cast_delay;
    return q;
  }
  precision::CastRequest WidenRequest(const uint16_t* src, float* dst, size_t c) const {
    precision::CastRequest q = Request(
        f16 ? precision::CastKind::kF16ToF32 : precision::CastKind::kBF16ToF32, src, dst, c);
    q.scale = factor;
    return q;
  }
  std::shared_ptr<precision::CastJob> StartCastJob(const precision::CastRequest& q) const {
    return q.threads == 1 && !debug_knobs ? precision::RunOnCaller(q) : precision::StartCast(q);
  }
  void AddStats(const CastStats& cs) {
    stats.cast_overflow += cs.overflow;
    stats.nonfinite_inputs += cs.nonfinite_inputs;
  }
  // The host barrier: every cast thread done before the collective that reads its output is
  // issued - unless the test knob defers the join until after the collective read.
  absl::Status HostBarrier(Jobs& jobs) {
    for (auto& job : jobs) {
      if (opts.debug_skip_host_barrier) {
        late.push_back(job);
        continue;
      }
      if (absl::Status s = job->Join(); !s.ok()) return s;
      AddStats(job->stats());
    }
    return absl::OkStatus();
  }
  absl::Status JoinLateJobs() {
    for (auto& job : late) {
      if (absl::Status s = job->Wait(); !s.ok()) return s;
      AddStats(job->stats());
    }
    late.clear();
    return absl::OkStatus();
  }

  // 1.
  absl::Status Prepare(size_t k) {
    const absl::Time c0 = absl::Now();
    const size_t b = BlockOf(k);
    // Where this rank's contribution to the exchange sits: the blocks in destination order for
    // the alltoall; for the pair, the peer's block at this rank's slot of wire_out (in place).
    uint16_t* send = hooked || !pair ? wire_in + k * chunk : wire_out + k * chunk;
    if (!hooked) {
      Jobs jobs;
      for (size_t j = 0; j < n; ++j) {
        if (j == r) continue;
        const size_t real = RealOf(k, j);
        uint16_t* dst = send + (pair ? r : j) * b;
        std::fill(dst + real, dst + b, uint16_t{0});
        if (real > 0)
          jobs.push_back(StartCastJob(NarrowRequest(in + k * chunk + j * b, dst, real)));
      }
      if (absl::Status s = HostBarrier(jobs); !s.ok()) return s;
    }
    if (pair) {
      AllgatherOptions go;
      go.timeout = opts.timeout;
      go.stable_input = stable_exchange;
      // Hooked: the peer's block is in natural order in wire_in; Gloo copies it into the slot.
      uint16_t* contribution = hooked ? send + (1 - r) * b : send + r * b;
      exchange[k] =
          comm.Allgather(WireView(contribution, b), WireView(wire_out + k * chunk, b * n), go);
    } else {
      AlltoallOptions ao;
      ao.timeout = opts.timeout;
      ao.stable_input = stable_exchange;
      exchange[k] = comm.Alltoall(WireView(send, b * n), WireView(wire_out + k * chunk, b * n), ao);
    }
    cast_time += absl::Now() - c0;
    return absl::OkStatus();
  }

  // 2. One pass (fused_kernels.h): the fp32 sum in rank order of the received blocks and this
  // rank's own contribution - its fp32 input rounded to the wire in registers, or with hooks
  // the block they saw in wire_in - rounded once into this rank's slot of `result` (what the
  // allgather sends) and, without hooks, widened into the output.
  absl::Status Reduce(size_t k) {
    absl::Status s = exchange[k].Wait();
    if (absl::Status js = JoinLateJobs(); s.ok()) s = js;
    if (!s.ok()) return s;
    const size_t b = BlockOf(k);
    const size_t real = RealOf(k, r);
    const uint16_t* recv = wire_out + k * chunk;
    uint16_t* sum = result + k * chunk + r * b;  // hooked: also the own block (read first)
    for (size_t j = 0; j < n; ++j) blocks[j] = recv + j * b;
    precision::ReduceRoundArgs a;
    a.blocks = blocks.data();
    a.n = static_cast<int>(n);
    a.self = static_cast<int>(r);
    if (hooked) {
      blocks[r] = sum;
    } else {
      a.own = in + k * chunk + r * b;
      a.out = out + k * chunk + r * b;
    }
    a.sum = sum;
    a.count = real;  // the padding sums zeros to zero
    a.scale = factor;
    a.stream_sum = StreamsStores(count);
    const precision::ReduceRoundStats rs =
        f16 ? precision::ReduceRoundF16(path, a) : precision::ReduceRoundBF16(path, a);
    std::fill(sum + real, sum + b, uint16_t{0});
    AddStats(rs.own);
    if (a.out != nullptr) stats.result_nonfinite += rs.result_nonfinite;
    AllgatherOptions go;
    go.timeout = opts.timeout;
    allgather[k] = comm.Allgather(WireView(sum, b), WireView(result + k * chunk, b * n), go);
    return absl::OkStatus();
  }

  // 3.
  absl::Status CastBack(size_t k) {
    if (absl::Status s = allgather[k].Wait(); !s.ok()) return s;
    if (hooked) return absl::OkStatus();  // at the end, after the after_collective hooks
    const absl::Time b0 = absl::Now();
    const size_t b = BlockOf(k);
    Jobs jobs;
    for (size_t j = 0; j < n; ++j) {
      const size_t real = RealOf(k, j);
      if (j == r || real == 0) continue;
      jobs.push_back(
          StartCastJob(WidenRequest(result + k * chunk + j * b, out + k * chunk + j * b, real)));
    }
    for (auto& job : jobs) {
      if (absl::Status s = job->Join(); !s.ok()) return s;
      stats.result_nonfinite += job->stats().nonfinite_inputs;
    }
    back_time += absl::Now() - b0;
    return absl::OkStatus();
  }

  // The whole op: with hooks the whole cast first, then the chunks in the issue order X0 X1 G0 X2
  // G1 ..., then with hooks the whole cast back; the timings into stats.
  absl::Status Run() {
    const absl::Time t0 = absl::Now();
    if (hooked) {  // the whole cast first, in natural order, as RunNarrow
      m.CallHooks(HookPoint::kBeforeCast, wire, wire_in, count);
      std::fill(wire_in + count, wire_in + padded, uint16_t{0});
      Jobs jobs = {precision::StartCast(NarrowRequest(in, wire_in, count))};
      if (absl::Status s = HostBarrier(jobs); !s.ok()) return Drain(s);
      m.CallHooks(HookPoint::kAfterCast, wire, wire_in, count);
      cast_time = absl::Now() - t0;
      m.CallHooks(HookPoint::kBeforeCollective, wire, wire_in, count);
    }
    if (absl::Status s = Prepare(0); !s.ok()) return Drain(s);
    for (size_t k = 0; k < chunks; ++k) {
      if (k + 1 < chunks) {
        if (absl::Status s = Prepare(k + 1); !s.ok()) return Drain(s);
      }
      if (absl::Status s = Reduce(k); !s.ok()) return Drain(s);
      if (k > 0) {
        if (absl::Status s = CastBack(k - 1); !s.ok()) return Drain(s);
      }
    }
    if (absl::Status s = CastBack(chunks - 1); !s.ok()) return Drain(s);
    if (hooked) {
      // wire_in now holds the reduced wire data in natural order (padding only after `count`).
      m.CallHooks(HookPoint::kAfterCollective, wire, wire_in, count);
      const absl::Time b0 = absl::Now();
      std::shared_ptr<precision::CastJob> job =
          precision::StartCast(WidenRequest(wire_in, out, count));
      if (absl::Status s = job->Join(); !s.ok()) return s;
      stats.result_nonfinite = job->stats().nonfinite_inputs;
      back_time = absl::Now() - b0;
    }
    stats.cast_time = cast_time;
    stats.cast_back_time = back_time;
    stats.collective_time = absl::Now() - t0 - cast_time - back_time;
    return absl::OkStatus();
  }

  MixedOpRunner& m;
  Communicator& comm;
  const MixedOptions& opts;
  MixedStats& stats;
  const DType wire;
  const size_t n;
  const size_t r;
  const size_t count;
  const size_t chunk;
  const size_t chunks;
  const size_t padded;
  const bool f16;
  const bool pair;
  const bool hooked;
  const precision::CastPath path;
  const float factor;
  const float* const in;
  float* const out;
  uint16_t* const wire_in;
  uint16_t* const wire_out;
  // Where the sums are allgathered in place. With hooks wire_in, whose natural order the
  // after_collective hooks see. Two ranks: wire_in too, so that the exchange's input (this
  // rank's slot of wire_out) stays untouched until the call returns and the exchange can skip
  // the retry's copy of its input (stable_input: ~4% of this op's time on 2 cores). More ranks
  // without hooks: wire_out, over the exchange's blocks the sum has consumed (the alltoall reads
  // wire_in, which then stays untouched).
  uint16_t* const result;
  // Exchange inputs the sums never overwrite (all but the hooked alltoall's).
  const bool stable_exchange;
  // Ranks of a CPU collective usually share the host: splitting a cast over more threads than
  // cores per rank only steals the cores that run the transfer (measured on 2 cores, 2 ranks:
  // single-threaded casts made this op 10-15% faster).
  const int cast_threads;
  // A single-threaded cast runs on this thread: handing it to a pool worker only adds two
  // wake-ups while this thread waits. Not with the test knobs: their casts stay pool jobs, so the
  // ordering tests exercise the host barrier on asynchronous casts (and, without it, the race).
  const bool debug_knobs;
  std::vector<Work> exchange, allgather;
  std::vector<const uint16_t*> blocks;
  Jobs late;
  absl::Duration cast_time, back_time;
};

absl::StatusOr<MixedOpRunner::Outcome> MixedOpRunner::RunPipelined(DType wire) {
  PipelinedRun run(*this, wire, st.wire_in, st.wire_out);
  stats.wire_used = wire;
  if (absl::Status s = run.Run(); !s.ok()) return s;
  if (!hook_failure.ok()) return hook_failure;
  return Outcome::kDone;
}

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

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
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/precision.h"
#include "lib/precision/cast_parallel.h"

namespace adaptcomm {

// ---- names ----

const char* BarrierLevelName(BarrierLevel level) {
  switch (level) {
    case BarrierLevel::kHost:
      return "host";
    case BarrierLevel::kGlobal:
      return "global";
    case BarrierLevel::kStream:
      return "stream";
  }
  return "unknown-barrier";
}

const char* OverflowPolicyName(OverflowPolicy policy) {
  switch (policy) {
    case OverflowPolicy::kReport:
      return "report";
    case OverflowPolicy::kFail:
      return "fail";
    case OverflowPolicy::kResendBF16:
      return "resend_bf16";
    case OverflowPolicy::kResendF32:
      return "resend_f32";
  }
  return "unknown-policy";
}

const char* HookPointName(HookPoint point) {
  switch (point) {
    case HookPoint::kBeforeCast:
      return "before_cast";
    case HookPoint::kAfterCast:
      return "after_cast";
    case HookPoint::kBeforeCollective:
      return "before_collective";
    case HookPoint::kAfterCollective:
      return "after_collective";
  }
  return "unknown-hook-point";
}

// ---- hooks ----

struct HookHandle::Registry {
  struct Entry {
    uint64_t id;
    HookPoint point;
    std::string name;
    std::shared_ptr<const MixedHook> fn;
  };
  absl::Mutex mu;
  std::vector<Entry> entries ABSL_GUARDED_BY(mu);
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;

  std::vector<Entry> Snapshot(HookPoint point) {
    absl::MutexLock lock(&mu);
    std::vector<Entry> out;
    for (const Entry& e : entries)
      if (e.point == point) out.push_back(e);
    return out;
  }
};

HookHandle::HookHandle(std::weak_ptr<Registry> registry, uint64_t id)
    : registry_(std::move(registry)), id_(id) {}
HookHandle::HookHandle(HookHandle&& other) noexcept
    : registry_(std::move(other.registry_)), id_(other.id_) {
  other.id_ = 0;
}
HookHandle& HookHandle::operator=(HookHandle&& other) noexcept {
  if (this != &other) {
    Remove();
    registry_ = std::move(other.registry_);
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}
HookHandle::~HookHandle() { Remove(); }

void HookHandle::Remove() {
  if (id_ == 0) return;
  if (std::shared_ptr<Registry> reg = registry_.lock()) {
    absl::MutexLock lock(&reg->mu);
    reg->entries.erase(std::remove_if(reg->entries.begin(), reg->entries.end(),
                                      [this](const Registry::Entry& e) { return e.id == id_; }),
                       reg->entries.end());
  }
  id_ = 0;
  registry_.reset();
}

bool HookHandle::active() const { return id_ != 0 && !registry_.expired(); }

// ---- context ----

struct MixedPrecisionContext::State {
  Communicator* comm = nullptr;
  std::shared_ptr<HookHandle::Registry> hooks = std::make_shared<HookHandle::Registry>();
  absl::Mutex call_mu;  // one mixed op at a time per context
  uint64_t seq ABSL_GUARDED_BY(call_mu) = 0;
  // Scratch: the wire data this rank sends, and what it receives when that differs in size.
  std::vector<uint16_t> wire_in ABSL_GUARDED_BY(call_mu);
  std::vector<uint16_t> wire_out ABSL_GUARDED_BY(call_mu);
  std::vector<float> acc ABSL_GUARDED_BY(call_mu);            // fp32 sums of this rank's block
  std::vector<uint16_t> wire_block ABSL_GUARDED_BY(call_mu);  // the sums rounded to the wire
  std::vector<int64_t> fp_local ABSL_GUARDED_BY(call_mu);
  std::vector<int64_t> fp_all ABSL_GUARDED_BY(call_mu);
};

MixedPrecisionContext::MixedPrecisionContext(Communicator& comm)
    : state_(std::make_unique<State>()) {
  state_->comm = &comm;
}
MixedPrecisionContext::~MixedPrecisionContext() = default;

Communicator& MixedPrecisionContext::communicator() const { return *state_->comm; }

HookHandle MixedPrecisionContext::AddHook(HookPoint point, std::string name, MixedHook hook) {
  HookHandle::Registry& reg = *state_->hooks;
  absl::MutexLock lock(&reg.mu);
  const uint64_t id = reg.next_id++;
  reg.entries.push_back(
      {id, point, std::move(name), std::make_shared<const MixedHook>(std::move(hook))});
  return HookHandle(state_->hooks, id);
}

void MixedPrecisionContext::Reserve(size_t max_count) {
  absl::MutexLock lock(&state_->call_mu);
  // resize() value-initializes: the pages are touched now, not inside the first timed op.
  if (state_->wire_in.size() < max_count) state_->wire_in.resize(max_count);
}

// ---- the runner ----

namespace {

constexpr int64_t kFingerprintMagic = 0x4d49584450524543;  // "MIXDPREC"
enum FingerprintField : int {
  kFpMagic,
  kFpKind,
  kFpOp,
  kFpWire,
  kFpCountIn,
  kFpCountOut,
  kFpSeq,
  kFpFailed,  // 1: a hook of this rank threw before the collective
  kFpOverflow,
  kFpNonfinite,
  kFpFields,
};

std::string DescribeFingerprint(const int64_t* f) {
  return absl::StrCat(OpKindName(static_cast<OpKind>(f[kFpKind])), " ",
                      ReduceOpName(static_cast<ReduceOp>(f[kFpOp])),
                      " wire=", DTypeName(static_cast<DType>(f[kFpWire])), " count=", f[kFpCountIn],
                      "->", f[kFpCountOut], " seq=", f[kFpSeq]);
}

}  // namespace

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
    switch (kind) {
      case OpKind::kAllreduce: {
        AllreduceOptions o;
        o.op = opts.op == ReduceOp::kAvg ? ReduceOp::kSum : opts.op;
        o.timeout = opts.timeout;
        return comm.Allreduce(in, o);
      }
      case OpKind::kReduceScatter: {
        ReduceScatterOptions o;
        o.op = opts.op == ReduceOp::kAvg ? ReduceOp::kSum : opts.op;
        o.timeout = opts.timeout;
        return comm.ReduceScatter(in, out, o);
      }
      default: {
        AllgatherOptions o;
        o.timeout = opts.timeout;
        return comm.Allgather(in, out, o);
      }
    }
  }

  float Factor() const {
    if (kind == OpKind::kAllgather) return 1.0f;
    return opts.op == ReduceOp::kAvg ? opts.scale / static_cast<float>(comm.size()) : opts.scale;
  }

  // The fingerprint allgather: mismatch, remote failures, global counts. Same result on all ranks.
  absl::Status Exchange(DType wire, bool* resend_needed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu) {
    const int n = comm.size();
    st.fp_local.assign(kFpFields, 0);
    st.fp_all.assign(static_cast<size_t>(kFpFields) * n, 0);
    int64_t* f = st.fp_local.data();
    f[kFpMagic] = kFingerprintMagic;
    f[kFpKind] = static_cast<int64_t>(kind);
    f[kFpOp] = static_cast<int64_t>(kind == OpKind::kAllgather ? ReduceOp::kSum : opts.op);
    f[kFpWire] = static_cast<int64_t>(wire);
    f[kFpCountIn] = static_cast<int64_t>(input.count);
    f[kFpCountOut] = static_cast<int64_t>(output.count);
    f[kFpSeq] = static_cast<int64_t>(seq);
    f[kFpFailed] = hook_failure.ok() ? 0 : 1;
    f[kFpOverflow] = static_cast<int64_t>(stats.cast_overflow);
    f[kFpNonfinite] = static_cast<int64_t>(stats.nonfinite_inputs);
    AllgatherOptions ao;
    ao.timeout = opts.timeout;
    absl::Status s = comm.Allgather(HostView(st.fp_local.data(), st.fp_local.size()),
                                    HostView(st.fp_all.data(), st.fp_all.size()), ao)
                         .Wait();
    if (!s.ok()) return s;
    const int64_t* ref = st.fp_all.data();
    std::vector<std::string> differ, failed, overflowed;
    int64_t total_overflow = 0;
    for (int r = 0; r < n; ++r) {
      const int64_t* g = st.fp_all.data() + static_cast<size_t>(r) * kFpFields;
      bool same = g[kFpMagic] == kFingerprintMagic;
      for (int k = kFpKind; k <= kFpSeq; ++k) same = same && g[k] == ref[k];
      if (!same) {
        differ.push_back(g[kFpMagic] == kFingerprintMagic
                             ? absl::StrCat("rank ", r, " has {", DescribeFingerprint(g), "}")
                             : absl::StrCat("rank ", r, " is not in a mixed-precision op"));
      }
      if (g[kFpFailed] != 0) failed.push_back(absl::StrCat(r));
      if (g[kFpOverflow] > 0) overflowed.push_back(absl::StrCat("rank ", r, ": ", g[kFpOverflow]));
      total_overflow += g[kFpOverflow];
    }
    if (!differ.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("mismatched mixed-precision collectives: rank 0 has {",
                       DescribeFingerprint(ref), "}, ", absl::StrJoin(differ, ", ")));
    }
    if (!failed.empty()) {
      if (!hook_failure.ok()) return hook_failure;
      return absl::AbortedError(absl::StrCat("mixed-precision ", OpKindName(kind), " seq ", seq,
                                             " aborted: a hook failed on rank(s) ",
                                             absl::StrJoin(failed, ", ")));
    }
    stats.global_cast_overflow = total_overflow;
    if (wire == DType::kF16 && total_overflow > 0) {
      if (opts.overflow == OverflowPolicy::kFail) {
        return absl::InvalidArgumentError(absl::StrCat(
            "fp16 wire overflow in mixed ", OpKindName(kind), " seq ", seq, ": ", total_overflow,
            " finite values have |x| >= 65520 (", absl::StrJoin(overflowed, ", "),
            "); policy=fail. Use a bf16 wire or OverflowPolicy::kResendBF16"));
      }
      if (opts.overflow != OverflowPolicy::kReport) *resend_needed = true;
    }
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
      size_t nonfinite = 0;
      for (size_t i = 0; i < result_count; ++i) nonfinite += (wire_out[i] & 0x7c00u) == 0x7c00u;
      if (nonfinite > 0 && !AnyNonfiniteInput()) {
        stats.result_nonfinite = nonfinite;
        if (opts.overflow == OverflowPolicy::kFail) {
          return absl::InvalidArgumentError(absl::StrCat(
              "fp16 wire overflow in mixed allreduce seq ", seq, ": the fp16 sum of ", nonfinite,
              " elements exceeds 65504; policy=fail. Use a bf16 wire or a resend policy"));
        }
        return opts.overflow == OverflowPolicy::kResendF32 ? Outcome::kResendF32
                                                           : Outcome::kResendBF16;
      }
    }

    // 7. cast back, scale in fp32
    precision::CastRequest back;
    back.kind =
        wire == DType::kF16 ? precision::CastKind::kF16ToF32 : precision::CastKind::kBF16ToF32;
    back.src = wire_out;
    back.dst = output.data;
    back.count = result_count;
    back.scale = Factor();
    back.parallel_min_bytes = opts.parallel_cast_min_bytes;
    std::shared_ptr<precision::CastJob> bj = precision::StartCast(back);
    absl::Status bs = bj->Join();
    if (!bs.ok()) return bs;
    stats.result_nonfinite = bj->stats().nonfinite_inputs;
    stats.cast_back_time = absl::Now() - t2;
    if (!hook_failure.ok()) return hook_failure;
    return Outcome::kDone;
  }

  // Whether any rank had a NaN/Inf input: fingerprints hold every rank's count.
  bool AnyNonfiniteInput() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (int r = 0; r < comm.size(); ++r) {
      if (st.fp_all[static_cast<size_t>(r) * kFpFields + kFpNonfinite] != 0) return true;
    }
    return false;
  }
};

namespace {

absl::Status Validate(Communicator& comm, OpKind kind, const TensorView& in, const TensorView& out,
                      const MixedOptions& opts) {
  const char* name = OpKindName(kind);
  for (const TensorView* v : {&in, &out}) {
    if (v->dtype != DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("mixed ", name, ": buffers must be f32, got ", DTypeName(v->dtype)));
    }
    if (v->device.is_cuda()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mixed ", name, ": CUDA buffers are not supported by the host mixed-precision path"));
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
  if (opts.context != nullptr && &opts.context->communicator() != &comm) {
    return absl::InvalidArgumentError(
        absl::StrCat("mixed ", name, ": the context belongs to another communicator"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MixedStats> MixedOpRunner::Run(Communicator& comm, OpKind kind, TensorView in,
                                              TensorView out, const MixedOptions& opts) {
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
  DType wire = opts.wire;
  bool resent = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<Outcome> outcome =
        wire == DType::kF32 ? runner.RunF32() : runner.RunNarrow(wire);
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

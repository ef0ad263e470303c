// Mixed-precision collectives on the host: the pipelined fp32-accumulating allreduce of
// MixedOpRunner (mixed_runner.h, RunPipelined's comment), its chunks cast and summed while the
// communicator moves their neighbours.
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

}  // namespace adaptcomm

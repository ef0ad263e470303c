// The runner of one mixed-precision collective on the host: its state, and the paths an op takes
// (fp32, narrow cast -> collective -> cast back, fused into the backend, pipelined in chunks).
// Internal to lib/precision/mixed*.cc: mixed_runner.cc holds the fp32, narrow and fused paths,
// mixed_pipelined.cc the pipelined one, mixed.cc the entry points that pick among them.
#ifndef ADAPTCOMM_LIB_PRECISION_MIXED_RUNNER_H_
#define ADAPTCOMM_LIB_PRECISION_MIXED_RUNNER_H_

#include <cstddef>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adaptcomm/precision.h"
#include "lib/precision/cast_parallel.h"
#include "lib/precision/mixed_fingerprint.h"
#include "lib/precision/mixed_internal.h"

namespace adaptcomm {

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

  void CallHooks(HookPoint point, DType wire, const void* wire_data, size_t wire_count);

  size_t WireInCount() const { return input.count; }
  size_t WireOutCount() const { return kind == OpKind::kAllreduce ? 0 : output.count; }

  Work Issue(TensorView in, TensorView out);

  float Factor() const { return MixedFactor(kind, opts, comm.size()); }

  mixed::Fingerprint MyFingerprint(DType wire) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu);

  // The fingerprint allgather: mismatch, remote failures, global counts. Same result on all ranks.
  absl::Status Exchange(DType wire, bool* resend_needed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu);

  absl::StatusOr<Outcome> RunF32() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu);

  // Alltoall of wire blocks, an fp32 sum of the `size()` blocks this rank owns, then for allreduce
  // the sum rounded once to the wire dtype and allgathered into wire_in; for reduce_scatter the
  // sum scaled straight into the fp32 output. Same bytes on the wire as a ring allreduce.
  absl::Status AccumulatedCollective(DType wire, uint16_t* wire_in, size_t block,
                                     precision::CastJob* late_job, bool* output_done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu);

  // The test knob's late join: the cast threads are waited for only after the collective read.
  void JoinLate(precision::CastJob* job, absl::Status& status);

  bool AccumulatesInF32() const;

  // Step 6 of RunNarrow: the fp16 elements of an allreduce's result that overflowed, where no
  // input was already non-finite. kDone: none; else a resend outcome, or an error under policy
  // fail.
  absl::StatusOr<Outcome> CheckReductionOverflow(const uint16_t* wire_out, size_t count);

  absl::StatusOr<Outcome> RunNarrow(DType wire) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu);

  // Whether an op on `count` fp32 writes its large buffers - the cast back into the output, and on
  // the split path the wire blocks that only the socket copy reads next - with non-temporal
  // stores: buffers this large do not stay in cache anyway, and streaming spares the read of every
  // cold destination line. Measured on 2 cores with 2 ranks casting at once: 32 MiB widened
  // 2.9 -> 1.9 ms, 8M elements narrowed 5-6 -> 1.6-2.3 ms.
  static bool StreamsStores(size_t count) { return count * sizeof(float) >= (size_t{16} << 20); }

  // The chunk size of the split allreduce below (a multiple of size() * 256 elements; SIZE_MAX:
  // one chunk), or 0 when this op takes RunNarrow. Only options decide (every rank passes the
  // same), never hooks, which are per rank: the ranks must issue the same collectives.
  size_t PipelineChunk(DType wire) const;
  bool Pipelines(DType wire) const { return PipelineChunk(wire) != 0; }

  // Whether the backend runs this op whole (OpDesc::wire, Capabilities::wire_cast: shared memory),
  // its casts being the copies into and out of the transport: the split allreduce's cases (same
  // result bits), without hooks (they would see no wire buffer) or test knobs. Hooks are per rank,
  // yet a rank with hooks still issues one allreduce per op, as its peers do: the collective
  // sequence is the same either way.
  bool Fuses(DType wire) const;

  // One allreduce of the fp32 buffer over a `wire` wire inside the backend. No barrier is needed:
  // a peer reads this rank's wire data only after the backend published it, cast complete.
  absl::StatusOr<Outcome> RunFused(DType wire) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.call_mu);

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
  struct PipelinedRun;  // RunPipelined's per-call state and steps (mixed_pipelined.cc)

  // Whether any rank had a NaN/Inf input: fingerprints hold every rank's count.
  bool AnyNonfiniteInput() const ABSL_NO_THREAD_SAFETY_ANALYSIS;
};

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_PRECISION_MIXED_RUNNER_H_

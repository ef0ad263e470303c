// Mixed precision: fp32 <-> bf16/fp16 casts, and collectives that send fp32 data as bf16/fp16.
//
//   adaptcomm::MixedPrecisionContext ctx(*comm);          // owns the wire scratch; reuse it
//   absl::StatusOr<adaptcomm::MixedStats> st = adaptcomm::AllreduceMixed(
//       *comm, adaptcomm::HostView(grad.data(), grad.size()),
//       {.wire = adaptcomm::DType::kBF16, .op = adaptcomm::ReduceOp::kAvg, .context = &ctx});
//
// A mixed collective runs: before-cast hooks, cast fp32 -> wire (multi-threaded for large
// buffers), after-cast hooks, BARRIER, before-collective hooks, the collective in the wire dtype,
// after-collective hooks, BARRIER, cast back to fp32 with avg/scale applied in fp32. The barrier
// is what makes the article's FP16 race impossible: the collective never reads the wire buffer
// before every cast thread has finished writing it.
//
// Cast semantics (every path - AVX-512, AVX2/F16C, scalar - gives identical bits):
//   * Rounding is to nearest, ties to even, independent of the MXCSR rounding mode; fp32
//     denormals are converted like any other value (bf16 keeps them; fp16 rounds them to +-0).
//   * Narrowing (fp32 -> bf16/fp16): +-Inf stays +-Inf. A NaN stays a NaN of the same sign, made
//     quiet, keeping the top mantissa bits that fit: bf16 = (bits >> 16) | 0x0040; fp16 =
//     sign | 0x7e00 | ((bits >> 13) & 0x3ff). (A payload held only in the low bits is lost,
//     leaving the canonical quiet NaN; the output is never mistaken for Inf.) This is what the
//     F16C vcvtps2ph and AVX512-BF16 vcvtneps2bf16 instructions produce.
//   * A finite fp32 whose magnitude rounds past the format's largest finite value becomes +-Inf
//     and is counted as `overflow`: fp16 at |x| >= 65520 (max finite 65504), bf16 at
//     |x| >= 0x1.ffp127 (bits 0x7f7f8000).
//   * Widening (bf16/fp16 -> fp32) is exact; a NaN is made quiet (bit 22 set), payload kept:
//     bf16 = (h << 16) | 0x00400000; fp16 = sign | 0x7fc00000 | (mantissa << 13) - as vcvtph2ps.
//
// Thread safety: the cast functions are thread-safe. A MixedPrecisionContext serves one call at a
// time (calls on one communicator are serialized anyway); its hooks may be added/removed from any
// thread. Compiles as C++17.
#ifndef ADAPTCOMM_PRECISION_H_
#define ADAPTCOMM_PRECISION_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/export.h"
#include "adaptcomm/types.h"

namespace adaptcomm {

// ---- casts ----

struct CastStats {
  size_t count = 0;             // elements converted
  size_t overflow = 0;          // finite inputs that became +-Inf (narrowing only)
  size_t nonfinite_inputs = 0;  // NaN or +-Inf inputs (propagated, not counted as overflow)
};

// Buffers of `count` elements; src and dst must not overlap. Large buffers (>= 4 MiB of input)
// are split across a small process-wide thread pool; the call returns when all of it is done.
ADAPTCOMM_EXPORT CastStats CastF32ToBF16(const float* src, uint16_t* dst, size_t count);
ADAPTCOMM_EXPORT CastStats CastF32ToF16(const float* src, uint16_t* dst, size_t count);
ADAPTCOMM_EXPORT CastStats CastBF16ToF32(const uint16_t* src, float* dst, size_t count);
ADAPTCOMM_EXPORT CastStats CastF16ToF32(const uint16_t* src, float* dst, size_t count);

// The instruction set the casts use on this CPU: "avx512bf16", "avx512", "avx2_f16c", "scalar".
ADAPTCOMM_EXPORT const char* CastImplementationName();

// ---- mixed-precision collectives ----

// Where the barrier between the cast and the collective (and between the collective and the
// cast back) synchronizes.
enum class BarrierLevel : uint8_t {
  // Every cast thread of this rank has finished before the collective starts, and the collective
  // has completed before the cast back starts. The default.
  kHost,
  // kHost, plus every rank has reached the point: an allgather of fingerprints (op, reduce op,
  // wire dtype, count, per-context sequence number) that fails every rank with
  // FailedPrecondition naming the ranks that differ, before any mismatched collective can hang or
  // corrupt. Also a Barrier after the collective. Costs two small collectives per call.
  kGlobal,
  // GPU: an event recorded after the cast on the compute stream, waited on by the communication
  // stream. For host buffers there is no stream: it behaves exactly as kHost.
  kStream,
};
ADAPTCOMM_EXPORT const char* BarrierLevelName(BarrierLevel level);

// What to do when a cast to an fp16 wire turns finite values into +-Inf (|x| >= 65520), or the
// fp16 reduction itself overflows. Decided identically on every rank: with fp16 and a policy
// other than kReport the ranks exchange their counts before the collective (an allgather).
enum class OverflowPolicy : uint8_t {
  kReport,      // carry on; the counts are in MixedStats
  kFail,        // every rank returns InvalidArgument naming the ranks and counts
  kResendBF16,  // run the op again with a bf16 wire (same range as fp32)
  kResendF32,   // run the op again in plain fp32
  // The communicator's profile decides (precision.fp16_overflow; built-in default: report).
  kFromProfile,
};
ADAPTCOMM_EXPORT const char* OverflowPolicyName(OverflowPolicy policy);

enum class HookPoint : uint8_t { kBeforeCast, kAfterCast, kBeforeCollective, kAfterCollective };
ADAPTCOMM_EXPORT const char* HookPointName(HookPoint point);

// What a hook sees. Pointers are valid only during the hook call.
struct HookInfo {
  HookPoint point = HookPoint::kBeforeCast;
  OpKind op = OpKind::kAllreduce;
  DType wire = DType::kBF16;
  size_t count = 0;  // elements of this rank's fp32 input
  uint64_t seq = 0;  // per-context sequence number of the mixed op (1-based)
  int rank = 0;
  // The wire buffer the collective sends (this rank's part). At kBeforeCollective it holds the
  // complete cast (with the host barrier on); at kAfterCollective, the reduced wire data.
  const void* wire_data = nullptr;
  size_t wire_count = 0;
};
// A hook may throw: the exception is caught and the op returns Aborted naming the hook.
using MixedHook = std::function<void(const HookInfo&)>;

class MixedPrecisionContext;

struct MixedOptions {
  DType wire = DType::kBF16;  // kBF16, kF16, or kF32 (no cast: the plain fp32 collective)
  // kSum, kAvg, kMin, kMax. kAvg reduces a sum on the wire and divides by the world size in fp32.
  ReduceOp op = ReduceOp::kSum;
  float scale = 1.0f;  // multiplied in fp32 after the reduction (allreduce, reduce_scatter)
  BarrierLevel barrier = BarrierLevel::kHost;
  OverflowPolicy overflow = OverflowPolicy::kFromProfile;
  // Per collective. Unset: the communicator's. Set: positive (InvalidArgument otherwise).
  std::optional<absl::Duration> timeout = std::nullopt;
  // Scratch, hooks and sequence numbers. Null: a temporary context is made for this call (its
  // scratch is allocated and first-touched every time: pass a context in a training loop).
  MixedPrecisionContext* context = nullptr;
  // Sum/avg only (min/max always reduce in the backend). true: the wire collective is an alltoall
  // of wire blocks (two ranks, host barrier: an allgather of the block the peer owns), a local
  // fp32 sum of the blocks this rank owns (vectorized), and an allgather
  // of that sum rounded once to the wire dtype - the same bytes on the wire as a ring allreduce,
  // on any backend, with one rounding of the sum instead of one per reduction step. false: the
  // backend's allreduce/reduce_scatter in the wire dtype (Gloo widens each pairwise step to fp32
  // and rounds it back).
  bool accumulate_fp32 = true;
  // Casts of at least this many input bytes are split across threads.
  size_t parallel_cast_min_bytes = size_t{4} << 20;
  // Allreduce with accumulate_fp32 over 2+ ranks, a host/stream barrier and no fp16 overflow
  // exchange takes a split path: each rank casts only the blocks it sends before the exchange
  // (its own block is rounded to the wire inside the one pass that sums the block it owns, rounds
  // the sum and writes that part of the output); two ranks exchange with in-place allgathers. With
  // this > 0 the buffer goes in chunks of this many fp32 bytes, the casts and sums of one chunk
  // overlapping the transfers of its neighbours. The host barrier then holds per chunk: a chunk's
  // collective is issued only after the cast of what it sends has finished. Same result bits
  // either way. Default 0 (one chunk): on a 2-core host with 2 ranks, 64 MiB allreduce, 16 MiB
  // chunks measured no faster and 4-8 MiB chunks 15-40% slower (each extra Gloo op costs more
  // than the overlap it buys when the transfer itself needs the CPU).
  size_t pipeline_chunk_bytes = 0;

  // TEST ONLY - they reproduce the article's race; never set them in a program.
  // Skips the host barrier: the collective is issued while the cast threads may still be writing
  // the wire buffer (the cast is joined only after the collective, before the cast back).
  bool debug_skip_host_barrier = false;
  // Each cast thread sleeps this long before casting (makes a race deterministic).
  absl::Duration debug_cast_delay = absl::ZeroDuration();
};

struct MixedStats {
  DType wire_used = DType::kBF16;  // differs from MixedOptions::wire after a resend
  bool resent = false;
  size_t cast_overflow = 0;           // this rank: finite fp32 that became +-Inf in the wire cast
  int64_t global_cast_overflow = -1;  // summed over ranks when they exchanged counts, else -1
  size_t nonfinite_inputs = 0;        // this rank: NaN/Inf in the fp32 input
  size_t result_nonfinite = 0;        // NaN/Inf in this rank's reduced wire result
  // On a backend that casts in transit (Capabilities::wire_cast: shared memory), an allreduce that
  // would take the split path runs inside the backend: the casts are its copies into and out of the
  // transport, counted in collective_time; cast_time and cast_back_time are then zero.
  absl::Duration cast_time;        // fp32 -> wire, wall time on this rank
  absl::Duration collective_time;  // barriers + collective
  absl::Duration cast_back_time;   // wire -> fp32 incl. scaling
};

// Removes its hook when destroyed (or on Remove()). May outlive the context.
class ADAPTCOMM_EXPORT HookHandle {
 public:
  HookHandle() = default;
  HookHandle(HookHandle&& other) noexcept;
  HookHandle& operator=(HookHandle&& other) noexcept;
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;
  ~HookHandle();
  void Remove();
  bool active() const;

  struct Registry;                                            // internal, defined in the library
  HookHandle(std::weak_ptr<Registry> registry, uint64_t id);  // internal: use AddHook

 private:
  std::weak_ptr<Registry> registry_;
  uint64_t id_ = 0;
};

// Scratch, hooks and the sequence counter of mixed ops on one communicator. Scratch grows to the
// largest op seen and is reused (first-touched once, not per call).
class ADAPTCOMM_EXPORT MixedPrecisionContext {
 public:
  explicit MixedPrecisionContext(Communicator& comm);
  ~MixedPrecisionContext();
  MixedPrecisionContext(const MixedPrecisionContext&) = delete;
  MixedPrecisionContext& operator=(const MixedPrecisionContext&) = delete;

  Communicator& communicator() const;
  // Hooks run on the calling thread, in the order they were added.
  [[nodiscard]] HookHandle AddHook(HookPoint point, std::string name, MixedHook hook);
  // Grows the scratch for ops of up to `max_count` fp32 elements per rank now, not at first use.
  void Reserve(size_t max_count);

 private:
  friend struct MixedOpRunner;
  struct State;
  std::unique_ptr<State> state_;
};

// In place: every rank's fp32 `data` ends as the reduction over all ranks, sent as opts.wire.
// Error bounds for a sum over n ranks, u = 2^-8 (bf16) or 2^-11 (fp16), S = sum_i |x_i|:
//   accumulate_fp32 (default): each input rounded once to the wire, summed in fp32 in rank order,
//     the sum rounded once to the wire:  |result - exact| <= (2u + n * 2^-23) * S
//   backend accumulation: every partial sum is rounded to the wire, for any summation order:
//     |result - exact| <= gamma_n * S,   gamma_n = n*u / (1 - n*u)
// fp16 adds (n + 1) * 2^-25 absolute (roundings in its denormal range, below 2^-14). avg/scale
// multiply in fp32: scale the bound, plus 2^-23 * |result|. reduce_scatter with accumulate_fp32
// skips the final rounding (u * S less). Min/max are exact up to the input cast (u * |x|).
// Every rank ends with identical bits.
// Synchronous: returns when `data` holds the result. Errors: InvalidArgument (dtype not f32,
// unsupported wire/op, fp16 overflow with kFail), FailedPrecondition (ranks mismatched),
// Aborted (a hook threw, here or on another rank), and whatever the collective returns.
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<MixedStats> AllreduceMixed(
    Communicator& comm, TensorView data, const MixedOptions& options);
// input: size() * output.count fp32 elements; output: the reduction of block rank().
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<MixedStats> ReduceScatterMixed(
    Communicator& comm, TensorView input, TensorView output, const MixedOptions& options);
// output: size() * input.count fp32; rank i's input (rounded to the wire dtype) lands in block i.
// op and scale are ignored.
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<MixedStats> AllgatherMixed(
    Communicator& comm, TensorView input, TensorView output, const MixedOptions& options);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_PRECISION_H_

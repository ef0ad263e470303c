// Gradient bucketing: many gradient tensors reduced as a few large allreduces, launched while
// backward still runs.
//
//   std::vector<adaptcomm::GradientSpec> specs = {{"fc1.weight", 4096}, {"fc1.bias", 64}, ...};
//   auto bucketer = adaptcomm::GradientBucketer::Create(*comm, specs, {});  // a collective
//   for (;;) {                                   // one training step
//     ... backward: as each gradient is final ...
//     absl::Status s = (*bucketer)->MarkReady(i, adaptcomm::HostView(g.data(), g.size()));
//     ...
//     absl::StatusOr<adaptcomm::BucketStepStats> done = (*bucketer)->Wait();  // ends the step
//   }
//
// Buckets. The tensors are assigned to buckets once, at Create, from the registration alone: in
// reverse registration order (backward produces the last layers' gradients first), a bucket per
// (dtype, device) that closes once it holds at least `bucket_bytes`; a tensor of at least
// `direct_bytes` is a bucket of its own. Every rank therefore builds
// the same buckets and launches them in the same order, whatever order its tensors become ready
// in: bucket b is launched when all of its tensors are ready and buckets 0..b-1 were launched.
// A ready tensor is copied into its bucket's buffer (no copy when the caller wrote it in place, at
// Storage(i), or when it is alone in its bucket); Wait() copies each result back, bucket by
// bucket, as each one completes.
//
// Every step ends with one small allreduce (8 bytes per rank) of each rank's bucketing errors, so
// that a mistake on one rank (a tensor marked ready twice, or never) fails Wait() on every rank,
// naming the rank and the tensor, rather than leaving the others waiting for a bucket that is
// never launched: the erring rank launches its remaining buckets anyway (see UnusedPolicy).
//
// Memory: host tensors on a backend that takes host memory (Gloo, shared memory, hierarchical).
// CUDA tensors where the backend takes device memory (NCCL; Gloo staging CUDA views), all of one
// rank's on one device. Where the bucketer can reach the communicator's CUDA runtime they are
// fused like host tensors, in device buckets it allocates: MarkReady queues the copy into the
// bucket on the gradient's stream (after the work that produced it) and records an event; the
// bucket's allreduce runs on the bucketer's own stream once every copy is done; Wait() queues the
// copies back there and makes each gradient's stream wait for them, so work queued on those
// streams after Wait() sees the result (as with Work::Wait on a stream-ordered backend, Wait()
// does not wait for the device). Otherwise each CUDA tensor is a bucket of its own, reduced in
// place. On a backend that takes device memory only (NCCL) every tensor must be a CUDA tensor and
// the wire f32; the bucketer's own exchanges (registration digest, per-step errors) then go
// through device scratch, and Wait() waits (bounded) for the error exchange to reach the host.
//
// Thread safety: MarkReady may be called from any thread, concurrently; Wait from one thread at a
// time. Collectives: Create and Wait are collectives of the communicator, and the bucket
// allreduces are issued by whichever thread marks the tensor that fills them. REQUIRES: between
// the first MarkReady of a step and its Wait, no other thread issues ops on the same communicator
// (the ranks would see them in different orders relative to the buckets).
//
// Compiles as C++17.
#ifndef ADAPTCOMM_BUCKETER_H_
#define ADAPTCOMM_BUCKETER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/export.h"
#include "adaptcomm/precision.h"
#include "adaptcomm/types.h"
#include "adaptcomm/work.h"

namespace adaptcomm {

// One gradient tensor, as registered (the data pointer comes with each MarkReady).
struct GradientSpec {
  std::string name;  // for errors only ("fc1.weight"); need not be unique
  size_t count = 0;  // elements, > 0
  DType dtype = DType::kF32;
  Device device = Device::Cpu();
};

// What Wait() does about a tensor not marked ready in the step (a parameter that took no part in
// this step's forward pass: DDP's find_unused_parameters).
enum class UnusedPolicy : uint8_t {
  // Wait() fails on every rank naming the rank and the first such tensor. The step's results are
  // not valid; the bucketer is ready for the next step.
  kError,
  // Its gradient counts as zero on this rank: the bucketer zeroes its slot (Storage(i)), where
  // the reduced result then is (a view of an earlier step may no longer be valid). A CUDA tensor
  // alone in its bucket has no slot: zeros in device scratch stand in, and its result is dropped.
  kZero,
};

struct BucketerOptions {
  ReduceOp op = ReduceOp::kAvg;  // gradients are usually averaged over the ranks
  // Bytes per bucket (a bucket closes once it holds at least this many; a larger tensor is a
  // bucket of its own). Unset: the profile's buckets.bytes (built-in default 25 MiB). Set:
  // positive (InvalidArgument otherwise).
  std::optional<size_t> bucket_bytes = std::nullopt;
  // A host tensor of at least this many bytes is a bucket of its own, reduced in place in the
  // caller's view: fusing it would save one op's fixed cost but cost two copies of its bytes
  // (measured on shared memory, 2 ranks: copies made a 100 MiB step 2.5x slower than one
  // allreduce, bench/RESULTS.md). Zero: every tensor may be fused.
  size_t direct_bytes = size_t{1} << 20;
  // kF32: plain allreduces. kBF16 or kF16: the f32 buckets go through AllreduceMixed with this
  // wire dtype (casts, barrier and overflow guard of adaptcomm/precision.h), run in bucket order
  // by a thread of the bucketer so that backward goes on meanwhile; other dtypes stay plain.
  DType wire = DType::kF32;
  OverflowPolicy overflow = OverflowPolicy::kFromProfile;  // fp16 wire only
  UnusedPolicy unused = UnusedPolicy::kError;
  // Per bucket allreduce, counted from when it starts running. Unset: the communicator's. Set:
  // positive (InvalidArgument otherwise).
  std::optional<absl::Duration> timeout = std::nullopt;
};

// What one step did (Wait()'s result).
struct BucketStepStats {
  int buckets = 0;               // allreduces launched, every bucket once
  int launched_before_wait = 0;  // of them, launched by MarkReady (overlapping backward)
  size_t bytes = 0;              // bytes reduced (this rank's tensors)
  int unused_tensors = 0;        // not marked ready and zeroed (UnusedPolicy::kZero)
  size_t cast_overflow = 0;      // mixed precision: summed over the buckets (MixedStats)
  bool resent = false;           // mixed precision: some bucket was resent (overflow guard)
  absl::Duration wait_time;      // spent in Wait() (what backward did not hide)
};

// One bucket, as Create assigned it.
struct BucketInfo {
  std::vector<int> tensors;  // registration indices, in the order they are packed
  size_t bytes = 0;
  DType dtype = DType::kF32;
  Device device = Device::Cpu();
};

class ADAPTCOMM_EXPORT GradientBucketer {
 public:
  // A collective over `comm`: every rank registers the same tensors (count, sizes, dtypes and
  // devices) with the same options. The ranks compare a digest of their registrations (an
  // allgather of 16 bytes each) and, when they differ, the registrations themselves: every rank
  // gets FailedPrecondition naming the first rank and the first tensor that differ from rank 0's.
  // InvalidArgument: an empty tensor, an op the dtype cannot take (avg of integers), a wire other
  // than f32/bf16/f16, CUDA tensors on two devices. Unimplemented: CUDA tensors on a backend
  // without device memory; host tensors or a bf16/f16 wire on one without host memory (NCCL).
  // `comm` must outlive the bucketer.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GradientBucketer>> Create(
      Communicator& comm, std::vector<GradientSpec> tensors, const BucketerOptions& options = {});
  ~GradientBucketer();
  GradientBucketer(const GradientBucketer&) = delete;
  GradientBucketer& operator=(const GradientBucketer&) = delete;

  // Tensor `index` holds its final gradient for this step at `grad` (count, dtype and device as
  // registered). It is copied into its bucket now (unless `grad` is Storage(index)), so the
  // caller may reuse `grad` until Wait(), which writes the reduced result back into it. Launches
  // every bucket that is now complete and next in line. Returns the error of a bad call
  // (InvalidArgument: unknown index, a view unlike the registration; FailedPrecondition: marked
  // twice this step, or the bucketer is broken), which Wait() then reports on every rank.
  [[nodiscard]] absl::Status MarkReady(int index, TensorView grad);
  // As MarkReady(index, Storage(index)): the gradient was written in place.
  [[nodiscard]] absl::Status MarkReady(int index);

  // Tensor `index`'s slot in its bucket's buffer: write the gradient there and MarkReady(i) saves
  // the copy in (DDP's gradient_as_bucket_view). Valid for the bucketer's lifetime; after Wait()
  // it holds the reduced result when the step's gradient was given there (or zeroed by
  // UnusedPolicy::kZero). The slot of a fused CUDA tensor is device memory, its stream the
  // bucketer's (write it on another stream and pass that stream in MarkReady(i, view)). A tensor
  // reduced alone in the caller's view (direct_bytes, unfused CUDA) has no slot: data == nullptr.
  TensorView Storage(int index) const;

  // Ends the step: launches what is left (see UnusedPolicy), waits for every bucket (each within
  // its op timeout: this never hangs on a dead peer), copies the results back, exchanges the
  // ranks' errors. OK on every rank or an error on every rank: the first bucketing error of the
  // lowest rank that had one ("rank 1: tensor 3 (fc2.bias) was never marked ready"), or the
  // collective's error (IsStepRedo inside a step that must be redone). In every case the next
  // MarkReady starts a new step.
  [[nodiscard]] absl::StatusOr<BucketStepStats> Wait();

  int tensor_count() const;
  int bucket_count() const;
  const BucketInfo& bucket(int b) const;  // an empty BucketInfo for no such bucket
  int bucket_of(int index) const;         // -1 for no such tensor
  // The state of bucket b's allreduce in the current step: kPending until it is launched (and,
  // with a mixed-precision wire, until it ran), then as its Work says.
  WorkState bucket_state(int b) const;

 private:
  struct State;
  explicit GradientBucketer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace adaptcomm

#endif  // ADAPTCOMM_BUCKETER_H_

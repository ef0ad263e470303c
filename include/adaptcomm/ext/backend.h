// Backend: the interface a transport implements (Gloo, NCCL, shared memory, the hierarchical
// composite). Part of the extension interface (include/adaptcomm/ext/): what a backend author
// includes. A trainer that only runs collectives includes adaptcomm/adaptcomm.h and never this;
// it reaches a backend of its own through Communicator::CreateWithBackend.
//
// Ownership: a Communicator owns exactly one Backend and is the only caller of Run() (and of
// RunGroup() on its GroupRunner).
// Thread safety: Run() is called by one thread at a time, in sequence order. Abort(), health()
// and capabilities() may be called from any thread at any time.
// Optional features are capability queries (Supports, capabilities), never methods that throw.
#ifndef ADAPTCOMM_EXT_BACKEND_H_
#define ADAPTCOMM_EXT_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/capabilities.h"
#include "adaptcomm/export.h"
#include "adaptcomm/types.h"

namespace adaptcomm {

class StreamPosition;  // below

// One operation as the backend sees it. The communicator has validated the generic rules (non-null
// data, matching sizes, root/peer in range) before Run() sees it.
//   allreduce, broadcast, reduce: in place on `output` (input aliases output).
//   allgather: input = this rank's block, output = world_size blocks.
//   reduce_scatter: input = world_size blocks, output = this rank's reduced block.
//   alltoall: input and output both hold world_size equal blocks; block i goes to rank i.
//   send: input; recv: output.
// What a wire-cast op counted (OpDesc::wire_stats).
struct WireStats {
  size_t cast_overflow = 0;  // this rank: finite inputs that became +-Inf in the cast to the wire
  size_t nonfinite_inputs = 0;  // this rank: NaN/Inf among its inputs
  size_t result_nonfinite = 0;  // NaN/Inf in the reduced wire result (all of it)
};

// Values of a backend's own knobs for one op: online tuning (lib/core/tuning/online_tuner.h) sets
// them on the ops it measures and, once the ranks agreed, on every later op of the size band. Knobs
// are named as the tuned table names them (TunedKnobs() in lib/config/tuned_table.h: "shm"
// "chunk_bytes"); a value is what the table's entry holds (a choice: its index). A backend applies
// them only when `backend` is its knob space (Capabilities::per_op_knobs) and ignores them
// otherwise, so an op queued before a rebuild onto another backend runs with that one's values.
// Every rank gets the same values for the same op; a knob not listed keeps the backend's value.
struct OpKnobs {
  std::string backend;  // "shm", "gloo"
  std::vector<std::pair<std::string, int64_t>> values;

  // The value of `knob` when this set is for `space` and names it; else null.
  const int64_t* Find(std::string_view space, std::string_view knob) const {
    if (space != backend) return nullptr;
    for (const auto& [name, value] : values) {
      if (name == knob) return &value;
    }
    return nullptr;
  }
};

struct OpDesc {
  OpKind kind = OpKind::kBarrier;
  TensorView input;
  TensorView output;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;      // broadcast, reduce
  int peer = -1;     // send, recv
  uint32_t tag = 0;  // send, recv: matches a send to a recv between the same pair
  uint64_t seq = 0;  // per-communicator sequence number (1-based)
  absl::Duration timeout = absl::Seconds(600);  // bound of this op, counted from its start
  // The caller keeps the input unchanged until the next op completed (the *Options' stable_input):
  // the communicator's retry record may refer to it instead of copying it. Backends ignore it.
  bool stable_input = false;
  // Ops on CUDA views of a stream-ordered backend: where the op sits in its caller's stream,
  // taken when the op was issued (StreamOrdered::MarkIssue). Null otherwise.
  std::shared_ptr<const StreamPosition> issued_at;
  // Allreduce (kSum) of f32 host data that travels as `wire` (kBF16 or kF16), on a backend with
  // Capabilities::wire_cast; the mixed-precision collectives use it. Each rank's input is rounded
  // once to the wire, the roundings are summed in fp32 in rank order, the sum is rounded once to
  // the wire, widened back and multiplied by wire_scale: the accumulate_fp32 semantics of
  // adaptcomm/precision.h, bit for bit. Unset: the data travels as it is.
  std::optional<DType> wire;
  float wire_scale = 1.0f;
  WireStats* wire_stats = nullptr;  // written when Run returns OK, when non-null
  // This op's knob values (OpKnobs); null: the backend's own (profile or tuned table).
  std::shared_ptr<const OpKnobs> knobs;
};

// A point in a caller's CUDA stream (an event recorded there when the op was issued), opaque to
// everyone but the backend that made it.
class ADAPTCOMM_EXPORT StreamPosition {
 public:
  virtual ~StreamPosition() = default;
};

// A device op that a stream-ordered backend queued on the device. The ops of one backend finish
// in the order it launched them (one stream): once Poll() says an op is done, every op launched
// before it is done too, which lets the executor ask about the newest first.
// Thread safety: every method may be called from any thread; none blocks.
class ADAPTCOMM_EXPORT DeviceCompletion {
 public:
  virtual ~DeviceCompletion() = default;
  // true: the device finished the op; false: not yet; an error: the device or the transport
  // failed it (the backend is then broken).
  [[nodiscard]] virtual absl::StatusOr<bool> Poll() = 0;
  // Queues on `stream` (a cudaStream_t) a wait for the op: the caller's later work on that stream
  // runs after it, without the host waiting.
  [[nodiscard]] virtual absl::Status MakeStreamWait(void* stream) = 0;
  // How long the device executed the op, when the backend timed it there (e.g. timing events
  // around its launch on the backend's stream) and the device finished it; nullopt otherwise (not
  // sampled, not finished, or the timing could not be read). Called after Poll() said the op (or
  // one launched after it) is done. Never blocks, never waits for the device.
  virtual std::optional<absl::Duration> DeviceTime() { return std::nullopt; }
};

// A capability (Backend::stream_ordered()): device ops run on the backend's own stream, each
// behind the work its caller had queued on the view's stream when it was issued, back to back,
// without the host waiting for any of them (torchcomms' and c10d's model: the caller's stream
// waits for the collective, not the caller).
// Thread safety: MarkIssue may be called from any thread; Launch only where Run may be.
class ADAPTCOMM_EXPORT StreamOrdered {
 public:
  virtual ~StreamOrdered() = default;
  // On the issuing thread, at issue: records the op's place in its view's stream. Never blocks.
  // InvalidArgument naming the view when its stream is not on the backend's device.
  [[nodiscard]] virtual absl::StatusOr<std::shared_ptr<const StreamPosition>> MarkIssue(
      const OpDesc& op) = 0;
  // Queues `op` (op.issued_at set by MarkIssue) and returns once it is queued, bounded by
  // op.timeout. Errors as Run's; InvalidArgument leaves the backend usable.
  [[nodiscard]] virtual absl::StatusOr<std::shared_ptr<DeviceCompletion>> Launch(
      const OpDesc& op) = 0;
  // Queues the ops of a group (GroupRunner's contract: consecutive sequence numbers, in issue
  // order, each accepted by Supports and each with op.issued_at set by MarkIssue) as one unit,
  // behind every op's issue point, and returns once they are queued, bounded by the largest of
  // their timeouts. One completion for the whole group: it is done once every op of the group is.
  // Errors as Launch's.
  [[nodiscard]] virtual absl::StatusOr<std::shared_ptr<DeviceCompletion>> LaunchGroup(
      const std::vector<OpDesc>& ops) = 0;
  // Queues a copy of `bytes` from `src` to `dst` (both in the memory of the backend's device) on
  // the backend's own stream, behind the caller's work that `at` marked and ahead of every op
  // launched after it: the coordinated retry's record of an op's input is then taken before the
  // collective overwrites it, and its restore lands before the re-run reads it, whatever the
  // caller's stream does meanwhile. Never blocks. Called where Launch may be.
  [[nodiscard]] virtual absl::Status CopyAt(const StreamPosition& at, void* dst, const void* src,
                                            size_t bytes) = 0;
};

// A capability (Backend::groups()): runs the ops of a group (Communicator::GroupStart/GroupEnd)
// as one unit. Sends and receives progress concurrently, so any set of matching ones completes
// whatever order each rank issued them in: a send matches the receive of the same pair of ranks
// and tag, and the ops of one pair and tag match in issue order. Collectives run in issue order
// (every rank's group holds the same ones in the same order). No other order holds between the
// ops of a group: an op must not read a buffer that another op of the group writes.
// Thread safety: RunGroup is called where Run may be.
class ADAPTCOMM_EXPORT GroupRunner {
 public:
  virtual ~GroupRunner() = default;
  // Runs `ops` (consecutive sequence numbers, in issue order, each accepted by Supports) to
  // completion, bounded by the largest of their timeouts. One status for the whole group, with
  // Run's meaning: after a failure other than InvalidArgument the backend is broken.
  virtual absl::Status RunGroup(const std::vector<OpDesc>& ops) = 0;
};

// Device memory services of a backend that takes CUDA views: what the coordinated retry needs to
// keep a copy of a device op's input (include/adaptcomm/communicator.h, max_retry_attempts).
// Ownership: shared; it must stay usable after the backend that returned it is destroyed (a
// replay record outlives the backend generation that recorded it).
// Thread safety: every method may be called from any thread.
class ADAPTCOMM_EXPORT DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Queues a copy of `bytes` from `src` to `dst`, both in the memory of `device`, on `stream` (a
  // cudaStream_t; nullptr = the legacy default stream), after the work already queued there.
  [[nodiscard]] virtual absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                                               Device device, void* stream) = 0;
  [[nodiscard]] virtual absl::StatusOr<void*> Allocate(Device device, size_t bytes) = 0;
  // REQUIRES: `ptr` came from Allocate(device, ...) and no queued work uses it any more.
  virtual void Free(Device device, void* ptr) = 0;
};

class ADAPTCOMM_EXPORT Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;  // "gloo", "nccl", ...
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Capabilities capabilities() const = 0;

  // OK if this backend can run `op` (dtype x reduce op x device), else InvalidArgument saying why.
  // Called before the op is queued, so bad input fails at the call, not later.
  virtual absl::Status Supports(const OpDesc& op) const = 0;

  // Runs `op` to completion, or fails within op.timeout (DeadlineExceeded) or when aborted
  // (Aborted). After a failure other than InvalidArgument the backend is broken: health()
  // returns the failure and every later Run() fails fast with it.
  virtual absl::Status Run(const OpDesc& op) = 0;

  // Makes a Run() in flight return promptly and breaks the backend. Idempotent.
  virtual void Abort(const absl::Status& reason) = 0;

  // OK, or the error that broke the backend.
  virtual absl::Status health() const = 0;

  // A capability: device memory services when this backend takes CUDA views, else null (then ops
  // on CUDA views cannot be replayed by a coordinated retry and fail instead).
  virtual std::shared_ptr<DeviceMemory> device_memory() const { return nullptr; }

  // A capability: non-null when this backend queues device ops without blocking the host
  // (Capabilities::stream_ordered). Owned by the backend.
  virtual StreamOrdered* stream_ordered() { return nullptr; }

  // A capability: non-null when this backend runs groups of ops as one unit (GroupRunner). Owned
  // by the backend. Without it a group's ops run one after the other, which completes only when
  // the ranks issued matching sends and receives in a matching order.
  virtual GroupRunner* groups() { return nullptr; }

  // The values of its knob space (Capabilities::per_op_knobs) that an op of `kind` and `bytes`
  // runs with when OpDesc::knobs sets none (the profile's, or a tuned table's band), named as
  // OpKnobs names them. Online tuning does not try a candidate that would run the same algorithm.
  // Empty when the backend has no knob space or does not say: every candidate is then tried.
  virtual std::vector<std::pair<std::string, int64_t>> StaticKnobs(OpKind /*kind*/,
                                                                   uint64_t /*bytes*/) const {
    return {};
  }
};

}  // namespace adaptcomm

#endif  // ADAPTCOMM_EXT_BACKEND_H_

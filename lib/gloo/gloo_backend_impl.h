// The Gloo backend's class (lib/gloo/gloo_backend.h creates it), shared by its two files:
// gloo_backend.cc holds the frame (checks, connecting peers, groups, choosing an allreduce's
// algorithm) and gloo_collectives.cc the collectives and point-to-point ops. Internal to lib/gloo.
#ifndef ADAPTCOMM_LIB_GLOO_GLOO_BACKEND_IMPL_H_
#define ADAPTCOMM_LIB_GLOO_GLOO_BACKEND_IMPL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/config.h"
#include "gloo/context.h"
#include "gloo/reduce.h"
#include "gloo/transport/context.h"
#include "gloo/transport/device.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "lib/backend/backend_base.h"
#include "lib/backend/op_checks.h"
#include "lib/backend/op_dispatch.h"
#include "lib/base/elementwise.h"
#include "lib/base/log.h"
#include "lib/base/op_views.h"
#include "lib/config/gloo_segment.h"
#include "lib/gloo/gloo_backend.h"
#include "lib/gloo/gloo_pairs.h"
#include "lib/gloo/gloo_peers.h"
#include "lib/gloo/gloo_recursive_doubling.h"
#include "lib/gloo/gloo_reduce.h"
#include "lib/gloo/gloo_sigpipe.h"
#include "lib/gloo/gloo_wait.h"

namespace adaptcomm::gloo_backend {

using Clock = std::chrono::steady_clock;

// Slots of our own unbound-buffer traffic. Gloo's collectives build slots from prefixes 0x01..0x08
// in the top byte (and Context::nextSlot counts up from 0), so a top byte of 0x50/0x51 cannot
// collide with them.
inline constexpr uint64_t kSendRecvSlotBase = uint64_t{0x50} << 56;
// A group's small messages of one pair and direction, sent as one (GlooBackend::Group) on this slot
// plus the group's sequence number (below 2^56), up to this many bytes.
inline constexpr uint64_t kCoalescedSlotBase = uint64_t{0x52} << 56;
inline constexpr size_t kCoalesceMaxBytes = size_t{1} << 20;
inline constexpr uint64_t kReduceScatterSlotBase = uint64_t{0x51} << 56;
// The recursive-doubling allreduce's steps, in the low 8 bits, under the op's sequence number.
inline constexpr uint64_t kRecursiveDoublingSlotBase = uint64_t{0x53} << 56;
// reduce_scatter steps are numbered in the low 16 bits of its slot.
inline constexpr int kMaxRingSize = 1 << 16;
// gloo::reduce's root talks to every rank; up to this many peers that costs less latency than a
// ring allreduce (one gather step instead of n-1 allgather steps) for few connections.
inline constexpr int kDirectReduceMaxPeers = 15;
// The knob space of OpDesc::knobs this backend applies (TunedKnobs(): backend "gloo").
inline constexpr char kKnobSpace[] = "gloo";

inline constexpr size_t kMaxElements = static_cast<size_t>(std::numeric_limits<int32_t>::max());

// Gloo treats a zero timeout as "none": never pass one.
inline std::chrono::milliseconds ToMs(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(d);
  constexpr int64_t kMaxMs = int64_t{1} << 40;  // ~35 years; avoids steady_clock overflow
  return std::chrono::milliseconds(std::clamp<int64_t>(ms, 1, kMaxMs));
}

// A gloo::Context over a transport context whose pairs LazyPairs connects (connectFullMesh, the
// only way Gloo's rendezvous::Context offers to fill one, connects them all).
class LazyContext final : public ::gloo::Context {
 public:
  using ::gloo::Context::Context;

  void Attach(std::shared_ptr<::gloo::transport::Device> device,
              std::shared_ptr<::gloo::transport::Context> transport) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

inline bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

inline Clock::time_point DeadlineOf(const OpDesc& op) { return Clock::now() + ToMs(op.timeout); }

// Whether bcube needs only a few peers per rank on `size` ranks: at most 2 ceil(log2 size) on
// every rank (so all ranks agree). Bcube factors the world into groups; a world with a large
// prime factor (an odd world after a shrink, say 127) makes one group of nearly every rank, a
// full mesh whose pairs an op would have to connect within its timeout.
bool BcubeIsNarrow(int size);

class GlooBackend final : public BackendBase, public GroupRunner {
 public:
  GlooBackend(std::shared_ptr<LazyContext> context, std::unique_ptr<LazyPairs> pairs,
              const GlooBackendOptions& o)
      : BackendBase({.name = "gloo",
                     .rank = context->rank,
                     .size = context->size,
                     // algorithm, max_segment_bytes of allreduce
                     .capabilities = {.per_op_knobs = kKnobSpace}}),
        context_(std::move(context)),
        gloo_context_(context_),
        pairs_(std::move(pairs)),
        auto_bcube_(BcubeIsNarrow(size())),
        // Bcube's groups hold every rank of an odd world: past the cap, ring instead.
        bcube_fits_(static_cast<int>(gloo_backend::BcubePeers(rank(), size()).size()) <=
                    pairs_->max_connections()),
        doubling_fits_(
            static_cast<int>(gloo_backend::RecursiveDoublingPeers(rank(), size()).size()) <=
            pairs_->max_connections()),
        // gloo::reduce gathers to the root directly; past kDirectReduceMaxPeers (or the cap) a
        // ring allreduce does the reduce with two connections per rank.
        direct_reduce_(size() - 1 <= std::min(kDirectReduceMaxPeers, pairs_->max_connections())),
        ready_(static_cast<size_t>(gloo_backend::kPeerSetCount) * static_cast<size_t>(size())),
        algorithm_(o.algorithm == "bcube"                ? Algorithm::kBcube
                   : o.algorithm == "recursive_doubling" ? Algorithm::kRecursiveDoubling
                   : o.algorithm == "auto"               ? Algorithm::kAuto
                                                         : Algorithm::kRing),
        max_segment_bytes_(o.max_segment_bytes),
        tuned_algorithm_(o.tuned_algorithm),
        tuned_max_segment_bytes_(o.tuned_max_segment_bytes) {}

  ~GlooBackend() override = default;

  absl::Status Supports(const OpDesc& op) const override;
  absl::Status Run(const OpDesc& op) override;
  GroupRunner* groups() override { return this; }
  absl::Status RunGroup(const std::vector<OpDesc>& ops) override;
  std::vector<std::pair<std::string, int64_t>> StaticKnobs(OpKind kind,
                                                           uint64_t bytes) const override {
    if (kind != OpKind::kAllreduce) return {};
    const OpDesc op;  // no OpDesc::knobs
    return {{"algorithm", AlgorithmFor(op, bytes)},
            {"max_segment_bytes", static_cast<int64_t>(MaxSegmentFor(op, bytes))}};
  }

 private:
  friend struct ::adaptcomm::OpDispatch;
  // The values of AlgorithmFor(), as the tuned table's "algorithm" knob numbers them.
  enum class Algorithm { kRing = 0, kBcube = 1, kRecursiveDoubling = 2, kAuto };

  void Interrupt(const absl::Status& reason) override;
  // An allreduce's algorithm (Algorithm: 0 ring, 1 bcube, 2 recursive doubling) and segment cap (0:
  // Gloo's default) for `bytes`: the op's own value (OpDesc::knobs, online tuning), else a tuned
  // band's, else the profile's. Both change the order in which a float element's sum is formed once
  // there are more than two ranks (lib/config/online_tuning.h says which candidates are tried
  // therefore).
  int64_t AlgorithmFor(const OpDesc& op, uint64_t bytes) const;
  uint64_t MaxSegmentFor(const OpDesc& op, uint64_t bytes) const;
  // The peers `op` exchanges data with (lib/gloo/gloo_peers.h).
  PeerSetId PeersFor(const OpDesc& op) const;
  // ResourceExhausted, before any traffic, when `op` needs pairs past max_connections.
  absl::Status CheckCap(const OpDesc& op) const;
  // Connects the pairs of every op in `ops` not connected yet, all at once (a group's sends and
  // receives may form a cycle that one-op-at-a-time connecting would deadlock on), within the
  // ops' timeout.
  absl::Status EnsurePeers(const OpDesc* ops, size_t n, absl::Duration timeout);
  // Runs body(), translating what Gloo throws into a status (what(): the op's name for the
  // message; op.timeout: its bound); the frame (RunFramed) decides what breaks the backend.
  template <typename What, typename Body>
  absl::Status Guarded(const OpDesc& op, What&& what, Body&& body);
  // Each of these throws what Gloo throws; Run() translates at the edge. OpDispatch picks one.
  void Group(const std::vector<OpDesc>& ops, Clock::time_point deadline);
  void Allreduce(const OpDesc& op);
  // The algorithm an allreduce of `bytes` runs: AlgorithmFor()'s, or the ring where that one
  // would need pairs past max_connections.
  Algorithm AllreduceAlgorithm(const OpDesc& op, uint64_t bytes) const;
  // gloo::allreduce of op.output's count and dtype in place at `data`.
  void GlooAllreduce(const OpDesc& op, void* data, bool bcube, uint64_t segment);
  void Broadcast(const OpDesc& op);
  void Reduce(const OpDesc& op);
  void Allgather(const OpDesc& op);
  void ReduceScatter(const OpDesc& op);
  void Alltoall(const OpDesc& op);
  void Barrier(const OpDesc& op);
  void Send(const OpDesc& op);
  void Recv(const OpDesc& op);

  // At least `bytes` of reusable scratch. Grown, never shrunk: fresh pages cost ~11 us per 4 KiB
  // on first touch here, so re-allocating per op would dominate large ops.
  uint8_t* Scratch(size_t bytes);

  const std::shared_ptr<LazyContext> context_;
  const std::shared_ptr<::gloo::Context>
      gloo_context_;  // the same object, as Gloo's options take it
  const std::unique_ptr<LazyPairs> pairs_;
  const bool auto_bcube_;     // gloo.algorithm auto may pick bcube here (BcubeIsNarrow)
  const bool bcube_fits_;     // bcube's peers are within max_connections
  const bool doubling_fits_;  // recursive doubling's too
  const bool direct_reduce_;  // reduce runs gloo::reduce (else a ring allreduce)
  // Per PeerSetId (set * size + root): its pairs are all connected. Written by the thread that
  // runs ops (EnsurePeers), read also by the issuing thread (Supports -> CheckCap): atomic.
  std::vector<std::atomic<bool>> ready_;
  const Algorithm algorithm_;       // profile gloo.algorithm
  const size_t max_segment_bytes_;  // profile gloo.max_segment_bytes (0: Gloo default)
  // Tuned per size band (GlooBackendOptions); empty: the two above for every size.
  const config::SizeBands tuned_algorithm_;
  const config::SizeBands tuned_max_segment_bytes_;

  // Used by the Run() thread only.
  std::unique_ptr<uint8_t[]> scratch_;
  size_t scratch_bytes_ = 0;
};

// Gloo's options only need the element size (our reduce functions know the real type), so
// buffers are typed by an unsigned integer of the same width.
template <typename F>
void WithElementType(DType dtype, F&& f) {
  switch (DTypeSize(dtype)) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    default:
      return f(uint64_t{});
  }
}

}  // namespace adaptcomm::gloo_backend

#endif  // ADAPTCOMM_LIB_GLOO_GLOO_BACKEND_IMPL_H_

#include "lib/gloo/gloo_backend.h"

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
#include "lib/gloo/gloo_pairs.h"
#include "lib/gloo/gloo_peers.h"
#include "lib/gloo/gloo_recursive_doubling.h"
#include "lib/gloo/gloo_reduce.h"
#include "lib/gloo/gloo_sigpipe.h"
#include "lib/gloo/gloo_wait.h"

namespace adaptcomm {
namespace {

using gloo_backend::GetReduceFn;
using gloo_backend::LazyPairs;
using gloo_backend::PeerSet;
using gloo_backend::PeerSetId;
using gloo_backend::ReduceFn;
using gloo_backend::ScopedSigpipeBlock;
using gloo_backend::WaitUntil;
using Clock = std::chrono::steady_clock;

// Slots of our own unbound-buffer traffic. Gloo's collectives build slots from prefixes 0x01..0x08
// in the top byte (and Context::nextSlot counts up from 0), so a top byte of 0x50/0x51 cannot
// collide with them.
constexpr uint64_t kSendRecvSlotBase = uint64_t{0x50} << 56;
// A group's small messages of one pair and direction, sent as one (GlooBackend::Group) on this slot
// plus the group's sequence number (below 2^56), up to this many bytes.
constexpr uint64_t kCoalescedSlotBase = uint64_t{0x52} << 56;
constexpr size_t kCoalesceMaxBytes = size_t{1} << 20;
constexpr uint64_t kReduceScatterSlotBase = uint64_t{0x51} << 56;
// The recursive-doubling allreduce's steps, in the low 8 bits, under the op's sequence number.
constexpr uint64_t kRecursiveDoublingSlotBase = uint64_t{0x53} << 56;
// reduce_scatter steps are numbered in the low 16 bits of its slot.
constexpr int kMaxRingSize = 1 << 16;
// gloo::reduce's root talks to every rank; up to this many peers that costs less latency than a
// ring allreduce (one gather step instead of n-1 allgather steps) for few connections.
constexpr int kDirectReduceMaxPeers = 15;
// The knob space of OpDesc::knobs this backend applies (TunedKnobs(): backend "gloo").
constexpr char kKnobSpace[] = "gloo";

constexpr size_t kMaxElements = static_cast<size_t>(std::numeric_limits<int32_t>::max());

// Gloo treats a zero timeout as "none": never pass one.
std::chrono::milliseconds ToMs(absl::Duration d) {
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

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

Clock::time_point DeadlineOf(const OpDesc& op) { return Clock::now() + ToMs(op.timeout); }

// Whether bcube needs only a few peers per rank on `size` ranks: at most 2 ceil(log2 size) on
// every rank (so all ranks agree). Bcube factors the world into groups; a world with a large
// prime factor (an odd world after a shrink, say 127) makes one group of nearly every rank, a
// full mesh whose pairs an op would have to connect within its timeout.
bool BcubeIsNarrow(int size) {
  int log2 = 0;
  while ((1 << log2) < size) ++log2;
  for (int r = 0; r < size; ++r) {
    if (static_cast<int>(gloo_backend::BcubePeers(r, size).size()) > 2 * log2) return false;
  }
  return true;
}

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

uint8_t* GlooBackend::Scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    scratch_.reset();
    const size_t grown = std::max(bytes, scratch_bytes_ + scratch_bytes_ / 2);
    scratch_.reset(new uint8_t[grown]);
    scratch_bytes_ = grown;
  }
  return scratch_.get();
}

absl::Status GlooBackend::Supports(const OpDesc& op) const {
  const char* kind = OpKindName(op.kind);
  // Gloo's math and segment loops index with int.
  if (absl::Status s = CheckHostOp(op, "gloo", rank(), size(), kMaxElements); !s.ok()) return s;
  if (IsReduction(op.kind)) {
    const DType dtype = op.output.dtype;
    if (GetReduceFn(dtype, op.reduce) == nullptr) {
      if (op.reduce == ReduceOp::kAvg) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gloo backend: ", kind, " avg is defined for floating-point dtypes only, not ",
            DTypeName(dtype), " (an integer average would truncate)"));
      }
      return absl::InvalidArgumentError(absl::StrCat("gloo backend: ", kind, " cannot reduce ",
                                                     DTypeName(dtype), " with op ",
                                                     static_cast<int>(op.reduce)));
    }
  }
  if ((op.kind == OpKind::kBroadcast || op.kind == OpKind::kReduce) &&
      (op.root < 0 || op.root >= size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo backend: ", kind, " root ", op.root, " is not in [0, ", size(), ")"));
  }
  const auto n = static_cast<size_t>(size());
  if (op.kind == OpKind::kAllgather && op.output.count != op.input.count * n) {
    return absl::InvalidArgumentError(absl::StrCat("gloo backend: allgather output holds ",
                                                   op.output.count, " elements, expected ",
                                                   op.input.count, " x ", size()));
  }
  if (op.kind == OpKind::kReduceScatter && op.input.count != op.output.count * n) {
    return absl::InvalidArgumentError(absl::StrCat("gloo backend: reduce_scatter input holds ",
                                                   op.input.count, " elements, expected ",
                                                   op.output.count, " x ", size()));
  }
  if (op.kind == OpKind::kReduceScatter && size() > kMaxRingSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo backend: reduce_scatter supports at most ", kMaxRingSize, " ranks"));
  }
  if (op.kind == OpKind::kAlltoall &&
      (op.input.count != op.output.count || op.input.count % n != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo backend: alltoall needs input and output of equal size, a multiple of ",
                     size(), " elements; got ", op.input.count, " and ", op.output.count));
  }
  if ((op.kind == OpKind::kAllgather || op.kind == OpKind::kReduceScatter ||
       op.kind == OpKind::kAlltoall) &&
      op.input.dtype != op.output.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("gloo backend: ", kind, " input is ",
                                                   DTypeName(op.input.dtype), " but output is ",
                                                   DTypeName(op.output.dtype)));
  }
  return CheckCap(op);
}

void GlooBackend::Interrupt(const absl::Status& reason) {
  try {
    pairs_->SignalAll(absl::StrCat("adaptcomm abort: ", reason.message()));
  } catch (const std::exception& e) {
    // Signalling is best effort; the backend is broken either way.
    ADAPTCOMM_LOG(kWarning, "gloo backend abort: signalling the pairs failed: ", e.what());
  }
}

template <typename What, typename Body>
absl::Status GlooBackend::Guarded(const OpDesc& op, What&& what, Body&& body) {
  gloo_backend::BlockSigpipeInThisThread();
  try {
    body();
    return absl::OkStatus();
  } catch (const ::gloo::IoException& e) {
    const std::string text = e.what();
    if (absl::StrContains(text, "Timed out")) {
      return absl::DeadlineExceededError(
          absl::StrCat(what(), " timed out after ", absl::FormatDuration(op.timeout), ": ", text));
    }
    return absl::UnavailableError(absl::StrCat(what(), " failed: ", text));
  } catch (const ::gloo::EnforceNotMet& e) {
    // Gloo checks its arguments before any traffic: the context is still usable.
    return absl::InvalidArgumentError(absl::StrCat(what(), " rejected by Gloo: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what(), " failed inside Gloo: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what(), " failed inside Gloo (unknown exception)"));
  }
}

absl::Status GlooBackend::Run(const OpDesc& op) {
  return RunFramed(op, [&] {
    if (absl::Status s = EnsurePeers(&op, 1, op.timeout); !s.ok()) return s;
    // Built only on failure: the success path of a small allreduce must not allocate.
    auto what = [&op] { return absl::StrCat("gloo ", OpKindName(op.kind), " seq ", op.seq); };
    return Guarded(op, what, [&] { OpDispatch::Run(op.kind, *this, op); });
  });
}

absl::Status GlooBackend::RunGroup(const std::vector<OpDesc>& ops) {
  return RunGroupFramed(ops, [&](const OpDesc& bound) {
    if (absl::Status s = EnsurePeers(ops.data(), ops.size(), bound.timeout); !s.ok()) return s;
    auto what = [&ops] { return absl::StrCat("gloo group of ", ops.size(), " op(s)"); };
    return Guarded(bound, what, [&] { Group(ops, DeadlineOf(bound)); });
  });
}

PeerSetId GlooBackend::PeersFor(const OpDesc& op) const {
  switch (op.kind) {
    case OpKind::kAllreduce:
      switch (AllreduceAlgorithm(op, op.output.bytes())) {
        case Algorithm::kBcube:
          return {PeerSet::kBcube, 0};
        case Algorithm::kRecursiveDoubling:
          return {PeerSet::kRecursiveDoubling, 0};
        default:
          return {PeerSet::kRing, 0};
      }
    case OpKind::kBroadcast:
      return {PeerSet::kBroadcast, op.root};
    case OpKind::kReduce:
      return direct_reduce_ ? PeerSetId{PeerSet::kDirectReduce, op.root} : PeerSetId{};
    case OpKind::kAllgather:
    case OpKind::kReduceScatter:
      return {};
    case OpKind::kAlltoall:
      return {PeerSet::kAll, 0};
    case OpKind::kBarrier:
      return {PeerSet::kBarrier, 0};
    case OpKind::kSend:
    case OpKind::kRecv:
      return {PeerSet::kPair, op.peer};
  }
  return {};
}

absl::Status GlooBackend::CheckCap(const OpDesc& op) const {
  if (size() == 1) return absl::OkStatus();
  const PeerSetId id = PeersFor(op);
  if (ready_[static_cast<size_t>(id.set) * static_cast<size_t>(size()) +
             static_cast<size_t>(id.root)]
          .load(std::memory_order_acquire)) {
    return absl::OkStatus();
  }
  int fresh = 0;
  for (const int p : gloo_backend::PeersOf(id, rank(), size()))
    fresh += pairs_->connected(p) ? 0 : 1;
  if (pairs_->open() + fresh <= pairs_->max_connections()) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "gloo ", OpKindName(op.kind), " seq ", op.seq, ": rank ", rank(), " would need ", fresh,
      " more connection(s) with ", pairs_->open(), " open, past gloo.max_connections = ",
      pairs_->max_connections(), " (raise it for this op's world size)"));
}

absl::Status GlooBackend::EnsurePeers(const OpDesc* ops, size_t n, absl::Duration timeout) {
  if (size() == 1) return absl::OkStatus();
  auto slot_of = [this](PeerSetId id) {
    return static_cast<size_t>(id.set) * static_cast<size_t>(size()) + static_cast<size_t>(id.root);
  };
  std::vector<int> peers;  // built only when some set is new: known sets cost a lookup
  bool all_ready = true;
  for (size_t i = 0; i < n; ++i) {
    const PeerSetId id = PeersFor(ops[i]);
    if (ready_[slot_of(id)].load(std::memory_order_acquire)) continue;
    all_ready = false;
    const std::vector<int> more = gloo_backend::PeersOf(id, rank(), size());
    peers.insert(peers.end(), more.begin(), more.end());
  }
  if (all_ready) return absl::OkStatus();
  auto what = [&] {
    return n == 1 ? absl::StrCat("gloo ", OpKindName(ops->kind), " seq ", ops->seq)
                  : absl::StrCat("gloo group of ", n, " op(s) from seq ", ops->seq);
  };
  // The frame breaks the backend on an error: pairs may be half made.
  if (absl::Status s = pairs_->Connect(peers, absl::Now() + timeout, what); !s.ok()) return s;
  for (size_t i = 0; i < n; ++i)
    ready_[slot_of(PeersFor(ops[i]))].store(true, std::memory_order_release);
  return absl::OkStatus();
}

void GlooBackend::Group(const std::vector<OpDesc>& ops, Clock::time_point deadline) {
  // The collectives first, in issue order (none waits on a send or a receive); then every send
  // and receive is posted before any is waited for: Gloo's device thread moves them all at once,
  // whatever order the peers posted theirs in.
  for (const OpDesc& op : ops) {
    if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) OpDispatch::Run(op.kind, *this, op);
  }
  std::map<std::pair<int, bool>, std::vector<const OpDesc*>> streams;  // by peer and direction
  for (const OpDesc& op : ops) {
    if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
      streams[{op.peer, op.kind == OpKind::kSend}].push_back(&op);
    }
  }
  struct Posted {
    std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
    bool send;
    std::vector<uint8_t> staging;          // a coalesced stream's bytes
    std::vector<const OpDesc*> coalesced;  // ... and its receives, to scatter it into
  };
  std::vector<Posted> posted;
  auto post = [&](int peer, bool send, void* data, size_t bytes, uint64_t slot, Posted p) {
    p.buffer = context_->createUnboundBuffer(data, bytes);
    send ? p.buffer->send(peer, slot, 0, bytes) : p.buffer->recv(peer, slot, 0, bytes);
    posted.push_back(std::move(p));
  };
  for (auto& [key, stream] : streams) {
    const auto [peer, send] = key;
    // In (tag, issue) order: the order the peer's group has them in too.
    std::stable_sort(stream.begin(), stream.end(),
                     [](const OpDesc* a, const OpDesc* b) { return a->tag < b->tag; });
    size_t total = 0;
    for (const OpDesc* op : stream) total += (send ? op->input : op->output).bytes();
    if (stream.size() < 2 || total > kCoalesceMaxBytes) {
      for (const OpDesc* op : stream) {
        const TensorView& v = send ? op->input : op->output;
        post(peer, send, v.data, v.bytes(), kSendRecvSlotBase | op->tag,
             Posted{nullptr, send, {}, {}});
      }
      continue;
    }
    // Small messages of one pair and direction go as one (both ranks decide alike from the same
    // messages): else Gloo's cost per message, not the bytes, sets the group's time.
    if (total == 0) continue;
    Posted p{nullptr, send, std::vector<uint8_t>(total), {}};
    size_t off = 0;
    for (const OpDesc* op : stream) {
      const size_t n = (send ? op->input : op->output).bytes();
      if (send && n > 0) std::memcpy(p.staging.data() + off, op->input.data, n);
      off += n;
    }
    if (!send) p.coalesced = stream;
    void* data = p.staging.data();  // before p is moved from (a moved vector keeps its bytes)
    post(peer, send, data, total, kCoalescedSlotBase | stream.front()->seq, std::move(p));
  }
  for (Posted& p : posted) {
    WaitUntil(deadline, [&](std::chrono::milliseconds t) {
      return p.send ? p.buffer->waitSend(t) : p.buffer->waitRecv(t);
    });
    size_t off = 0;
    for (const OpDesc* op : p.coalesced) {
      const size_t n = op->output.bytes();
      if (n > 0) std::memcpy(op->output.data, p.staging.data() + off, n);
      off += n;
    }
  }
}

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

void GlooBackend::Allreduce(const OpDesc& op) {
  const TensorView& v = op.output;
  if (v.count == 0 || size() == 1) return;  // avg over one rank is the identity
  const uint64_t bytes = v.bytes();
  const Algorithm algorithm = AllreduceAlgorithm(op, bytes);
  if (algorithm == Algorithm::kRecursiveDoubling) {
    gloo_backend::RecursiveDoublingAllreduce(
        *context_, v.data, v.count, bytes, GetReduceFn(v.dtype, op.reduce), Scratch(bytes),
        kRecursiveDoublingSlotBase | ((op.seq & 0xffffffffu) << 8), DeadlineOf(op));
  } else {
    GlooAllreduce(op, v.data, algorithm == Algorithm::kBcube, MaxSegmentFor(op, bytes));
  }
  if (op.reduce == ReduceOp::kAvg) elementwise::DivideInPlace(v.dtype, v.data, v.count, size());
}

void GlooBackend::GlooAllreduce(const OpDesc& op, void* data, bool bcube, uint64_t segment) {
  const TensorView& v = op.output;
  const ReduceFn fn = GetReduceFn(v.dtype, op.reduce);
  WithElementType(v.dtype, [&](auto t) {
    using T = decltype(t);
    ::gloo::AllreduceOptions opts(gloo_context_);
    opts.setOutput(static_cast<T*>(data), v.count);
    opts.setReduceFunction(fn);
    opts.setTag(static_cast<uint32_t>(op.seq));
    opts.setTimeout(ToMs(op.timeout));
    if (bcube) opts.setAlgorithm(::gloo::AllreduceOptions::Algorithm::BCUBE);
    if (segment > 0) opts.setMaxSegmentSize(static_cast<size_t>(segment));
    ::gloo::allreduce(opts);
  });
}

int64_t GlooBackend::AlgorithmFor(const OpDesc& op, uint64_t bytes) const {
  const int64_t* knob = op.knobs != nullptr ? op.knobs->Find(kKnobSpace, "algorithm") : nullptr;
  if (knob != nullptr) return *knob;
  Algorithm static_choice = algorithm_;
  if (algorithm_ == Algorithm::kAuto) {
    static_choice = !config::GlooAutoIsLatencyBound(bytes, size()) ? Algorithm::kRing
                    : auto_bcube_                                  ? Algorithm::kBcube
                                                                   : Algorithm::kRecursiveDoubling;
  }
  return config::BandValue(tuned_algorithm_, bytes, static_cast<int64_t>(static_choice));
}

GlooBackend::Algorithm GlooBackend::AllreduceAlgorithm(const OpDesc& op, uint64_t bytes) const {
  switch (AlgorithmFor(op, bytes)) {
    case static_cast<int64_t>(Algorithm::kBcube):
      return bcube_fits_ ? Algorithm::kBcube : Algorithm::kRing;
    case static_cast<int64_t>(Algorithm::kRecursiveDoubling):
      return doubling_fits_ ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
    default:
      return Algorithm::kRing;
  }
}

uint64_t GlooBackend::MaxSegmentFor(const OpDesc& op, uint64_t bytes) const {
  const int64_t* knob =
      op.knobs != nullptr ? op.knobs->Find(kKnobSpace, "max_segment_bytes") : nullptr;
  return static_cast<uint64_t>(std::max<int64_t>(
      knob != nullptr ? *knob
                      : config::BandValue(tuned_max_segment_bytes_, bytes,
                                          static_cast<int64_t>(max_segment_bytes_)),
      0));
}

void GlooBackend::Broadcast(const OpDesc& op) {
  const TensorView& v = op.output;
  if (v.count == 0 || size() == 1) return;
  WithElementType(v.dtype, [&](auto t) {
    using T = decltype(t);
    ::gloo::BroadcastOptions opts(gloo_context_);
    opts.setOutput(static_cast<T*>(v.data), v.count);  // in place: no input on any rank
    opts.setRoot(op.root);
    opts.setTag(static_cast<uint32_t>(op.seq));
    opts.setTimeout(ToMs(op.timeout));
    ::gloo::broadcast(opts);
  });
}

void GlooBackend::Reduce(const OpDesc& op) {
  const TensorView& v = op.output;
  if (v.count == 0 || size() == 1) return;
  const ReduceFn fn = GetReduceFn(v.dtype, op.reduce);
  const bool root = rank() == op.root;
  // Gloo's reduce is a ring reduce-scatter that writes partial sums into every rank's output;
  // non-roots get scratch as output so their buffer stays as the caller left it (as with NCCL).
  void* out = root ? v.data : Scratch(v.bytes());
  if (!direct_reduce_) {
    // The same bytes through the root's link as gloo::reduce's gather, over the ring's pairs.
    if (!root) std::memcpy(out, v.data, v.bytes());
    GlooAllreduce(op, out, false, MaxSegmentFor(op, v.bytes()));
  } else {
    WithElementType(v.dtype, [&](auto t) {
      using T = decltype(t);
      ::gloo::ReduceOptions opts(gloo_context_);
      if (!root) opts.setInput(static_cast<T*>(v.data), v.count);
      opts.setOutput(static_cast<T*>(out), v.count);
      opts.setRoot(op.root);
      opts.setReduceFunction(fn);
      opts.setTag(static_cast<uint32_t>(op.seq));
      opts.setTimeout(ToMs(op.timeout));
      ::gloo::reduce(opts);
    });
  }
  if (root && op.reduce == ReduceOp::kAvg) {
    elementwise::DivideInPlace(v.dtype, v.data, v.count, size());
  }
}

void GlooBackend::Allgather(const OpDesc& op) {
  const size_t block = op.input.bytes();
  if (block == 0) return;
  auto* out = static_cast<uint8_t*>(op.output.data);
  const void* in = op.input.data;
  uint8_t* own = out + static_cast<size_t>(rank()) * block;
  if (size() == 1) {
    std::memmove(out, in, block);
    return;
  }
  // In place (input is this rank's block of the output): Gloo allgathers without an input.
  const bool in_place = in == own;
  if (!in_place && Overlaps(in, block, out, op.output.bytes())) {
    uint8_t* staged = Scratch(block);
    std::memcpy(staged, in, block);
    in = staged;
  }
  WithElementType(op.output.dtype, [&](auto t) {
    using T = decltype(t);
    ::gloo::AllgatherOptions opts(gloo_context_);
    if (!in_place) opts.setInput(static_cast<T*>(const_cast<void*>(in)), op.input.count);
    opts.setOutput(reinterpret_cast<T*>(out), op.output.count);
    opts.setTag(static_cast<uint32_t>(op.seq));
    opts.setTimeout(ToMs(op.timeout));
    ::gloo::allgather(opts);
  });
}

void GlooBackend::Alltoall(const OpDesc& op) {
  const size_t bytes = op.input.bytes();
  if (bytes == 0) return;
  const void* in = op.input.data;
  void* out = op.output.data;
  if (size() == 1) {
    std::memmove(out, in, bytes);
    return;
  }
  // Gloo copies this rank's own block locally while other blocks are still being sent from the
  // input: an input overlapping the output is staged first.
  if (Overlaps(in, bytes, out, bytes)) {
    uint8_t* staged = Scratch(bytes);
    std::memcpy(staged, in, bytes);
    in = staged;
  }
  WithElementType(op.output.dtype, [&](auto t) {
    using T = decltype(t);
    ::gloo::AlltoallOptions opts(gloo_context_);
    opts.setInput(static_cast<T*>(const_cast<void*>(in)), op.input.count);
    opts.setOutput(static_cast<T*>(out), op.output.count);
    opts.setTag(static_cast<uint32_t>(op.seq));
    opts.setTimeout(ToMs(op.timeout));
    ::gloo::alltoall(opts);
  });
}

void GlooBackend::Barrier(const OpDesc& op) {
  if (size() == 1) return;
  ::gloo::BarrierOptions opts(gloo_context_);
  opts.setTag(static_cast<uint32_t>(op.seq));
  opts.setTimeout(ToMs(op.timeout));
  ::gloo::barrier(opts);
}

void GlooBackend::Send(const OpDesc& op) {
  const Clock::time_point deadline = DeadlineOf(op);
  auto buf = context_->createUnboundBuffer(op.input.data, op.input.bytes());
  buf->send(op.peer, kSendRecvSlotBase | op.tag, 0, op.input.bytes());
  WaitUntil(deadline, [&](std::chrono::milliseconds t) { return buf->waitSend(t); });
}

void GlooBackend::Recv(const OpDesc& op) {
  const Clock::time_point deadline = DeadlineOf(op);
  auto buf = context_->createUnboundBuffer(op.output.data, op.output.bytes());
  buf->recv(op.peer, kSendRecvSlotBase | op.tag, 0, op.output.bytes());
  WaitUntil(deadline, [&](std::chrono::milliseconds t) { return buf->waitRecv(t); });
}

// Ring reduce-scatter over unbound buffers: n-1 steps, each sending one block to the right
// neighbour and reducing the block received from the left with this rank's input block, so
// every rank moves (n-1)/n of the input. At step s rank r sends the partial sum of block
// (r-1-s) mod n and receives that of block (r-2-s) mod n; the last step yields block r.
void GlooBackend::ReduceScatter(const OpDesc& op) {
  const size_t n = static_cast<size_t>(size());
  const size_t r = static_cast<size_t>(rank());
  const size_t count = op.output.count;
  const size_t block = op.output.bytes();
  if (block == 0) return;
  const Clock::time_point deadline = DeadlineOf(op);
  const auto* in = static_cast<const uint8_t*>(op.input.data);
  auto* out = static_cast<uint8_t*>(op.output.data);
  if (n == 1) {
    std::memmove(out, in, block);
    return;
  }
  // Output written only at the last step, from block r of the input: the output may be exactly
  // that block (in place); any other overlap with the input is staged first.
  const bool stage = out != in + r * block && Overlaps(in, block * n, out, block);
  uint8_t* scratch = Scratch(block * 3 + (stage ? block * n : 0));
  uint8_t* recv_block = scratch;
  uint8_t* acc[2] = {scratch + block, scratch + 2 * block};
  if (stage) {
    std::memcpy(scratch + 3 * block, in, block * n);
    in = scratch + 3 * block;
  }
  const ReduceFn fn = GetReduceFn(op.output.dtype, op.reduce);
  const size_t right = (r + 1) % n;
  const size_t left = (r + n - 1) % n;
  const uint64_t slot_base = kReduceScatterSlotBase | ((op.seq & 0xffffffffu) << 16);

  auto recv_buf = context_->createUnboundBuffer(recv_block, block);
  const uint8_t* send_ptr = in + ((r + n - 1) % n) * block;
  for (size_t s = 0; s + 1 < n; ++s) {
    const uint64_t slot = slot_base | s;
    recv_buf->recv(static_cast<int>(left), slot, 0, block);
    auto send_buf = context_->createUnboundBuffer(const_cast<uint8_t*>(send_ptr), block);
    send_buf->send(static_cast<int>(right), slot, 0, block);
    WaitUntil(deadline, [&](std::chrono::milliseconds t) { return recv_buf->waitRecv(t); });
    const size_t blk = (r + 2 * n - 2 - s) % n;
    uint8_t* dst = s + 2 == n ? out : acc[s & 1];
    fn(dst, recv_block, in + blk * block, count);
    WaitUntil(deadline, [&](std::chrono::milliseconds t) { return send_buf->waitSend(t); });
    send_ptr = dst;
  }
  if (op.reduce == ReduceOp::kAvg) {
    elementwise::DivideInPlace(op.output.dtype, out, count, size());
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(const GlooBackendOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("gloo backend: rank ", options.rank,
                                                   " not in a world of size ", options.size));
  }
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("gloo backend: no rendezvous store");
  }
  if (options.iface.empty() && options.hostname.empty()) {
    return absl::InvalidArgumentError(
        "gloo backend: set iface or hostname (an empty Gloo attr resolves the host name and may "
        "pick an interface the peers cannot reach)");
  }
  if (options.max_connections < std::min(2, options.size - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gloo backend: max_connections ", options.max_connections, " is below the 2 a ring needs"));
  }
  if (options.init_timeout <= absl::ZeroDuration() ||
      options.default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo backend: timeouts must be positive");
  }

  ::gloo::transport::tcp::attr attr;
  std::string where;
  if (!options.iface.empty()) {
    attr.iface = options.iface;
    where = absl::StrCat("interface ", options.iface);
  } else {
    attr.hostname = options.hostname;
    where = absl::StrCat("host ", options.hostname);
  }
  // The device starts its event-loop thread, which inherits this mask (see above); connecting
  // may write too.
  ScopedSigpipeBlock no_sigpipe;
  std::shared_ptr<::gloo::transport::Device> device;
  try {
    device = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("gloo backend rank ", options.rank, ": cannot use ", where, ": ", e.what()));
  }

  auto context = std::make_shared<LazyContext>(options.rank, options.size);
  context->setTimeout(ToMs(options.default_timeout));
  std::shared_ptr<::gloo::transport::Context> transport =
      device->createContext(options.rank, options.size);
  transport->setTimeout(ToMs(options.default_timeout));
  context->Attach(device, transport);
  auto pairs = std::make_unique<gloo_backend::LazyPairs>(
      transport, options.store, options.max_connections, ToMs(options.default_timeout));
  // The ring neighbours now, within the init bound: every ring-based op needs them, and a rank
  // whose neighbours never come fails here, as creation did when it connected every pair.
  const std::string prefix =
      absl::StrCat("gloo backend rank ", options.rank, " of ", options.size, " (", where, ")");
  absl::Status ring = pairs->Connect(
      gloo_backend::RingPeers(options.rank, options.size), absl::Now() + options.init_timeout,
      [&] { return absl::StrCat(prefix, " connecting its ring neighbours"); });
  if (!ring.ok()) return ring;
  ADAPTCOMM_LOG(kDebug, prefix, " connected its ring neighbours");
  return std::unique_ptr<Backend>(new GlooBackend(std::move(context), std::move(pairs), options));
}

std::string GlooVersion() {
  return absl::StrCat(GLOO_VERSION_MAJOR, ".", GLOO_VERSION_MINOR, ".", GLOO_VERSION_PATCH);
}

// Tuning reads Gloo's default segment cap from lib/config/gloo_segment.h, which cannot see Gloo's
// headers: it must be the cap this Gloo runs with.
static_assert(config::kGlooDefaultMaxSegmentBytes ==
              ::gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize);

}  // namespace adaptcomm

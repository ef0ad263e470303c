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
#include "lib/gloo/gloo_backend_impl.h"
#include "lib/gloo/gloo_pairs.h"
#include "lib/gloo/gloo_peers.h"
#include "lib/gloo/gloo_recursive_doubling.h"
#include "lib/gloo/gloo_reduce.h"
#include "lib/gloo/gloo_sigpipe.h"
#include "lib/gloo/gloo_wait.h"

namespace adaptcomm {
namespace gloo_backend {

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

}  // namespace gloo_backend

using gloo_backend::GlooBackend;
using gloo_backend::LazyContext;
using gloo_backend::LazyPairs;
using gloo_backend::ScopedSigpipeBlock;
using gloo_backend::ToMs;

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

// HierBackend, the hierarchical Backend: its class and the helpers its files share
// (hier_backend.cc: create, Supports, Run, the steps on inner backends; hier_collectives.cc: the
// collectives; hier_group.cc: sends, receives and groups of ops). Internal to lib/hier.
#ifndef ADAPTCOMM_LIB_HIER_HIER_BACKEND_CLASS_H_
#define ADAPTCOMM_LIB_HIER_HIER_BACKEND_CLASS_H_

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "lib/backend/backend_base.h"
#include "lib/backend/op_dispatch.h"
#include "lib/base/elementwise.h"
#include "lib/hier/hier_backend.h"

namespace adaptcomm::hier {

#define HIER_RETURN_IF_ERROR(expr)                     \
  do {                                                 \
    if (absl::Status _s = (expr); !_s.ok()) return _s; \
  } while (false)

// Who is where: identical on every rank (computed from the same host_of).
struct Layout {
  int hosts = 0;
  int max_local = 0;
  std::vector<std::vector<int>> ranks_of;  // per host: its global ranks, ascending
  std::vector<int> local_of;               // per global rank: its local rank
};

inline absl::StatusOr<Layout> MakeLayout(const HierTopology& t) {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("hierarchical backend: ", parts...));
  };
  if (t.world_size < 1 || t.rank < 0 || t.rank >= t.world_size) {
    return bad("rank ", t.rank, " is not in a world of ", t.world_size);
  }
  if (t.host_of.size() != static_cast<size_t>(t.world_size)) {
    return bad("host_of has ", t.host_of.size(), " entries for a world of ", t.world_size);
  }
  Layout l;
  l.hosts = *std::max_element(t.host_of.begin(), t.host_of.end()) + 1;
  l.ranks_of.resize(static_cast<size_t>(std::max(l.hosts, 0)));
  l.local_of.resize(t.host_of.size());
  for (int g = 0; g < t.world_size; ++g) {
    const int h = t.host_of[static_cast<size_t>(g)];
    if (h < 0) return bad("rank ", g, " has host index ", h);
    auto& ranks = l.ranks_of[static_cast<size_t>(h)];
    l.local_of[static_cast<size_t>(g)] = static_cast<int>(ranks.size());
    ranks.push_back(g);
  }
  for (int h = 0; h < l.hosts; ++h) {
    const size_t n = l.ranks_of[static_cast<size_t>(h)].size();
    if (n == 0) return bad("host index ", h, " has no rank (host indices must be dense)");
    l.max_local = std::max(l.max_local, static_cast<int>(n));
  }
  if (l.local_of[static_cast<size_t>(t.rank)] != t.local_rank) {
    return bad("rank ", t.rank, " says it is local rank ", t.local_rank, " but host_of makes it ",
               l.local_of[static_cast<size_t>(t.rank)]);
  }
  return l;
}

inline TensorView View(void* data, size_t count, DType dtype) {
  return TensorView{data, count, dtype, Device::Cpu(), nullptr};
}

inline OpDesc Inner(OpKind kind, TensorView input, TensorView output,
                    ReduceOp reduce = ReduceOp::kSum, int root = 0) {
  OpDesc d;
  d.kind = kind;
  d.input = input;
  d.output = output;
  d.reduce = reduce == ReduceOp::kAvg ? ReduceOp::kSum : reduce;
  d.root = root;
  return d;
}

class HierBackend final : public BackendBase, public GroupRunner {
 public:
  HierBackend(HierTopology topo, Layout layout, std::unique_ptr<Backend> intra,
              std::unique_ptr<Backend> inter, PairTransport pair_transport)
      : BackendBase(
            {.name = "hier",
             .rank = topo.rank,
             .size = topo.world_size,
             .capabilities = CapabilitiesOf(layout, *intra, inter.get(), pair_transport != nullptr),
             .label = "hierarchical"}),
        topo_(std::move(topo)),
        layout_(std::move(layout)),
        host_(topo_.host_of[static_cast<size_t>(topo_.rank)]),
        local_(topo_.local_rank),
        locals_(static_cast<int>(layout_.ranks_of[static_cast<size_t>(host_)].size())),
        intra_(std::move(intra)),
        inter_(std::move(inter)),
        pair_transport_(std::move(pair_transport)) {}

  absl::Status Supports(const OpDesc& op) const override;
  absl::Status Run(const OpDesc& op) override;
  GroupRunner* groups() override { return this; }
  absl::Status RunGroup(const std::vector<OpDesc>& ops) override;  // hier_group.cc
  // This backend's failure, else the first inner backend's, naming its level.
  absl::Status health() const override;

 private:
  friend struct ::adaptcomm::OpDispatch;

  // What the levels can carry between them.
  static Capabilities CapabilitiesOf(const Layout& layout, const Backend& intra,
                                     const Backend* inter, bool pair_links);
  // Aborts the inner backends and links: ends their ops, and the peers' waits on this rank.
  void Interrupt(const absl::Status& reason) override;
  void OnBroken(const absl::Status& failure) override;

  // kPair: a two-rank link between this rank and a rank of another host (pair_transport_).
  enum class Level { kIntra, kInter, kPair };
  // The outer op in flight.
  struct Outer {
    const OpDesc& op;
    absl::Time start;
    absl::Time deadline;
  };

  bool leader() const { return local_ == 0; }
  bool multi_host() const { return layout_.hosts > 1; }
  int HostOf(int g) const { return topo_.host_of[static_cast<size_t>(g)]; }
  int LocalOf(int g) const { return layout_.local_of[static_cast<size_t>(g)]; }
  int Global(int host, int local) const {
    return layout_.ranks_of[static_cast<size_t>(host)][static_cast<size_t>(local)];
  }
  std::string Where(Level level, int peer = -1) const;
  absl::Status Reword(const Outer& o, Level level, absl::string_view step,
                      const absl::Status& s) const;
  uint8_t* Scratch(size_t bytes);

  // Runs one inner op with what is left of the outer op's time. `seq` numbers the inner op on its
  // backend; collectives take the next one, point-to-point moves reuse the current one.
  absl::Status Step(const Outer& o, Level level, absl::string_view step, OpDesc inner,
                    Backend* pair = nullptr);
  absl::Status Intra(const Outer& o, absl::string_view step, OpDesc inner) {
    inner.seq = ++intra_seq_;
    return Step(o, Level::kIntra, step, inner);
  }
  absl::Status Inter(const Outer& o, absl::string_view step, OpDesc inner) {
    inner.seq = ++inter_seq_;
    return Step(o, Level::kInter, step, inner);
  }
  // Intra point-to-point on an internal tag (user tags stay below kHierInternalTagBase).
  absl::Status IntraP2p(const Outer& o, absl::string_view step, OpKind kind, int local,
                        TensorView v, uint32_t tag);

  // Leader <-> local moves of `count` elements per local rank. Gather: the leader's `dst` gets
  // local rank j's `src` as block j. Scatter: local rank j's `dst` gets block j of the leader's
  // `src`. Every local rank calls them; the leader's buffers hold locals_ blocks.
  absl::Status GatherToLeader(const Outer& o, const void* src, size_t count, DType t, void* dst);
  absl::Status ScatterFromLeader(const Outer& o, const void* src, size_t count, DType t, void* dst);

  absl::Status Dispatch(const Outer& o);
  absl::Status Allreduce(const Outer& o);
  absl::Status Broadcast(const Outer& o);
  absl::Status Reduce(const Outer& o);
  absl::Status Allgather(const Outer& o);
  absl::Status ReduceScatter(const Outer& o);
  absl::Status Alltoall(const Outer& o);
  absl::Status Barrier(const Outer& o);
  absl::Status Send(const Outer& o) { return SendRecv(o); }
  absl::Status Recv(const Outer& o) { return SendRecv(o); }
  absl::Status SendRecv(const Outer& o);
  // Point-to-point routing (hier_group.cc): which level carries a send/recv with global rank
  // `peer`, and the peer's rank there.
  struct Route {
    Level level;
    int peer;
  };
  Route RouteTo(int peer) const;
  // The link to `peer` on another host, made on first use within what is left of `o`'s bound
  // (both ranks of a send/recv run it, so both make it then).
  absl::StatusOr<Backend*> PairTo(const Outer& o, int peer);
  // Runs `ops` (point-to-point only, for one inner backend) as one group there.
  absl::Status InnerGroup(const Outer& o, Level level, Backend& b, std::vector<OpDesc> ops);
  absl::Status SupportsP2p(const OpDesc& op) const;
  void FinishAvg(const OpDesc& op, const TensorView& v) const {
    if (op.reduce == ReduceOp::kAvg)
      elementwise::DivideInPlace(v.dtype, v.data, v.count, topo_.world_size);
  }

  const HierTopology topo_;
  const Layout layout_;
  const int host_;
  const int local_;
  const int locals_;  // ranks on this host
  const std::unique_ptr<Backend> intra_;
  const std::unique_ptr<Backend> inter_;  // leaders of a multi-host job only
  const PairTransport pair_transport_;    // may be empty: cross-host pairs of non-leaders refused
  // The links made so far, by global peer rank. Written by Run()'s thread, read by Abort().
  mutable absl::Mutex pairs_mu_;
  std::map<int, std::unique_ptr<Backend>> pairs_ ABSL_GUARDED_BY(pairs_mu_);
  uint64_t pair_seq_ = 0;

  // Run() is called by one thread at a time: these need no lock.
  uint64_t intra_seq_ = 0;
  uint64_t inter_seq_ = 0;
  std::vector<uint8_t> scratch_;
};

}  // namespace adaptcomm::hier

#endif  // ADAPTCOMM_LIB_HIER_HIER_BACKEND_CLASS_H_

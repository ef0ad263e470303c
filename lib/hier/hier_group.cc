// HierBackend's point-to-point moves and groups of ops: routing a send/recv to the level that links
// the two ranks (inside the host, between leaders, or a pair link made on first use), and running
// a group level by level in an order every rank shares.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/hier/hier_backend_class.h"

namespace adaptcomm::hier {

HierBackend::Route HierBackend::RouteTo(int peer) const {
  if (HostOf(peer) == host_) return Route{Level::kIntra, LocalOf(peer)};
  if (leader() && LocalOf(peer) == 0) return Route{Level::kInter, HostOf(peer)};
  // On a two-rank link: rank 0 there is the smaller global rank.
  return Route{Level::kPair, topo_.rank < peer ? 1 : 0};
}

absl::Status HierBackend::SupportsP2p(const OpDesc& op) const {
  auto refuse = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpKindName(op.kind), " #", op.seq, " on rank ", topo_.rank, ": ", parts...));
  };
  if (op.tag >= kHierInternalTagBase) {
    return refuse("tag ", op.tag, " is reserved by the hierarchical backend (tags from ",
                  kHierInternalTagBase, " up)");
  }
  if (op.peer < 0 || op.peer >= topo_.world_size || op.peer == topo_.rank) {
    return refuse("peer ", op.peer, " is not another rank of a world of ", topo_.world_size);
  }
  const Route route = RouteTo(op.peer);
  OpDesc d = op;
  d.peer = route.peer;
  if (route.level == Level::kIntra) return intra_->Supports(d);
  if (route.level == Level::kInter) return inter_->Supports(d);
  if (pair_transport_ == nullptr) {
    return refuse("rank ", op.peer, " is on host ", HostOf(op.peer), " and rank ", topo_.rank,
                  " on host ", host_,
                  ": without pair links (this backend has none) point-to-point data moves between "
                  "hosts only between host leaders (local rank 0)");
  }
  // The link does not exist before the pair's first op; it carries host memory as the intra-host
  // backend does (refused above for device memory).
  return absl::OkStatus();
}

absl::StatusOr<Backend*> HierBackend::PairTo(const Outer& o, int peer) {
  {
    absl::MutexLock lock(&pairs_mu_);
    if (auto it = pairs_.find(peer); it != pairs_.end()) return it->second.get();
  }
  const absl::Duration left = o.deadline - absl::Now();
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(absl::StrCat("no time left to link to rank ", peer));
  }
  absl::StatusOr<std::unique_ptr<Backend>> link = pair_transport_(peer, left);
  if (!link.ok()) {
    return absl::Status(link.status().code(),
                        absl::StrCat("linking to rank ", peer, " on host ", HostOf(peer), ": ",
                                     link.status().message()));
  }
  absl::MutexLock lock(&pairs_mu_);
  Backend* raw = link->get();
  // Read under pairs_mu_: an Abort() that came after aborts the link with the others.
  if (aborted()) (*link)->Abort(absl::AbortedError("hierarchical backend aborted"));
  pairs_[peer] = *std::move(link);
  return raw;
}

absl::Status HierBackend::SendRecv(const Outer& o) {
  OpDesc d = o.op;
  const Route route = RouteTo(d.peer);
  d.peer = route.peer;
  const std::string step =
      absl::StrCat(d.kind == OpKind::kSend ? "send to" : "receive from", " rank ", o.op.peer);
  switch (route.level) {
    case Level::kIntra:
      d.seq = intra_seq_;
      return Step(o, Level::kIntra, step, d);
    case Level::kInter:
      d.seq = inter_seq_;
      return Step(o, Level::kInter, step, d);
    case Level::kPair: {
      absl::StatusOr<Backend*> link = PairTo(o, o.op.peer);
      if (!link.ok()) return Reword(o, Level::kPair, step, link.status());
      d.seq = ++pair_seq_;
      return Step(o, Level::kPair, step, d, *link);
    }
  }
  return absl::InternalError("unknown level");
}

absl::Status HierBackend::InnerGroup(const Outer& o, Level level, Backend& b,
                                     std::vector<OpDesc> ops) {
  if (ops.empty()) return absl::OkStatus();
  const absl::Duration left = o.deadline - absl::Now();
  const std::string step = absl::StrCat("group of ", ops.size(), " send(s)/receive(s)");
  if (left <= absl::ZeroDuration()) {
    return Reword(o, level, step,
                  absl::DeadlineExceededError("not started: the group's bound was used up"));
  }
  for (OpDesc& d : ops) d.timeout = left;
  absl::Status s;
  if (GroupRunner* runner = b.groups(); runner != nullptr) {
    s = runner->RunGroup(ops);
  } else {
    for (const OpDesc& d : ops) {
      if (s = b.Run(d); !s.ok()) break;
    }
  }
  return s.ok() ? s : Reword(o, level, step, s);
}

absl::Status HierBackend::RunGroup(const std::vector<OpDesc>& ops) {
  return RunGroupFramed(ops, [&](const OpDesc& bound) -> absl::Status {
    const absl::Time start = absl::Now();
    const Outer group{bound, start, start + bound.timeout};
    // Collectives first, in issue order, on every rank alike (none waits on a send or receive).
    for (const OpDesc& op : ops) {
      if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) continue;
      const absl::Time now = absl::Now();
      const Outer o{op, now, std::min(now + op.timeout, group.deadline)};
      if (absl::Status s = Dispatch(o); !s.ok()) return s;
    }
    // Then each level's sends and receives as one inner group, level after level: within the
    // host, among leaders, then every pair link by its (smaller, larger) global ranks. Every rank
    // takes its levels in that one order, so the first unfinished one of all has every rank it
    // links in it, and completes.
    std::vector<OpDesc> intra, inter;
    std::map<std::pair<int, int>, std::vector<OpDesc>> pairs;
    for (const OpDesc& op : ops) {
      if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) continue;
      const Route route = RouteTo(op.peer);
      OpDesc d = op;
      d.peer = route.peer;
      if (route.level == Level::kIntra) {
        d.seq = intra_seq_;
        intra.push_back(d);
      } else if (route.level == Level::kInter) {
        d.seq = inter_seq_;
        inter.push_back(d);
      } else {
        pairs[{std::min(topo_.rank, op.peer), std::max(topo_.rank, op.peer)}].push_back(d);
      }
    }
    if (absl::Status s = InnerGroup(group, Level::kIntra, *intra_, std::move(intra)); !s.ok()) {
      return s;
    }
    if (!inter.empty()) {
      if (absl::Status s = InnerGroup(group, Level::kInter, *inter_, std::move(inter)); !s.ok()) {
        return s;
      }
    }
    for (auto& [key, pair_ops] : pairs) {
      const int peer = key.first == topo_.rank ? key.second : key.first;
      absl::StatusOr<Backend*> link = PairTo(group, peer);
      if (!link.ok()) return Reword(group, Level::kPair, "link", link.status());
      for (OpDesc& d : pair_ops) d.seq = ++pair_seq_;
      if (absl::Status s = InnerGroup(group, Level::kPair, **link, std::move(pair_ops)); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace adaptcomm::hier

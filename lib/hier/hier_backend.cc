#include "lib/hier/hier_backend.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "lib/base/elementwise.h"
#include "lib/base/op_checks.h"
#include "lib/base/op_views.h"
#include "lib/hier/hier_backend_class.h"

namespace adaptcomm {
namespace hier {

Capabilities HierBackend::capabilities() const {
  const Capabilities in = intra_->capabilities();
  Capabilities c;
  c.host_memory = true;
  c.device_memory = false;
  c.native_bf16 = false;
  c.native_avg = false;
  // Every pair can talk: on one host, over pair links, or when every rank is its host's leader.
  c.send_recv = in.send_recv && (!multi_host() || pair_transport_ != nullptr ||
                                 (layout_.max_local == 1 && inter_->capabilities().send_recv));
  c.abortable = in.abortable && (inter_ == nullptr || inter_->capabilities().abortable);
  return c;
}

std::string HierBackend::Where(Level level, int peer) const {
  if (level == Level::kPair) {
    return absl::StrCat("between hosts (global rank ", topo_.rank, " on host ", host_,
                        ", its link to rank ", peer, ")");
  }
  if (level == Level::kInter) {
    return absl::StrCat("between hosts (leader of host ", host_, ", global rank ", topo_.rank, ")");
  }
  return absl::StrCat("within host ", host_, " (global rank ", topo_.rank, ", local rank ", local_,
                      " of ", locals_, ")");
}

absl::Status HierBackend::Reword(const Outer& o, Level level, absl::string_view step,
                                 const absl::Status& s) const {
  return absl::Status(s.code(), absl::StrCat(OpKindName(o.op.kind), " #", o.op.seq, ": ",
                                             Where(level), ", ", step, ": ", s.message()));
}

absl::Status HierBackend::Step(const Outer& o, Level level, absl::string_view step, OpDesc inner,
                               Backend* pair) {
  const absl::Time now = absl::Now();
  const absl::Duration left = o.deadline - now;
  if (left <= absl::ZeroDuration()) {
    return Reword(o, level, step,
                  absl::DeadlineExceededError(absl::StrCat(
                      "not started: the op's bound of ", absl::FormatDuration(o.op.timeout),
                      " was used up (", absl::FormatDuration(now - o.start), " since it began)")));
  }
  inner.timeout = left;
  Backend& b = level == Level::kPair ? *pair : level == Level::kIntra ? *intra_ : *inter_;
  absl::Status s = b.Run(inner);
  if (s.ok()) return s;
  if (absl::IsInvalidArgument(s) && o.op.kind != OpKind::kSend && o.op.kind != OpKind::kRecv) {
    // Supports() let the op through, and other ranks may be past this step already: a refusal
    // now is our bug, and the backend must break like on any other failure mid-op.
    s = absl::InternalError(absl::StrCat("refused by the ", b.name(),
                                         " backend after Supports() "
                                         "accepted the op: ",
                                         s.message()));
  }
  return Reword(o, level, step, s);
}

absl::Status HierBackend::IntraP2p(const Outer& o, absl::string_view step, OpKind kind, int local,
                                   TensorView v, uint32_t tag) {
  OpDesc d = Inner(kind, v, v);
  d.peer = local;
  d.tag = kHierInternalTagBase | (tag & 0xffffu);
  d.seq = intra_seq_;
  return Step(o, Level::kIntra, step, d);
}

uint8_t* HierBackend::Scratch(size_t bytes) {
  if (scratch_.size() < bytes) {
    scratch_.clear();
    scratch_.shrink_to_fit();
    scratch_.resize(bytes);
  }
  return scratch_.data();
}

absl::Status HierBackend::Supports(const OpDesc& op) const {
  auto refuse = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpKindName(op.kind), " #", op.seq, " on rank ", topo_.rank, ": ", parts...));
  };
  for (const TensorView* v : {&op.input, &op.output}) {
    if (v->data != nullptr && v->device.is_cuda()) {
      return refuse("the hierarchical backend needs host memory, got a buffer on cuda:",
                    v->device.index);
    }
  }
  const TensorView& main =
      op.kind == OpKind::kSend || op.kind == OpKind::kReduceScatter ? op.input : op.output;
  if (IsReduction(op.kind) && op.reduce == ReduceOp::kAvg && !IsFloatingPoint(main.dtype)) {
    return refuse("avg of ", DTypeName(main.dtype),
                  " is not defined (an integer average would truncate)");
  }
  if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) return SupportsP2p(op);
  if (!multi_host()) return intra_->Supports(op);
  if (op.kind == OpKind::kBarrier) return absl::OkStatus();
  // The inner steps run with this dtype and reduce op on buffers up to the op's largest.
  OpDesc probe =
      Inner(IsReduction(op.kind) ? OpKind::kAllreduce : OpKind::kBroadcast, main, main, op.reduce);
  if (op.kind == OpKind::kAlltoall && (op.input.count % topo_.world_size) != 0) {
    return refuse("alltoall of ", op.input.count, " elements cannot be split into ",
                  topo_.world_size, " equal blocks");
  }
  if (absl::Status s = intra_->Supports(probe); !s.ok()) {
    return refuse("the intra-host ", intra_->name(), " backend refuses it: ", s.message());
  }
  if (inter_ != nullptr) {
    if (absl::Status s = inter_->Supports(probe); !s.ok()) {
      return refuse("the inter-host ", inter_->name(), " backend refuses it: ", s.message());
    }
  }
  return absl::OkStatus();
}

absl::Status HierBackend::Run(const OpDesc& op) {
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) {
      return BrokenBackendRefusal("hierarchical", op, broken_);
    }
  }
  HIER_RETURN_IF_ERROR(Supports(op));
  const absl::Time start = absl::Now();
  const Outer o{op, start, start + op.timeout};
  absl::Status s = Dispatch(o);
  // A point-to-point op refused by the inner backend moved no data: nothing to break.
  if (s.ok() || absl::IsInvalidArgument(s)) return s;
  return Break(std::move(s));
}

absl::Status HierBackend::Break(absl::Status s) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) {
      // Aborted: the op fails with the abort's reason, and says where it was interrupted.
      return absl::Status(broken_.code(),
                          absl::StrCat(broken_.message(), "; interrupted in ", s.message()));
    }
    if (broken_.ok()) broken_ = s;
  }
  // The peers of this rank may be waiting on a step it will never run: make theirs fail now.
  const absl::Status why =
      absl::AbortedError(absl::StrCat("rank ", topo_.rank, " failed: ", s.message()));
  intra_->Abort(why);
  if (inter_ != nullptr) inter_->Abort(why);
  absl::MutexLock lock(&pairs_mu_);
  for (auto& [peer, link] : pairs_) link->Abort(why);
  return s;
}

void HierBackend::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    if (broken_.ok()) {
      broken_ = absl::AbortedError(
          absl::StrCat("hierarchical backend aborted: ",
                       reason.ok() ? std::string("no reason given") : reason.ToString()));
    }
  }
  intra_->Abort(reason);
  if (inter_ != nullptr) inter_->Abort(reason);
  absl::MutexLock lock(&pairs_mu_);
  for (auto& [peer, link] : pairs_) link->Abort(reason);
}

absl::Status HierBackend::health() const {
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
  }
  if (absl::Status s = intra_->health(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(Where(Level::kIntra), ": ", s.message()));
  }
  if (inter_ != nullptr) {
    if (absl::Status s = inter_->health(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(Where(Level::kInter), ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status HierBackend::Dispatch(const Outer& o) {
  const OpDesc& op = o.op;
  if (!multi_host() && op.kind != OpKind::kSend && op.kind != OpKind::kRecv) {
    return Intra(o, "whole op on the only host", op);
  }
  switch (op.kind) {
    case OpKind::kAllreduce:
      return Allreduce(o);
    case OpKind::kBroadcast:
      return Broadcast(o);
    case OpKind::kReduce:
      return Reduce(o);
    case OpKind::kAllgather:
      return Allgather(o);
    case OpKind::kReduceScatter:
      return ReduceScatter(o);
    case OpKind::kAlltoall:
      return Alltoall(o);
    case OpKind::kBarrier:
      return Barrier(o);
    case OpKind::kSend:
    case OpKind::kRecv:
      return SendRecv(o);
  }
  return absl::InternalError("unknown op kind");
}

absl::Status HierBackend::GatherToLeader(const Outer& o, const void* src, size_t count, DType t,
                                         void* dst) {
  const size_t block = count * DTypeSize(t);
  if (locals_ == 1) {
    if (dst != src) std::memmove(dst, src, block);
    return absl::OkStatus();
  }
  TensorView in = View(const_cast<void*>(src), count, t);
  if (!intra_->capabilities().send_recv) {
    // Every local rank gets every block: more traffic, same result on the leader.
    std::vector<uint8_t> sink(leader() ? 0 : block * static_cast<size_t>(locals_));
    void* out = leader() ? dst : sink.data();
    return Intra(o, "gather to the leader (allgather)",
                 Inner(OpKind::kAllgather, in, View(out, count * locals_, t)));
  }
  const uint64_t step = ++intra_seq_;
  if (!leader()) {
    return IntraP2p(o, "send to the leader", OpKind::kSend, 0, in, static_cast<uint32_t>(step));
  }
  auto* out = static_cast<uint8_t*>(dst);
  std::memmove(out, src, block);
  for (int j = 1; j < locals_; ++j) {
    HIER_RETURN_IF_ERROR(IntraP2p(o, absl::StrCat("receive from local rank ", j), OpKind::kRecv, j,
                                  View(out + static_cast<size_t>(j) * block, count, t),
                                  static_cast<uint32_t>(step)));
  }
  return absl::OkStatus();
}

absl::Status HierBackend::ScatterFromLeader(const Outer& o, const void* src, size_t count, DType t,
                                            void* dst) {
  const size_t block = count * DTypeSize(t);
  if (locals_ == 1) {
    if (dst != src) std::memmove(dst, src, block);
    return absl::OkStatus();
  }
  if (!intra_->capabilities().send_recv) {
    // Every local rank receives every block and keeps its own.
    std::vector<uint8_t> all(leader() ? 0 : block * static_cast<size_t>(locals_));
    void* buf = leader() ? const_cast<void*>(src) : all.data();
    HIER_RETURN_IF_ERROR(Intra(
        o, "scatter from the leader (broadcast)",
        Inner(OpKind::kBroadcast, View(buf, count * locals_, t), View(buf, count * locals_, t))));
    std::memmove(dst, static_cast<const uint8_t*>(buf) + static_cast<size_t>(local_) * block,
                 block);
    return absl::OkStatus();
  }
  const uint64_t step = ++intra_seq_;
  if (!leader()) {
    return IntraP2p(o, "receive from the leader", OpKind::kRecv, 0, View(dst, count, t),
                    static_cast<uint32_t>(step));
  }
  const auto* in = static_cast<const uint8_t*>(src);
  for (int j = 1; j < locals_; ++j) {
    HIER_RETURN_IF_ERROR(
        IntraP2p(o, absl::StrCat("send to local rank ", j), OpKind::kSend, j,
                 View(const_cast<uint8_t*>(in) + static_cast<size_t>(j) * block, count, t),
                 static_cast<uint32_t>(step)));
  }
  if (dst != src) std::memmove(dst, src, block);
  return absl::OkStatus();
}

absl::Status HierBackend::Allreduce(const Outer& o) {
  const TensorView v = o.op.output;
  if (v.count == 0) return absl::OkStatus();
  if (locals_ > 1) {
    HIER_RETURN_IF_ERROR(
        Intra(o, "reduce to the leader", Inner(OpKind::kReduce, v, v, o.op.reduce, 0)));
  }
  if (leader()) {
    HIER_RETURN_IF_ERROR(
        Inter(o, "allreduce among leaders", Inner(OpKind::kAllreduce, v, v, o.op.reduce)));
  }
  if (locals_ > 1) {
    HIER_RETURN_IF_ERROR(Intra(o, "broadcast from the leader", Inner(OpKind::kBroadcast, v, v)));
  }
  FinishAvg(o.op, v);
  return absl::OkStatus();
}

absl::Status HierBackend::Broadcast(const Outer& o) {
  const TensorView v = o.op.output;
  if (v.count == 0) return absl::OkStatus();
  const int root_host = HostOf(o.op.root);
  if (host_ == root_host && locals_ > 1) {
    HIER_RETURN_IF_ERROR(
        Intra(o, "broadcast from the root",
              Inner(OpKind::kBroadcast, v, v, ReduceOp::kSum, LocalOf(o.op.root))));
  }
  if (leader()) {
    HIER_RETURN_IF_ERROR(Inter(o, "broadcast among leaders",
                               Inner(OpKind::kBroadcast, v, v, ReduceOp::kSum, root_host)));
  }
  if (host_ != root_host && locals_ > 1) {
    HIER_RETURN_IF_ERROR(Intra(o, "broadcast from the leader", Inner(OpKind::kBroadcast, v, v)));
  }
  return absl::OkStatus();
}

absl::Status HierBackend::Reduce(const Outer& o) {
  const TensorView v = o.op.output;
  if (v.count == 0) return absl::OkStatus();
  const int root = o.op.root;
  const int root_host = HostOf(root);
  const int root_local = LocalOf(root);
  // A leader that is not the root must keep its input: it reduces a copy.
  TensorView buf = v;
  if (leader() && root != topo_.rank) {
    buf.data = Scratch(v.bytes());
    std::memcpy(buf.data, v.data, v.bytes());
  }
  if (locals_ > 1) {
    HIER_RETURN_IF_ERROR(
        Intra(o, "reduce to the leader", Inner(OpKind::kReduce, buf, buf, o.op.reduce, 0)));
  }
  if (leader()) {
    HIER_RETURN_IF_ERROR(
        Inter(o, "reduce among leaders", Inner(OpKind::kReduce, buf, buf, o.op.reduce, root_host)));
  }
  if (host_ == root_host && root_local != 0) {
    if (intra_->capabilities().send_recv) {
      const uint64_t step = ++intra_seq_;
      if (leader()) {
        HIER_RETURN_IF_ERROR(IntraP2p(o, "send to the root", OpKind::kSend, root_local, buf,
                                      static_cast<uint32_t>(step)));
      } else if (local_ == root_local) {
        HIER_RETURN_IF_ERROR(IntraP2p(o, "receive from the leader", OpKind::kRecv, 0, v,
                                      static_cast<uint32_t>(step)));
      }
    } else {
      TensorView into = v;
      if (!leader() && local_ != root_local) into.data = Scratch(v.bytes());
      if (leader()) into = buf;
      HIER_RETURN_IF_ERROR(
          Intra(o, "broadcast from the leader", Inner(OpKind::kBroadcast, into, into)));
    }
  }
  if (root == topo_.rank) FinishAvg(o.op, v);
  return absl::OkStatus();
}

absl::Status HierBackend::Allgather(const Outer& o) {
  const TensorView in = o.op.input;
  const TensorView out = o.op.output;
  const size_t c = in.count;
  if (c == 0) return absl::OkStatus();
  const DType t = in.dtype;
  const size_t esz = DTypeSize(t);
  const auto lmax = static_cast<size_t>(layout_.max_local);
  const auto hosts = static_cast<size_t>(layout_.hosts);
  // Leader: this host's blocks (padded to lmax), then every host's.
  uint8_t* mine = leader() ? Scratch((lmax + hosts * lmax) * c * esz) : nullptr;
  uint8_t* all = leader() ? mine + lmax * c * esz : nullptr;
  HIER_RETURN_IF_ERROR(GatherToLeader(o, in.data, c, t, mine));
  if (leader()) {
    std::memset(mine + static_cast<size_t>(locals_) * c * esz, 0,
                (lmax - static_cast<size_t>(locals_)) * c * esz);
    HIER_RETURN_IF_ERROR(
        Inter(o, "allgather among leaders",
              Inner(OpKind::kAllgather, View(mine, lmax * c, t), View(all, hosts * lmax * c, t))));
    for (int h = 0; h < layout_.hosts; ++h) {
      const auto& ranks = layout_.ranks_of[static_cast<size_t>(h)];
      for (size_t j = 0; j < ranks.size(); ++j) {
        std::memcpy(static_cast<uint8_t*>(out.data) + static_cast<size_t>(ranks[j]) * c * esz,
                    all + (static_cast<size_t>(h) * lmax + j) * c * esz, c * esz);
      }
    }
  }
  if (locals_ > 1) {
    HIER_RETURN_IF_ERROR(
        Intra(o, "broadcast from the leader", Inner(OpKind::kBroadcast, out, out)));
  }
  return absl::OkStatus();
}

absl::Status HierBackend::ReduceScatter(const Outer& o) {
  const TensorView in = o.op.input;
  const TensorView out = o.op.output;
  const size_t c = out.count;
  if (c == 0) return absl::OkStatus();
  const DType t = in.dtype;
  const size_t esz = DTypeSize(t);
  const size_t cb = c * esz;
  const auto lmax = static_cast<size_t>(layout_.max_local);
  const auto hosts = static_cast<size_t>(layout_.hosts);
  // Every rank lays its input out host by host (each host's blocks padded to lmax), so the intra
  // reduce lands, on the leader, exactly what the leaders' reduce_scatter splits by host.
  uint8_t* staged = Scratch((hosts * lmax + lmax) * cb);
  uint8_t* mine = staged + hosts * lmax * cb;
  std::memset(staged, 0, hosts * lmax * cb);
  for (int g = 0; g < topo_.world_size; ++g) {
    std::memcpy(staged + (static_cast<size_t>(HostOf(g)) * lmax + LocalOf(g)) * cb,
                static_cast<const uint8_t*>(in.data) + static_cast<size_t>(g) * cb, cb);
  }
  const TensorView all = View(staged, hosts * lmax * c, t);
  if (locals_ > 1) {
    HIER_RETURN_IF_ERROR(
        Intra(o, "reduce to the leader", Inner(OpKind::kReduce, all, all, o.op.reduce, 0)));
  }
  if (leader()) {
    HIER_RETURN_IF_ERROR(
        Inter(o, "reduce_scatter among leaders",
              Inner(OpKind::kReduceScatter, all, View(mine, lmax * c, t), o.op.reduce)));
  }
  HIER_RETURN_IF_ERROR(ScatterFromLeader(o, mine, c, t, out.data));
  FinishAvg(o.op, out);
  return absl::OkStatus();
}

absl::Status HierBackend::Alltoall(const Outer& o) {
  const TensorView in = o.op.input;
  const TensorView out = o.op.output;
  const auto n = static_cast<size_t>(topo_.world_size);
  const size_t c = in.count / n;
  if (c == 0) return absl::OkStatus();
  const DType t = in.dtype;
  const size_t cb = c * DTypeSize(t);
  const auto lmax = static_cast<size_t>(layout_.max_local);
  const auto hosts = static_cast<size_t>(layout_.hosts);
  const auto locals = static_cast<size_t>(locals_);
  // Leader: every local input (locals x n blocks), the per-host send and receive buffers
  // (hosts x lmax x lmax blocks: [source local][destination local]) and every local output.
  const size_t gathered = locals * n * cb, exchanged = hosts * lmax * lmax * cb;
  uint8_t* g = leader() ? Scratch(2 * gathered + 2 * exchanged) : nullptr;
  uint8_t* send = leader() ? g + gathered : nullptr;
  uint8_t* recv = leader() ? send + exchanged : nullptr;
  uint8_t* outs = leader() ? recv + exchanged : nullptr;
  HIER_RETURN_IF_ERROR(GatherToLeader(o, in.data, n * c, t, g));
  if (leader()) {
    std::memset(send, 0, exchanged);
    for (size_t i = 0; i < locals; ++i) {
      for (int dst = 0; dst < topo_.world_size; ++dst) {
        const auto h = static_cast<size_t>(HostOf(dst));
        const auto j = static_cast<size_t>(LocalOf(dst));
        std::memcpy(send + ((h * lmax + i) * lmax + j) * cb,
                    g + (i * n + static_cast<size_t>(dst)) * cb, cb);
      }
    }
    HIER_RETURN_IF_ERROR(Inter(o, "alltoall among leaders",
                               Inner(OpKind::kAlltoall, View(send, exchanged / DTypeSize(t), t),
                                     View(recv, exchanged / DTypeSize(t), t))));
    for (int src = 0; src < topo_.world_size; ++src) {
      const auto h = static_cast<size_t>(HostOf(src));
      const auto i = static_cast<size_t>(LocalOf(src));
      for (size_t j = 0; j < locals; ++j) {
        std::memcpy(outs + (j * n + static_cast<size_t>(src)) * cb,
                    recv + ((h * lmax + i) * lmax + j) * cb, cb);
      }
    }
  }
  return ScatterFromLeader(o, outs, n * c, t, out.data);
}

absl::Status HierBackend::Barrier(const Outer& o) {
  const OpDesc b = Inner(OpKind::kBarrier, {}, {});
  if (locals_ > 1) HIER_RETURN_IF_ERROR(Intra(o, "barrier before the leaders'", b));
  if (leader()) HIER_RETURN_IF_ERROR(Inter(o, "barrier among leaders", b));
  if (locals_ > 1) HIER_RETURN_IF_ERROR(Intra(o, "barrier after the leaders'", b));
  return absl::OkStatus();
}

}  // namespace hier

using hier::HierBackend;
using hier::Layout;

absl::StatusOr<std::unique_ptr<Backend>> CreateHierarchicalBackend(HierBackendOptions options) {
  absl::StatusOr<Layout> layout = hier::MakeLayout(options.topology);
  if (!layout.ok()) return layout.status();
  const HierTopology& t = options.topology;
  const int host = t.host_of[static_cast<size_t>(t.rank)];
  const int locals = static_cast<int>(layout->ranks_of[static_cast<size_t>(host)].size());
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("hierarchical backend on rank ", t.rank,
                                                   " (host ", host, ", local rank ", t.local_rank,
                                                   "): ", parts...));
  };
  if (options.intra == nullptr) return bad("no intra-host backend");
  if (options.intra->size() != locals || options.intra->rank() != t.local_rank) {
    return bad("the intra-host backend is rank ", options.intra->rank(), " of ",
               options.intra->size(), ", expected ", t.local_rank, " of ", locals);
  }
  const bool wants_inter = t.local_rank == 0 && layout->hosts > 1;
  if (!wants_inter && options.inter != nullptr && layout->hosts > 1) {
    return bad("only host leaders (local rank 0) take an inter-host backend");
  }
  if (wants_inter) {
    if (options.inter == nullptr) return bad("a host leader needs an inter-host backend");
    if (options.inter->size() != layout->hosts || options.inter->rank() != host) {
      return bad("the inter-host backend is rank ", options.inter->rank(), " of ",
                 options.inter->size(), ", expected ", host, " of ", layout->hosts);
    }
  } else {
    options.inter.reset();
  }
  return std::unique_ptr<Backend>(
      new HierBackend(options.topology, *std::move(layout), std::move(options.intra),
                      std::move(options.inter), std::move(options.pair_transport)));
}

}  // namespace adaptcomm

// HierBackend's collectives, the members OpDispatch calls (one per op kind): each composed of
// steps within the host (intra), among the host leaders (inter) and leader <-> local moves.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/hier/hier_backend_class.h"

namespace adaptcomm::hier {

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

}  // namespace adaptcomm::hier

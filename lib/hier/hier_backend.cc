#include "lib/hier/hier_backend.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "lib/backend/op_dispatch.h"
#include "lib/base/op_views.h"
#include "lib/hier/hier_backend_class.h"

namespace adaptcomm {
namespace hier {

Capabilities HierBackend::CapabilitiesOf(const Layout& layout, const Backend& intra,
                                         const Backend* inter, bool pair_links) {
  const Capabilities in = intra.capabilities();
  const bool multi_host = layout.hosts > 1;
  return {
      // Every pair can talk: on one host, over pair links, or when every rank is its host's
      // leader.
      .send_recv = in.send_recv &&
                   (!multi_host || pair_links ||
                    (layout.max_local == 1 && inter != nullptr && inter->capabilities().send_recv)),
      .abortable = in.abortable && (inter == nullptr || inter->capabilities().abortable),
  };
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
  if (!IsKnownOpKind(op.kind)) return refuse("unknown op kind ", static_cast<int>(op.kind));
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
  return RunFramed(op, [&] {
    const absl::Time start = absl::Now();
    return Dispatch(Outer{op, start, start + op.timeout});
  });
}

void HierBackend::OnBroken(const absl::Status& failure) {
  // The peers of this rank may be waiting on a step it will never run: make theirs fail now.
  Interrupt(absl::AbortedError(absl::StrCat("rank ", topo_.rank, " failed: ", failure.message())));
}

void HierBackend::Interrupt(const absl::Status& reason) {
  intra_->Abort(reason);
  if (inter_ != nullptr) inter_->Abort(reason);
  absl::MutexLock lock(&pairs_mu_);
  for (auto& [peer, link] : pairs_) link->Abort(reason);
}

absl::Status HierBackend::health() const {
  if (absl::Status s = BackendBase::health(); !s.ok()) return s;
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
  return OpDispatch::Run(op.kind, *this, o);
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

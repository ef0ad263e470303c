// ShmBackend's collectives and send/recv, the members OpDispatch calls (one per op kind): steps
// through the two halves of every rank's slot, flat or chunked reductions in rank order, wire
// casts, and the pairs' point-to-point channels.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/cast_kernels.h"
#include "lib/base/fused_kernels.h"
#include "lib/shm/shm_backend_class.h"
#include "lib/shm/shm_reduce.h"
#include "lib/shm/shm_segment.h"

namespace adaptcomm::shm {

absl::Status ShmBackend::BeginStep(const OpCtx& ctx, bool writes) {
  ++step_;
  if (!writes) return absl::OkStatus();
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    if (absl::Status s = Wait(ctx, seg_->done(p), step_ - 2, p); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ShmBackend::WaitAllPosted(const OpCtx& ctx, uint32_t target) {
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    if (absl::Status s = Wait(ctx, seg_->post(p), target, p); !s.ok()) return s;
  }
  return absl::OkStatus();
}

size_t ShmBackend::FlatMaxFor(const OpDesc& op, size_t bytes) const {
  if (op.knobs != nullptr) {
    if (const int64_t* v = op.knobs->Find(kKnobSpace, "flat_max_bytes")) {
      return static_cast<size_t>(std::max<int64_t>(*v, 0));
    }
  }
  const auto& bands =
      op.kind == OpKind::kReduce ? tuned_reduce_.flat_max_bytes : tuned_allreduce_.flat_max_bytes;
  return static_cast<size_t>(config::BandValue(bands, bytes, static_cast<int64_t>(flat_max_)));
}

size_t ShmBackend::ChunkFor(const OpDesc& op, size_t bytes) const {
  if (op.knobs != nullptr) {
    if (const int64_t* v = op.knobs->Find(kKnobSpace, "chunk_bytes")) {
      const auto chunk = static_cast<size_t>(std::max<int64_t>(*v, 0));
      return chunk == 0 ? chunk_ : std::min(chunk, seg_->slot_half_bytes());
    }
  }
  const auto& bands =
      op.kind == OpKind::kReduce ? tuned_reduce_.chunk_bytes : tuned_allreduce_.chunk_bytes;
  if (bands.empty()) return chunk_;
  const auto chunk = static_cast<size_t>(config::BandValue(bands, bytes, 0));
  return chunk == 0 ? chunk_ : std::min(chunk, seg_->slot_half_bytes());
}

absl::Status ShmBackend::Reduction(const OpCtx& ctx, unsigned char* data, size_t count, int root) {
  const size_t esz = DTypeSize(ctx.op.output.dtype);
  if (count == 0) return absl::OkStatus();
  const size_t bytes = count * esz;
  if (bytes <= std::min(FlatMaxFor(ctx.op, bytes), seg_->slot_half_bytes())) {
    return ReduceFlat(ctx, data, count, root);
  }
  const size_t per_chunk = std::max<size_t>(1, ChunkFor(ctx.op, bytes) / esz);
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t m = std::min(per_chunk, count - off);
    if (absl::Status s = ReduceChunk(ctx, data + off * esz, m, root); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ShmBackend::ReduceFlat(const OpCtx& ctx, unsigned char* data, size_t count, int root) {
  const OpDesc& op = ctx.op;
  if (absl::Status s = BeginStep(ctx, true); !s.ok()) return s;
  std::memcpy(Half(rank()), data, count * DTypeSize(op.output.dtype));
  Publish(seg_->post(rank()), 2 * step_ - 1);
  if (root < 0 || root == rank()) {
    if (absl::Status s = WaitAllPosted(ctx, 2 * step_ - 1); !s.ok()) return s;
    for (int p = 0; p < size(); ++p) srcs_[p] = Half(p);
    shm::ReduceSlots(op.output.dtype, op.reduce, srcs_.data(), size(), data, count);
  }
  EndStep();
  return absl::OkStatus();
}

absl::Status ShmBackend::ReduceChunk(const OpCtx& ctx, unsigned char* data, size_t count,
                                     int root) {
  const OpDesc& op = ctx.op;
  const size_t esz = DTypeSize(op.output.dtype);
  // Slices on cache-line boundaries; the last ones may be short or empty.
  const size_t line = std::max<size_t>(1, 64 / esz);
  const size_t per = (count + size() - 1) / size();
  const size_t slice = (per + line - 1) / line * line;
  auto lo = [&](int p) { return std::min(count, slice * static_cast<size_t>(p)); };

  if (absl::Status s = BeginStep(ctx, true); !s.ok()) return s;
  // Peers read every slice but ours from our half; ours we reduce straight from `data`.
  const size_t my_lo = lo(rank()), my_hi = lo(rank() + 1);
  std::memcpy(Half(rank()), data, my_lo * esz);
  std::memcpy(Half(rank()) + my_hi * esz, data + my_hi * esz, (count - my_hi) * esz);
  Publish(seg_->post(rank()), 2 * step_ - 1);
  if (absl::Status s = WaitAllPosted(ctx, 2 * step_ - 1); !s.ok()) return s;
  for (int p = 0; p < size(); ++p) srcs_[p] = Half(p) + my_lo * esz;
  srcs_[rank()] = data + my_lo * esz;
  // The reduced slice goes where our copy of it would have been (no peer reads it before post 2),
  // and into our own result from the same L1 block.
  const bool want_result = root < 0 || root == rank();
  shm::ReduceSlots(op.output.dtype, op.reduce, srcs_.data(), size(), Half(rank()) + my_lo * esz,
                   my_hi - my_lo, want_result ? data + my_lo * esz : nullptr);
  Publish(seg_->post(rank()), 2 * step_);
  if (want_result) {
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      if (absl::Status s = Wait(ctx, seg_->post(p), 2 * step_, p); !s.ok()) return s;
      std::memcpy(data + lo(p) * esz, Half(p) + lo(p) * esz, (lo(p + 1) - lo(p)) * esz);
    }
  }
  EndStep();
  return absl::OkStatus();
}

absl::Status ShmBackend::ReduceWire(const OpCtx& ctx) {
  const OpDesc& op = ctx.op;
  float* data = static_cast<float*>(op.output.data);
  const size_t count = op.output.count;
  const size_t per_chunk = std::max<size_t>(1, ChunkFor(op, op.output.bytes()) / sizeof(uint16_t));
  WireStats stats;
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t m = std::min(per_chunk, count - off);
    if (absl::Status s = ReduceWireChunk(ctx, data + off, m, stats); !s.ok()) return s;
  }
  if (op.wire_stats != nullptr) *op.wire_stats = stats;
  return absl::OkStatus();
}

absl::Status ShmBackend::ReduceWireChunk(const OpCtx& ctx, float* data, size_t count,
                                         WireStats& stats) {
  namespace p = precision;
  const OpDesc& op = ctx.op;
  const bool bf16 = *op.wire == DType::kBF16;
  const p::CastPath path = p::ActiveCastPath();
  auto narrow = [&](const float* src, uint16_t* dst, size_t n) {
    const CastStats c = bf16 ? p::F32ToBF16(path, src, dst, n) : p::F32ToF16(path, src, dst, n);
    stats.cast_overflow += c.overflow;
    stats.nonfinite_inputs += c.nonfinite_inputs;
  };
  // Slices on cache-line boundaries of the wire; the last ones may be short or empty.
  const size_t line = 64 / sizeof(uint16_t);
  const size_t per = (count + size() - 1) / size();
  const size_t slice = (per + line - 1) / line * line;
  auto lo = [&](int r) { return std::min(count, slice * static_cast<size_t>(r)); };
  auto wire_half = [&](int r) { return reinterpret_cast<uint16_t*>(Half(r)); };

  if (absl::Status s = BeginStep(ctx, true); !s.ok()) return s;
  // The cast into our half is the copy the peers read; our own slice is rounded inside the sum.
  const size_t my_lo = lo(rank()), my_hi = lo(rank() + 1);
  narrow(data, wire_half(rank()), my_lo);
  narrow(data + my_hi, wire_half(rank()) + my_hi, count - my_hi);
  Publish(seg_->post(rank()), 2 * step_ - 1);
  if (absl::Status s = WaitAllPosted(ctx, 2 * step_ - 1); !s.ok()) return s;
  std::vector<const uint16_t*> blocks(size());
  for (int r = 0; r < size(); ++r) blocks[r] = wire_half(r) + my_lo;
  p::ReduceRoundArgs args;
  args.blocks = blocks.data();
  args.n = size();
  args.self = rank();
  args.own = data + my_lo;
  args.sum = wire_half(rank()) + my_lo;  // no peer reads our slice of the half before post 2
  args.out = data + my_lo;
  args.count = my_hi - my_lo;
  args.scale = op.wire_scale;
  const p::ReduceRoundStats rr =
      bf16 ? p::ReduceRoundBF16(path, args) : p::ReduceRoundF16(path, args);
  stats.cast_overflow += rr.own.overflow;
  stats.nonfinite_inputs += rr.own.nonfinite_inputs;
  stats.result_nonfinite += rr.result_nonfinite;
  Publish(seg_->post(rank()), 2 * step_);
  // The widening out of the peers' halves is the copy out.
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    if (absl::Status s = Wait(ctx, seg_->post(r), 2 * step_, r); !s.ok()) return s;
    const uint16_t* src = wire_half(r) + lo(r);
    const size_t n = lo(r + 1) - lo(r);
    const CastStats c = bf16 ? p::BF16ToF32(path, src, data + lo(r), n, op.wire_scale)
                             : p::F16ToF32(path, src, data + lo(r), n, op.wire_scale);
    stats.result_nonfinite += c.nonfinite_inputs;
  }
  EndStep();
  return absl::OkStatus();
}

absl::Status ShmBackend::Broadcast(const OpCtx& ctx) {
  const OpDesc& op = ctx.op;
  const int root = op.root;
  auto* data = static_cast<unsigned char*>(op.output.data);
  const size_t bytes = op.output.bytes();
  const size_t per_chunk = seg_->slot_half_bytes();
  for (size_t off = 0; off < bytes; off += per_chunk) {
    const size_t m = std::min(per_chunk, bytes - off);
    if (absl::Status s = BeginStep(ctx, rank() == root); !s.ok()) return s;
    if (rank() == root) {
      std::memcpy(Half(rank()), data + off, m);
      Publish(seg_->post(rank()), 2 * step_ - 1);
    } else {
      if (absl::Status s = Wait(ctx, seg_->post(root), 2 * step_ - 1, root); !s.ok()) return s;
      std::memcpy(data + off, Half(root), m);
    }
    EndStep();
  }
  return absl::OkStatus();
}

absl::Status ShmBackend::Allgather(const OpCtx& ctx) {
  const OpDesc& op = ctx.op;
  const auto* in = static_cast<const unsigned char*>(op.input.data);
  auto* out = static_cast<unsigned char*>(op.output.data);
  const size_t bytes = op.input.bytes();
  const size_t per_chunk = seg_->slot_half_bytes();
  for (size_t off = 0; off < bytes; off += per_chunk) {
    const size_t m = std::min(per_chunk, bytes - off);
    if (absl::Status s = BeginStep(ctx, true); !s.ok()) return s;
    std::memcpy(Half(rank()), in + off, m);
    Publish(seg_->post(rank()), 2 * step_ - 1);
    for (int p = 0; p < size(); ++p) {
      if (p != rank()) {
        if (absl::Status s = Wait(ctx, seg_->post(p), 2 * step_ - 1, p); !s.ok()) return s;
      }
      std::memcpy(out + p * bytes + off, Half(p), m);
    }
    EndStep();
  }
  return absl::OkStatus();
}

absl::Status ShmBackend::BlockExchange(const OpCtx& ctx, bool reduce) {
  const OpDesc& op = ctx.op;
  const DType dtype = op.output.dtype;
  const size_t esz = DTypeSize(dtype);
  const auto* in = static_cast<const unsigned char*>(op.input.data);
  auto* out = static_cast<unsigned char*>(op.output.data);
  // Elements per block: the output holds one block (reduce_scatter) or `size()` blocks (alltoall).
  const size_t count = reduce ? op.output.count : op.output.count / size();
  const size_t per_chunk = std::max<size_t>(1, seg_->slot_half_bytes() / (size() * esz));
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t m = std::min(per_chunk, count - off);
    if (absl::Status s = BeginStep(ctx, true); !s.ok()) return s;
    unsigned char* mine = Half(rank());
    for (int b = 0; b < size(); ++b) {
      std::memcpy(mine + b * m * esz, in + (b * count + off) * esz, m * esz);
    }
    Publish(seg_->post(rank()), 2 * step_ - 1);
    if (reduce) {
      if (absl::Status s = WaitAllPosted(ctx, 2 * step_ - 1); !s.ok()) return s;
      for (int p = 0; p < size(); ++p) srcs_[p] = Half(p) + rank() * m * esz;
      shm::ReduceSlots(dtype, op.reduce, srcs_.data(), size(), out + off * esz, m);
    } else {
      for (int p = 0; p < size(); ++p) {
        if (p != rank()) {
          if (absl::Status s = Wait(ctx, seg_->post(p), 2 * step_ - 1, p); !s.ok()) return s;
        }
        std::memcpy(out + (p * count + off) * esz, Half(p) + rank() * m * esz, m * esz);
      }
    }
    EndStep();
  }
  return absl::OkStatus();
}

absl::Status ShmBackend::Barrier(const OpCtx& ctx) {
  if (absl::Status s = BeginStep(ctx, false); !s.ok()) return s;
  Publish(seg_->post(rank()), 2 * step_ - 1);
  if (absl::Status s = WaitAllPosted(ctx, 2 * step_ - 1); !s.ok()) return s;
  EndStep();
  return absl::OkStatus();
}

absl::Status ShmBackend::Send(const OpCtx& ctx) {
  const OpDesc& op = ctx.op;
  const int dst = op.peer;
  shm::Channel& ch = seg_->channel(rank(), dst);
  const auto* data = static_cast<const unsigned char*>(op.input.data);
  const size_t bytes = op.input.bytes();
  const size_t half = seg_->p2p_half_bytes();
  size_t off = 0;
  do {
    const size_t m = std::min(half, bytes - off);
    const uint32_t k = ++sent_[dst];
    if (absl::Status s = Wait(ctx, ch.consumed, k - 2, dst); !s.ok()) return s;
    const int h = static_cast<int>(k & 1);
    ch.desc[h] = shm::ChunkDesc{op.tag, bytes, m};
    std::memcpy(seg_->p2p(rank(), dst, h), data + off, m);
    Publish(ch.sent, k);
    off += m;
  } while (off < bytes);
  return absl::OkStatus();
}

absl::Status ShmBackend::Recv(const OpCtx& ctx) {
  const OpDesc& op = ctx.op;
  const int src = op.peer;
  shm::Channel& ch = seg_->channel(src, rank());
  auto* data = static_cast<unsigned char*>(op.output.data);
  const size_t bytes = op.output.bytes();
  size_t off = 0;
  do {
    const uint32_t k = ++received_[src];
    if (absl::Status s = Wait(ctx, ch.sent, k, src); !s.ok()) return s;
    const int h = static_cast<int>(k & 1);
    const shm::ChunkDesc d = ch.desc[h];
    if (d.tag != op.tag || d.total_bytes != bytes || d.chunk_bytes > bytes - off) {
      // The channel is out of step now: this backend cannot continue.
      return absl::InternalError(
          absl::StrCat(What(ctx), "expected tag ", op.tag, " with ", bytes, " bytes from rank ",
                       src, ", but its next message has tag ", d.tag, " with ", d.total_bytes,
                       " bytes (shm matches sends and receives of a pair in order)"));
    }
    std::memcpy(data + off, seg_->p2p(src, rank(), h), d.chunk_bytes);
    Publish(ch.consumed, k);
    off += d.chunk_bytes;
  } while (off < bytes);
  return absl::OkStatus();
}

}  // namespace adaptcomm::shm

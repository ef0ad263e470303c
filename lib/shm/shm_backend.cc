#include "lib/shm/shm_backend.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/cast_kernels.h"
#include "lib/base/fused_kernels.h"
#include "lib/base/log.h"
#include "lib/base/op_checks.h"
#include "lib/base/op_views.h"
#include "lib/shm/shm_backend_class.h"
#include "lib/shm/shm_reduce.h"
#include "lib/shm/shm_segment.h"

namespace adaptcomm {
namespace shm {

absl::Status ShmBackend::Supports(const OpDesc& op) const {
  const char* kind = OpKindName(op.kind);
  if (absl::Status s = CheckHostOp(op, "shm", rank_, size_); !s.ok()) return s;
  if (IsReduction(op.kind) && !shm::CanReduce(op.output.dtype, op.reduce)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm backend: ", kind, " ", ReduceOpName(op.reduce),
                     op.reduce == ReduceOp::kAvg ? " is defined for floating-point dtypes only"
                                                 : " has no kernel",
                     ", not ", DTypeName(op.output.dtype)));
  }
  if (op.wire.has_value() &&
      (op.kind != OpKind::kAllreduce || op.output.dtype != DType::kF32 ||
       op.reduce != ReduceOp::kSum || (*op.wire != DType::kBF16 && *op.wire != DType::kF16))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm backend: a wire-cast op must be an f32 sum allreduce over a bf16 or f16 wire, not ",
        kind, " ", DTypeName(op.output.dtype), " ", ReduceOpName(op.reduce), " over ",
        DTypeName(*op.wire)));
  }
  return absl::OkStatus();
}

absl::Status ShmBackend::Refused(const OpDesc& op) const {
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) return absl::OkStatus();
  return BrokenBackendRefusal("shm", op, broken_);
}

absl::Status ShmBackend::Run(const OpDesc& op) {
  if (absl::Status s = Refused(op); !s.ok()) return s;
  if (absl::Status s = Supports(op); !s.ok()) return s;
  const absl::Time start = absl::Now();
  const OpCtx ctx{op, start, start + op.timeout};
  // A peer that broke the group fails this op before it touches the slots.
  if (absl::Status s = Interrupted(ctx); !s.ok()) return Break(std::move(s));
  absl::Status s = Dispatch(ctx);
  if (s.ok() || absl::IsInvalidArgument(s)) return s;
  return Break(std::move(s));
}

absl::Status ShmBackend::Dispatch(const OpCtx& ctx) {
  const OpDesc& op = ctx.op;
  auto* out = static_cast<unsigned char*>(op.output.data);
  switch (op.kind) {
    case OpKind::kAllreduce:
      if (op.wire.has_value()) return ReduceWire(ctx);
      return Reduction(ctx, out, op.output.count, -1);
    case OpKind::kReduce:
      return Reduction(ctx, out, op.output.count, op.root);
    case OpKind::kBroadcast:
      return Broadcast(ctx);
    case OpKind::kAllgather:
      return Allgather(ctx);
    case OpKind::kReduceScatter:
      return BlockExchange(ctx, /*reduce=*/true);
    case OpKind::kAlltoall:
      return BlockExchange(ctx, /*reduce=*/false);
    case OpKind::kBarrier:
      return Barrier(ctx);
    case OpKind::kSend:
      return Send(ctx);
    case OpKind::kRecv:
      return Recv(ctx);
  }
  return absl::InvalidArgumentError("shm backend: unknown op kind");
}

absl::Status ShmBackend::BeginStep(const OpCtx& ctx, bool writes) {
  ++step_;
  if (!writes) return absl::OkStatus();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (absl::Status s = Wait(ctx, seg_->done(p), step_ - 2, p); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ShmBackend::WaitAllPosted(const OpCtx& ctx, uint32_t target) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
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
  std::memcpy(Half(rank_), data, count * DTypeSize(op.output.dtype));
  Publish(seg_->post(rank_), 2 * step_ - 1);
  if (root < 0 || root == rank_) {
    if (absl::Status s = WaitAllPosted(ctx, 2 * step_ - 1); !s.ok()) return s;
    for (int p = 0; p < size_; ++p) srcs_[p] = Half(p);
    shm::ReduceSlots(op.output.dtype, op.reduce, srcs_.data(), size_, data, count);
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
  const size_t per = (count + size_ - 1) / size_;
  const size_t slice = (per + line - 1) / line * line;
  auto lo = [&](int p) { return std::min(count, slice * static_cast<size_t>(p)); };

  if (absl::Status s = BeginStep(ctx, true); !s.ok()) return s;
  // Peers read every slice but ours from our half; ours we reduce straight from `data`.
  const size_t my_lo = lo(rank_), my_hi = lo(rank_ + 1);
  std::memcpy(Half(rank_), data, my_lo * esz);
  std::memcpy(Half(rank_) + my_hi * esz, data + my_hi * esz, (count - my_hi) * esz);
  Publish(seg_->post(rank_), 2 * step_ - 1);
  if (absl::Status s = WaitAllPosted(ctx, 2 * step_ - 1); !s.ok()) return s;
  for (int p = 0; p < size_; ++p) srcs_[p] = Half(p) + my_lo * esz;
  srcs_[rank_] = data + my_lo * esz;
  // The reduced slice goes where our copy of it would have been (no peer reads it before post 2),
  // and into our own result from the same L1 block.
  const bool want_result = root < 0 || root == rank_;
  shm::ReduceSlots(op.output.dtype, op.reduce, srcs_.data(), size_, Half(rank_) + my_lo * esz,
                   my_hi - my_lo, want_result ? data + my_lo * esz : nullptr);
  Publish(seg_->post(rank_), 2 * step_);
  if (want_result) {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
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
  const size_t per = (count + size_ - 1) / size_;
  const size_t slice = (per + line - 1) / line * line;
  auto lo = [&](int r) { return std::min(count, slice * static_cast<size_t>(r)); };
  auto wire_half = [&](int r) { return reinterpret_cast<uint16_t*>(Half(r)); };

  if (absl::Status s = BeginStep(ctx, true); !s.ok()) return s;
  // The cast into our half is the copy the peers read; our own slice is rounded inside the sum.
  const size_t my_lo = lo(rank_), my_hi = lo(rank_ + 1);
  narrow(data, wire_half(rank_), my_lo);
  narrow(data + my_hi, wire_half(rank_) + my_hi, count - my_hi);
  Publish(seg_->post(rank_), 2 * step_ - 1);
  if (absl::Status s = WaitAllPosted(ctx, 2 * step_ - 1); !s.ok()) return s;
  std::vector<const uint16_t*> blocks(size_);
  for (int r = 0; r < size_; ++r) blocks[r] = wire_half(r) + my_lo;
  p::ReduceRoundArgs args;
  args.blocks = blocks.data();
  args.n = size_;
  args.self = rank_;
  args.own = data + my_lo;
  args.sum = wire_half(rank_) + my_lo;  // no peer reads our slice of the half before post 2
  args.out = data + my_lo;
  args.count = my_hi - my_lo;
  args.scale = op.wire_scale;
  const p::ReduceRoundStats rr =
      bf16 ? p::ReduceRoundBF16(path, args) : p::ReduceRoundF16(path, args);
  stats.cast_overflow += rr.own.overflow;
  stats.nonfinite_inputs += rr.own.nonfinite_inputs;
  stats.result_nonfinite += rr.result_nonfinite;
  Publish(seg_->post(rank_), 2 * step_);
  // The widening out of the peers' halves is the copy out.
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
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
    if (absl::Status s = BeginStep(ctx, rank_ == root); !s.ok()) return s;
    if (rank_ == root) {
      std::memcpy(Half(rank_), data + off, m);
      Publish(seg_->post(rank_), 2 * step_ - 1);
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
    std::memcpy(Half(rank_), in + off, m);
    Publish(seg_->post(rank_), 2 * step_ - 1);
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) {
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
  // Elements per block: the output holds one block (reduce_scatter) or `size_` blocks (alltoall).
  const size_t count = reduce ? op.output.count : op.output.count / size_;
  const size_t per_chunk = std::max<size_t>(1, seg_->slot_half_bytes() / (size_ * esz));
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t m = std::min(per_chunk, count - off);
    if (absl::Status s = BeginStep(ctx, true); !s.ok()) return s;
    unsigned char* mine = Half(rank_);
    for (int b = 0; b < size_; ++b) {
      std::memcpy(mine + b * m * esz, in + (b * count + off) * esz, m * esz);
    }
    Publish(seg_->post(rank_), 2 * step_ - 1);
    if (reduce) {
      if (absl::Status s = WaitAllPosted(ctx, 2 * step_ - 1); !s.ok()) return s;
      for (int p = 0; p < size_; ++p) srcs_[p] = Half(p) + rank_ * m * esz;
      shm::ReduceSlots(dtype, op.reduce, srcs_.data(), size_, out + off * esz, m);
    } else {
      for (int p = 0; p < size_; ++p) {
        if (p != rank_) {
          if (absl::Status s = Wait(ctx, seg_->post(p), 2 * step_ - 1, p); !s.ok()) return s;
        }
        std::memcpy(out + (p * count + off) * esz, Half(p) + rank_ * m * esz, m * esz);
      }
    }
    EndStep();
  }
  return absl::OkStatus();
}

absl::Status ShmBackend::Barrier(const OpCtx& ctx) {
  if (absl::Status s = BeginStep(ctx, false); !s.ok()) return s;
  Publish(seg_->post(rank_), 2 * step_ - 1);
  if (absl::Status s = WaitAllPosted(ctx, 2 * step_ - 1); !s.ok()) return s;
  EndStep();
  return absl::OkStatus();
}

absl::Status ShmBackend::Send(const OpCtx& ctx) {
  const OpDesc& op = ctx.op;
  const int dst = op.peer;
  shm::Channel& ch = seg_->channel(rank_, dst);
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
    std::memcpy(seg_->p2p(rank_, dst, h), data + off, m);
    Publish(ch.sent, k);
    off += m;
  } while (off < bytes);
  return absl::OkStatus();
}

absl::Status ShmBackend::Recv(const OpCtx& ctx) {
  const OpDesc& op = ctx.op;
  const int src = op.peer;
  shm::Channel& ch = seg_->channel(src, rank_);
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
    std::memcpy(data + off, seg_->p2p(src, rank_, h), d.chunk_bytes);
    Publish(ch.consumed, k);
    off += d.chunk_bytes;
  } while (off < bytes);
  return absl::OkStatus();
}

absl::Status ShmBackend::Interrupted(const OpCtx& ctx) {
  if (aborted_.load(std::memory_order_acquire)) {
    absl::MutexLock lock(&mu_);
    return broken_.ok() ? absl::AbortedError(absl::StrCat(What(ctx), "aborted")) : broken_;
  }
  const uint32_t by = seg_->header().broken_by.load(std::memory_order_acquire);
  if (by == 0) return absl::OkStatus();
  const int r = static_cast<int>(by) - 1;
  const shm::RankInfo& info = seg_->info(r);
  const auto code = static_cast<absl::StatusCode>(info.broken_code.load(std::memory_order_acquire));
  std::string reason(info.broken_reason, strnlen(info.broken_reason, sizeof(info.broken_reason)));
  if (r == rank_) return absl::Status(code, reason);
  return absl::Status(
      code == absl::StatusCode::kDeadlineExceeded ? code : absl::StatusCode::kUnavailable,
      absl::StrCat(What(ctx), "peer rank ", r, " failed: ", reason));
}

absl::Status ShmBackend::Wait(const OpCtx& ctx, Counter& c, uint32_t target, int peer) {
  if (Reached(c.value.load(std::memory_order_acquire), target)) return absl::OkStatus();
  // Spin briefly: a peer a few microseconds behind costs no syscall and no sleep.
  const int64_t spin_until = MonotonicNs() + spin_ns_;
  // Yielding between short pause bursts: when the peer shares our CPU (more runnable threads
  // than cores) a pure spin would hold the CPU it needs until the scheduler preempts us.
  do {
    for (int i = 0; i < 16; ++i) {
      CpuRelax();
      if (Reached(c.value.load(std::memory_order_acquire), target)) return absl::OkStatus();
    }
    sched_yield();
    if (Reached(c.value.load(std::memory_order_acquire), target)) return absl::OkStatus();
  } while (MonotonicNs() < spin_until);

  const shm::RankInfo& info = seg_->info(peer);
  absl::Time next_probe = absl::Now() + liveness_interval_;
  bool stopped = false;
  c.waiters.fetch_add(1, std::memory_order_seq_cst);
  absl::Status result;
  while (true) {
    const uint32_t v = c.value.load(std::memory_order_seq_cst);
    if (Reached(v, target)) break;
    if (result = Interrupted(ctx); !result.ok()) break;
    const absl::Time now = absl::Now();
    const pid_t pid = info.pid.load(std::memory_order_acquire);
    if (now >= next_probe) {
      next_probe = now + liveness_interval_;
      const shm::ProcessState state = shm::ProbeProcess(pid, info.start_time);
      if (state == shm::ProcessState::kGone) {
        result = absl::UnavailableError(
            absl::StrCat(What(ctx), "peer rank ", peer, " (pid ", pid, ") exited; ", Waited(ctx)));
        break;
      }
      stopped = state == shm::ProcessState::kStopped;
    }
    if (now >= ctx.deadline) {
      result = absl::DeadlineExceededError(
          absl::StrCat(What(ctx), "timed out waiting for peer rank ", peer, " (pid ", pid,
                       stopped ? ", stopped" : "", "); ", Waited(ctx)));
      break;
    }
    shm::FutexWait(&c.value, v, std::min(next_probe, ctx.deadline) - now);
  }
  c.waiters.fetch_sub(1, std::memory_order_seq_cst);
  return result;
}

void ShmBackend::MarkGroupBroken(const absl::Status& status) {
  absl::MutexLock lock(&group_mu_);  // Run's thread and Abort may both get here
  shm::RankInfo& me = seg_->info(rank_);
  uint32_t expected = 0;
  // Only the first rank to break the group writes its reason there (its own record).
  if (seg_->header().broken_by.load(std::memory_order_acquire) == 0) {
    const std::string text(status.message());
    const size_t n = std::min(text.size(), sizeof(me.broken_reason) - 1);
    std::memcpy(me.broken_reason, text.data(), n);
    me.broken_reason[n] = '\0';
    me.broken_code.store(static_cast<int32_t>(status.code()), std::memory_order_release);
    seg_->header().broken_by.compare_exchange_strong(expected, static_cast<uint32_t>(rank_) + 1,
                                                     std::memory_order_acq_rel);
  }
  seg_->WakeAll();
}

absl::Status ShmBackend::Break(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = status;
  }
  MarkGroupBroken(status);
  return status;
}

void ShmBackend::Abort(const absl::Status& reason) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_.exchange(true)) return;
    const std::string why = reason.ok() ? std::string("no reason given") : reason.ToString();
    // A backend already broken keeps the error that broke it.
    if (broken_.ok()) broken_ = absl::AbortedError(absl::StrCat("shm backend aborted: ", why));
    status = broken_;
  }
  ADAPTCOMM_LOG(kInfo, "shm backend rank ", rank_, " aborting: ", reason.ToString());
  MarkGroupBroken(status);
}

}  // namespace shm

using shm::Segment;
using shm::ShmBackend;

absl::StatusOr<std::unique_ptr<Backend>> CreateShmBackend(const ShmBackendOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm backend: rank ", o.rank, " not in a world of ", o.size));
  }
  if (o.store == nullptr) return absl::InvalidArgumentError("shm backend: no store");
  if (o.slot_bytes < (size_t{64} << 10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm backend: slot of ", o.slot_bytes, " bytes is below 64 KiB"));
  }
  shm::SegmentOptions so;
  so.rank = o.rank;
  so.world = o.size;
  so.store = o.store;
  so.timeout = o.init_timeout;
  so.slot_bytes = o.slot_bytes;
  const size_t world2 = static_cast<size_t>(o.size) * o.size;
  so.p2p_bytes = o.p2p_bytes != 0
                     ? o.p2p_bytes
                     : std::clamp<size_t>((size_t{16} << 20) / world2, 64u << 10, size_t{1} << 20);
  so.max_bytes = o.max_segment_bytes;
  so.layout_version =
      o.layout_version_for_testing != 0 ? o.layout_version_for_testing : shm::kLayoutVersion;
  absl::StatusOr<std::unique_ptr<Segment>> seg = Segment::Create(so);
  if (!seg.ok()) return seg.status();
  return std::unique_ptr<Backend>(new ShmBackend(std::move(*seg), o));
}

}  // namespace adaptcomm

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

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/backend/op_checks.h"
#include "lib/backend/op_dispatch.h"
#include "lib/base/log.h"
#include "lib/base/op_views.h"
#include "lib/shm/shm_backend_class.h"
#include "lib/shm/shm_reduce.h"
#include "lib/shm/shm_segment.h"

namespace adaptcomm {
namespace shm {

absl::Status ShmBackend::Supports(const OpDesc& op) const {
  const char* kind = OpKindName(op.kind);
  if (absl::Status s = CheckHostOp(op, "shm", rank(), size()); !s.ok()) return s;
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

absl::Status ShmBackend::Run(const OpDesc& op) {
  return RunFramed(op, [&] {
    const absl::Time start = absl::Now();
    const OpCtx ctx{op, start, start + op.timeout};
    // A peer that broke the group fails this op before it touches the slots.
    if (absl::Status s = Interrupted(ctx); !s.ok()) return s;
    return OpDispatch::Run(op.kind, *this, ctx);
  });
}

absl::Status ShmBackend::Interrupted(const OpCtx& ctx) {
  if (aborted()) {
    absl::Status broken = health();
    return broken.ok() ? absl::AbortedError(absl::StrCat(What(ctx), "aborted")) : broken;
  }
  const uint32_t by = seg_->header().broken_by.load(std::memory_order_acquire);
  if (by == 0) return absl::OkStatus();
  const int r = static_cast<int>(by) - 1;
  const shm::RankInfo& info = seg_->info(r);
  const auto code = static_cast<absl::StatusCode>(info.broken_code.load(std::memory_order_acquire));
  std::string reason(info.broken_reason, strnlen(info.broken_reason, sizeof(info.broken_reason)));
  if (r == rank()) return absl::Status(code, reason);
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
  shm::RankInfo& me = seg_->info(rank());
  uint32_t expected = 0;
  // Only the first rank to break the group writes its reason there (its own record).
  if (seg_->header().broken_by.load(std::memory_order_acquire) == 0) {
    const std::string text(status.message());
    const size_t n = std::min(text.size(), sizeof(me.broken_reason) - 1);
    std::memcpy(me.broken_reason, text.data(), n);
    me.broken_reason[n] = '\0';
    me.broken_code.store(static_cast<int32_t>(status.code()), std::memory_order_release);
    seg_->header().broken_by.compare_exchange_strong(expected, static_cast<uint32_t>(rank()) + 1,
                                                     std::memory_order_acq_rel);
  }
  seg_->WakeAll();
}

void ShmBackend::Interrupt(const absl::Status& /*reason*/) { MarkGroupBroken(health()); }

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

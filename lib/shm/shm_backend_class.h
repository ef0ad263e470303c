// ShmBackend, the shm Backend: its class and the helpers its files share (shm_backend.cc: create,
// Supports, Run, waits and the broken record; shm_collectives.cc: the collectives and send/recv;
// shm_group.cc: the groups of ops). Internal to lib/shm.
#ifndef ADAPTCOMM_LIB_SHM_SHM_BACKEND_CLASS_H_
#define ADAPTCOMM_LIB_SHM_SHM_BACKEND_CLASS_H_

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/backend/backend_base.h"
#include "lib/backend/op_dispatch.h"
#include "lib/shm/shm_backend.h"
#include "lib/shm/shm_segment.h"

namespace adaptcomm::shm {

// Counters count modulo 2^32; `value` has reached `target` when it is at most 2^31 ahead.
inline bool Reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

inline int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Written before waking: a sleeper is woken only when one has announced itself (the seq_cst store
// and load on both sides make sure either the writer sees the waiter or the waiter sees the value).
inline void Publish(Counter& c, uint32_t v) {
  c.value.store(v, std::memory_order_seq_cst);
  if (c.waiters.load(std::memory_order_seq_cst) != 0) shm::FutexWakeAll(&c.value);
}

// The knob space of OpDesc::knobs this backend applies (TunedKnobs(): backend "shm").
inline constexpr char kKnobSpace[] = "shm";

struct OpCtx {
  const OpDesc& op;
  absl::Time start;
  absl::Time deadline;
};

class ShmBackend final : public BackendBase, public GroupRunner {
 public:
  ShmBackend(std::unique_ptr<Segment> segment, const ShmBackendOptions& o)
      : BackendBase({.name = "shm",
                     .rank = o.rank,
                     .size = o.size,
                     .capabilities = {.native_bf16 = true,  // reduced in fp32 by shm_reduce
                                      .native_avg = true,
                                      // memory, futexes and the pids of peers: no thread state
                                      .runs_on_any_thread = true,
                                      .wire_cast = true,
                                      // flat_max_bytes, chunk_bytes of allreduce and reduce
                                      .per_op_knobs = kKnobSpace}}),
        seg_(std::move(segment)),
        flat_max_(o.flat_max_bytes),
        chunk_(o.chunk_bytes == 0 ? seg_->slot_half_bytes()
                                  : std::min(o.chunk_bytes, seg_->slot_half_bytes())),
        tuned_allreduce_(o.tuned_allreduce),
        tuned_reduce_(o.tuned_reduce),
        spin_ns_(absl::ToInt64Nanoseconds(o.spin)),
        liveness_interval_(o.liveness_interval),
        sent_(o.size, 0),
        received_(o.size, 0),
        srcs_(o.size, nullptr) {}

  ~ShmBackend() override = default;

  absl::Status Supports(const OpDesc& op) const override;
  absl::Status Run(const OpDesc& op) override;
  GroupRunner* groups() override { return this; }
  absl::Status RunGroup(const std::vector<OpDesc>& ops) override;  // shm_group.cc
  std::vector<std::pair<std::string, int64_t>> StaticKnobs(OpKind kind,
                                                           uint64_t bytes) const override {
    if (kind != OpKind::kAllreduce && kind != OpKind::kReduce) return {};
    OpDesc op;
    op.kind = kind;
    return {{"flat_max_bytes", static_cast<int64_t>(FlatMaxFor(op, bytes))},
            {"chunk_bytes", static_cast<int64_t>(ChunkFor(op, bytes))}};
  }

 private:
  friend struct ::adaptcomm::OpDispatch;

  void Interrupt(const absl::Status& reason) override;
  // Tells every peer through the segment.
  void OnBroken(const absl::Status& failure) override { MarkGroupBroken(failure); }

  // The ops, as OpDispatch calls them.
  absl::Status Allreduce(const OpCtx& ctx) {
    if (ctx.op.wire.has_value()) return ReduceWire(ctx);
    return Reduction(ctx, static_cast<unsigned char*>(ctx.op.output.data), ctx.op.output.count, -1);
  }
  absl::Status Reduce(const OpCtx& ctx) {
    return Reduction(ctx, static_cast<unsigned char*>(ctx.op.output.data), ctx.op.output.count,
                     ctx.op.root);
  }
  absl::Status ReduceScatter(const OpCtx& ctx) { return BlockExchange(ctx, /*reduce=*/true); }
  absl::Status Alltoall(const OpCtx& ctx) { return BlockExchange(ctx, /*reduce=*/false); }
  absl::Status Reduction(const OpCtx& ctx, unsigned char* data, size_t count, int root);
  absl::Status ReduceFlat(const OpCtx& ctx, unsigned char* data, size_t count, int root);
  absl::Status ReduceChunk(const OpCtx& ctx, unsigned char* data, size_t count, int root);
  // OpDesc::wire allreduce: reduce-scatter/allgather in which the casts are the copies into and
  // out of the slots (the fp32 data never travels), in chunks of chunk_ wire bytes.
  absl::Status ReduceWire(const OpCtx& ctx);
  absl::Status ReduceWireChunk(const OpCtx& ctx, float* data, size_t count, WireStats& stats);
  // The flat-exchange bound and the pipeline chunk for a reduction of `bytes`: the op's own value
  // (OpDesc::knobs, online tuning), else a tuned band's where one holds the size, else the static
  // one. Every choice gives the same result bit for bit: each element is reduced in rank order on
  // the flat and the chunked path alike, whatever the chunk.
  size_t FlatMaxFor(const OpDesc& op, size_t bytes) const;
  size_t ChunkFor(const OpDesc& op, size_t bytes) const;
  absl::Status Broadcast(const OpCtx& ctx);
  absl::Status Allgather(const OpCtx& ctx);
  // reduce_scatter (reduce = true) and alltoall: each step stages one chunk of every block.
  absl::Status BlockExchange(const OpCtx& ctx, bool reduce);
  absl::Status Barrier(const OpCtx& ctx);
  absl::Status Send(const OpCtx& ctx);
  absl::Status Recv(const OpCtx& ctx);
  // A group's sends and receives (shm_group.cc): every pair's channel progresses at once.
  struct Stream;
  absl::Status Exchange(const OpCtx& ctx, const std::vector<OpDesc>& ops);
  bool PumpSend(Stream& st);
  absl::Status PumpRecv(const OpCtx& ctx, Stream& st, bool* progressed);
  // Starts a collective step; when this rank will write its slot half, first waits until every
  // rank is done with the step that last used that half.
  absl::Status BeginStep(const OpCtx& ctx, bool writes);
  void EndStep() { Publish(seg_->done(rank()), step_); }
  unsigned char* Half(int r) const { return seg_->slot(r, static_cast<int>(step_ & 1)); }
  absl::Status WaitAllPosted(const OpCtx& ctx, uint32_t target);

  // Waits until c.value reaches target; `peer` is the rank that writes it.
  absl::Status Wait(const OpCtx& ctx, Counter& c, uint32_t target, int peer);
  // Non-OK when this backend was aborted or a peer broke the group.
  absl::Status Interrupted(const OpCtx& ctx);
  std::string What(const OpCtx& ctx) const {
    return absl::StrCat(OpKindName(ctx.op.kind), " #", ctx.op.seq, " on rank ", rank(), ": shm: ");
  }
  std::string Waited(const OpCtx& ctx) const {
    return absl::StrCat("waited ", absl::FormatDuration(absl::Now() - ctx.start), " of ",
                        absl::FormatDuration(ctx.op.timeout));
  }
  // Records `status` in this rank's record of the segment (the first rank's only) and wakes every
  // waiter, so that the peers fail too.
  void MarkGroupBroken(const absl::Status& status);

  const std::unique_ptr<Segment> seg_;
  const size_t flat_max_;
  const size_t chunk_;
  const ShmBackendOptions::TunedBands tuned_allreduce_;
  const ShmBackendOptions::TunedBands tuned_reduce_;
  const int64_t spin_ns_;
  const absl::Duration liveness_interval_;

  // Only Run()'s thread touches these.
  uint32_t step_ = 0;               // collective steps begun; the same on every rank
  std::vector<uint32_t> sent_;      // chunks sent to each peer
  std::vector<uint32_t> received_;  // chunks received from each peer
  std::vector<const void*> srcs_;   // reduction sources, rank order

  absl::Mutex group_mu_;  // serializes writes of this rank's broken record in the segment
};

}  // namespace adaptcomm::shm

#endif  // ADAPTCOMM_LIB_SHM_SHM_BACKEND_CLASS_H_

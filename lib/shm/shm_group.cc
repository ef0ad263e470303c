// ShmBackend's groups of ops (GroupRunner): the collectives run in issue order, then every send and
// receive of the group progresses at once over the per-pair channels, so that no order of issue
// can make two ranks wait on each other.
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/shm/shm_backend_class.h"

namespace adaptcomm::shm {
namespace {

// After the spin, how long the progress loop sleeps on one channel's counter at first, and at
// most: a peer that writes another channel does not wake it, so the sleep stays short.
constexpr absl::Duration kFirstNap = absl::Microseconds(50);
constexpr absl::Duration kLongestNap = absl::Milliseconds(1);

}  // namespace

// The messages of a group between this rank and `peer` in one direction, in the order both ranks
// move them: by tag, then in issue order (a pair's channel carries them in order).
struct ShmBackend::Stream {
  int peer = 0;
  std::vector<const OpDesc*> messages;
  size_t next = 0;    // the message in progress
  size_t offset = 0;  // its bytes moved so far
  bool done() const { return next == messages.size(); }
};

absl::Status ShmBackend::RunGroup(const std::vector<OpDesc>& ops) {
  if (ops.empty()) return absl::OkStatus();
  if (absl::Status s = Refused(ops.front()); !s.ok()) return s;
  OpDesc bound = ops.front();  // the group's bound and name in messages
  for (const OpDesc& op : ops) {
    if (absl::Status s = Supports(op); !s.ok()) return s;
    bound.timeout = std::max(bound.timeout, op.timeout);
  }
  const absl::Time start = absl::Now();
  const OpCtx ctx{bound, start, start + bound.timeout};
  if (absl::Status s = Interrupted(ctx); !s.ok()) return Break(std::move(s));
  // Collectives first, in issue order, on every rank alike: none of them waits on a send or a
  // receive, so running them before the exchange cannot make a peer wait on this rank.
  for (const OpDesc& op : ops) {
    if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) continue;
    const absl::Time now = absl::Now();
    const OpCtx one{op, now, std::min(now + op.timeout, ctx.deadline)};
    absl::Status s = Dispatch(one);
    if (absl::IsInvalidArgument(s)) return s;
    if (!s.ok()) return Break(std::move(s));
  }
  absl::Status s = Exchange(ctx, ops);
  if (s.ok() || absl::IsInvalidArgument(s)) return s;
  return Break(std::move(s));
}

absl::Status ShmBackend::Exchange(const OpCtx& ctx, const std::vector<OpDesc>& ops) {
  std::map<int, Stream> by_dst, by_src;
  for (const OpDesc& op : ops) {
    if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) continue;
    Stream& st = (op.kind == OpKind::kSend ? by_dst : by_src)[op.peer];
    st.peer = op.peer;
    st.messages.push_back(&op);
  }
  std::vector<Stream> sends, recvs;
  for (auto* streams : {&by_dst, &by_src}) {
    for (auto& [peer, st] : *streams) {
      std::stable_sort(st.messages.begin(), st.messages.end(),
                       [](const OpDesc* a, const OpDesc* b) { return a->tag < b->tag; });
      (streams == &by_dst ? sends : recvs).push_back(std::move(st));
    }
  }
  int64_t spin_until = MonotonicNs() + spin_ns_;
  absl::Duration nap = kFirstNap;
  absl::Time next_probe = absl::Now() + liveness_interval_;
  bool stopped = false;
  while (true) {
    bool progressed = false;
    bool all_done = true;
    for (Stream& st : sends) {
      progressed |= PumpSend(st);
      all_done &= st.done();
    }
    for (Stream& st : recvs) {
      if (absl::Status s = PumpRecv(ctx, st, &progressed); !s.ok()) return s;
      all_done &= st.done();
    }
    if (all_done) return absl::OkStatus();
    if (progressed) {
      spin_until = MonotonicNs() + spin_ns_;
      nap = kFirstNap;
      continue;
    }
    if (MonotonicNs() < spin_until) {
      for (int i = 0; i < 16; ++i) CpuRelax();
      sched_yield();
      continue;
    }
    if (absl::Status s = Interrupted(ctx); !s.ok()) return s;
    // Blocked on the first unfinished stream's peer: the one whose liveness is probed, and whose
    // counter this rank sleeps on (a receive waits for `sent`, a send for `consumed`).
    const Stream* blocked = nullptr;
    bool receiving = false;
    for (const Stream& st : recvs) {
      if (!st.done()) {
        blocked = &st;
        receiving = true;
        break;
      }
    }
    for (const Stream& st : sends) {
      if (blocked == nullptr && !st.done()) blocked = &st;
    }
    const int peer = blocked->peer;
    const RankInfo& info = seg_->info(peer);
    const pid_t pid = info.pid.load(std::memory_order_acquire);
    const absl::Time now = absl::Now();
    if (now >= next_probe) {
      next_probe = now + liveness_interval_;
      const ProcessState state = ProbeProcess(pid, info.start_time);
      if (state == ProcessState::kGone) {
        return absl::UnavailableError(absl::StrCat(What(ctx), "group: peer rank ", peer, " (pid ",
                                                   pid, ") exited; ", Waited(ctx)));
      }
      stopped = state == ProcessState::kStopped;
    }
    if (now >= ctx.deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          What(ctx), "group: timed out ", receiving ? "receiving from" : "sending to",
          " peer rank ", peer, " (pid ", pid, stopped ? ", stopped" : "", "); ", Waited(ctx)));
    }
    Counter& c = receiving ? seg_->channel(peer, rank_).sent : seg_->channel(rank_, peer).consumed;
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = c.value.load(std::memory_order_seq_cst);
    FutexWait(&c.value, seen, std::min({nap, next_probe - now, ctx.deadline - now}));
    c.waiters.fetch_sub(1, std::memory_order_seq_cst);
    nap = std::min(nap * 2, kLongestNap);
  }
}

bool ShmBackend::PumpSend(Stream& st) {
  bool progressed = false;
  Channel& ch = seg_->channel(rank_, st.peer);
  const size_t half = seg_->p2p_half_bytes();
  while (!st.done()) {
    const OpDesc& op = *st.messages[st.next];
    const size_t bytes = op.input.bytes();
    const uint32_t k = sent_[st.peer] + 1;
    if (!Reached(ch.consumed.value.load(std::memory_order_acquire), k - 2)) break;
    const int h = static_cast<int>(k & 1);
    const size_t m = std::min(half, bytes - st.offset);
    ch.desc[h] = ChunkDesc{op.tag, bytes, m};
    std::memcpy(seg_->p2p(rank_, st.peer, h),
                static_cast<const unsigned char*>(op.input.data) + st.offset, m);
    sent_[st.peer] = k;
    Publish(ch.sent, k);
    st.offset += m;
    progressed = true;
    if (st.offset >= bytes) {
      ++st.next;
      st.offset = 0;
    }
  }
  return progressed;
}

absl::Status ShmBackend::PumpRecv(const OpCtx& ctx, Stream& st, bool* progressed) {
  Channel& ch = seg_->channel(st.peer, rank_);
  while (!st.done()) {
    const OpDesc& op = *st.messages[st.next];
    const size_t bytes = op.output.bytes();
    const uint32_t k = received_[st.peer] + 1;
    if (!Reached(ch.sent.value.load(std::memory_order_acquire), k)) break;
    const int h = static_cast<int>(k & 1);
    const ChunkDesc d = ch.desc[h];
    if (d.tag != op.tag || d.total_bytes != bytes || d.chunk_bytes > bytes - st.offset) {
      // The channel is out of step now: this backend cannot continue.
      return absl::InternalError(absl::StrCat(
          What(ctx), "group: expected tag ", op.tag, " with ", bytes, " bytes from rank ", st.peer,
          ", but its next message has tag ", d.tag, " with ", d.total_bytes,
          " bytes (a group's messages between two ranks pair up by tag, then in issue order: both "
          "ranks' groups must hold the same ones)"));
    }
    std::memcpy(static_cast<unsigned char*>(op.output.data) + st.offset,
                seg_->p2p(st.peer, rank_, h), d.chunk_bytes);
    received_[st.peer] = k;
    Publish(ch.consumed, k);
    st.offset += d.chunk_bytes;
    *progressed = true;
    if (st.offset >= bytes) {
      ++st.next;
      st.offset = 0;
    }
  }
  return absl::OkStatus();
}

}  // namespace adaptcomm::shm

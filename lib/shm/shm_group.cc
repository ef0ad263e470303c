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
#include "lib/backend/op_dispatch.h"
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
  return RunGroupFramed(ops, [&](const OpDesc& bound) -> absl::Status {
    const absl::Time start = absl::Now();
    const OpCtx ctx{bound, start, start + bound.timeout};
    if (absl::Status s = Interrupted(ctx); !s.ok()) return s;
    // Collectives first, in issue order, on every rank alike: none of them waits on a send or a
    // receive, so running them before the exchange cannot make a peer wait on this rank.
    for (const OpDesc& op : ops) {
      if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) continue;
      const absl::Time now = absl::Now();
      const OpCtx one{op, now, std::min(now + op.timeout, ctx.deadline)};
      if (absl::Status s = OpDispatch::Run(op.kind, *this, one); !s.ok()) return s;
    }
    return Exchange(ctx, ops);
  });
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
    Counter& c =
        receiving ? seg_->channel(peer, rank()).sent : seg_->channel(rank(), peer).consumed;
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = c.value.load(std::memory_order_seq_cst);
    FutexWait(&c.value, seen, std::min({nap, next_probe - now, ctx.deadline - now}));
    c.waiters.fetch_sub(1, std::memory_order_seq_cst);
    nap = std::min(nap * 2, kLongestNap);
  }
}

namespace {

// Consecutive small messages of a stream travel together in one chunk (a batch): a ring shift of
// many small pairs then costs about what one pair of their total size does, where one message per
// chunk made it wait for the peer every two messages. ChunkDesc::total_bytes = kBatch marks one;
// its data starts with the entries, then each message's bytes at an 8-byte aligned offset.
constexpr uint64_t kBatch = ~uint64_t{0};
struct BatchEntry {
  uint32_t tag;
  uint32_t reserved;
  uint64_t bytes;
};
constexpr size_t Align8(size_t n) { return (n + 7) & ~size_t{7}; }

}  // namespace

bool ShmBackend::PumpSend(Stream& st) {
  bool progressed = false;
  Channel& ch = seg_->channel(rank(), st.peer);
  const size_t half = seg_->p2p_half_bytes();
  while (!st.done()) {
    const uint32_t k = sent_[st.peer] + 1;
    if (!Reached(ch.consumed.value.load(std::memory_order_acquire), k - 2)) break;
    const int h = static_cast<int>(k & 1);
    unsigned char* dst = seg_->p2p(rank(), st.peer, h);
    // How many whole messages from here fit in one chunk as a batch.
    size_t n = 0, used = 0;
    if (st.offset == 0) {
      while (st.next + n < st.messages.size()) {
        const size_t entries = Align8(sizeof(uint32_t)) + (n + 1) * sizeof(BatchEntry);
        size_t data = 0;
        for (size_t i = 0; i <= n; ++i) data += Align8(st.messages[st.next + i]->input.bytes());
        if (entries + data > half) break;
        used = entries + data;
        ++n;
      }
    }
    if (n >= 2) {
      const uint32_t count = static_cast<uint32_t>(n);
      std::memcpy(dst, &count, sizeof(count));
      auto* entries = reinterpret_cast<BatchEntry*>(dst + Align8(sizeof(uint32_t)));
      size_t off = Align8(sizeof(uint32_t)) + n * sizeof(BatchEntry);
      for (size_t i = 0; i < n; ++i) {
        const OpDesc& op = *st.messages[st.next + i];
        entries[i] = BatchEntry{op.tag, 0, op.input.bytes()};
        if (op.input.bytes() > 0) std::memcpy(dst + off, op.input.data, op.input.bytes());
        off += Align8(op.input.bytes());
      }
      ch.desc[h] = ChunkDesc{0, kBatch, used};
      st.next += n;
    } else {
      const OpDesc& op = *st.messages[st.next];
      const size_t bytes = op.input.bytes();
      const size_t m = std::min(half, bytes - st.offset);
      ch.desc[h] = ChunkDesc{op.tag, bytes, m};
      if (m > 0) std::memcpy(dst, static_cast<const unsigned char*>(op.input.data) + st.offset, m);
      st.offset += m;
      if (st.offset >= bytes) {
        ++st.next;
        st.offset = 0;
      }
    }
    sent_[st.peer] = k;
    Publish(ch.sent, k);
    progressed = true;
  }
  return progressed;
}

absl::Status ShmBackend::PumpRecv(const OpCtx& ctx, Stream& st, bool* progressed) {
  Channel& ch = seg_->channel(st.peer, rank());
  auto mismatch = [&](uint32_t tag, uint64_t bytes) {
    // The channel is out of step now: this backend cannot continue.
    const OpDesc& op = *st.messages[st.next];
    return absl::InternalError(absl::StrCat(
        What(ctx), "group: expected tag ", op.tag, " with ", op.output.bytes(), " bytes from rank ",
        st.peer, ", but its next message has tag ", tag, " with ", bytes,
        " bytes (a group's messages between two ranks pair up by tag, then in issue order: both "
        "ranks' groups must hold the same ones)"));
  };
  while (!st.done()) {
    const uint32_t k = received_[st.peer] + 1;
    if (!Reached(ch.sent.value.load(std::memory_order_acquire), k)) break;
    const int h = static_cast<int>(k & 1);
    const ChunkDesc d = ch.desc[h];
    const unsigned char* src = seg_->p2p(st.peer, rank(), h);
    if (d.total_bytes == kBatch) {
      uint32_t count = 0;
      std::memcpy(&count, src, sizeof(count));
      const auto* entries = reinterpret_cast<const BatchEntry*>(src + Align8(sizeof(uint32_t)));
      size_t off = Align8(sizeof(uint32_t)) + count * sizeof(BatchEntry);
      for (uint32_t i = 0; i < count; ++i) {
        if (st.done() || st.offset != 0) return mismatch(entries[i].tag, entries[i].bytes);
        const OpDesc& op = *st.messages[st.next];
        if (entries[i].tag != op.tag || entries[i].bytes != op.output.bytes()) {
          return mismatch(entries[i].tag, entries[i].bytes);
        }
        if (op.output.bytes() > 0) std::memcpy(op.output.data, src + off, op.output.bytes());
        off += Align8(op.output.bytes());
        ++st.next;
      }
    } else {
      const OpDesc& op = *st.messages[st.next];
      const size_t bytes = op.output.bytes();
      if (d.tag != op.tag || d.total_bytes != bytes || d.chunk_bytes > bytes - st.offset) {
        return mismatch(d.tag, d.total_bytes);
      }
      if (d.chunk_bytes > 0) {
        std::memcpy(static_cast<unsigned char*>(op.output.data) + st.offset, src, d.chunk_bytes);
      }
      st.offset += d.chunk_bytes;
      if (st.offset >= bytes) {
        ++st.next;
        st.offset = 0;
      }
    }
    received_[st.peer] = k;
    Publish(ch.consumed, k);
    *progressed = true;
  }
  return absl::OkStatus();
}

}  // namespace adaptcomm::shm

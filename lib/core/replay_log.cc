#include "lib/core/replay_log.h"

#include <cstring>

namespace adaptcomm::internal {
namespace {

bool InPlace(OpKind kind) {
  return kind == OpKind::kAllreduce || kind == OpKind::kBroadcast || kind == OpKind::kReduce;
}

}  // namespace

ReplayLog::Entry* ReplayLog::Find(uint64_t seq) {
  Entry& e = entries_[seq % entries_.size()];
  return e.seq == seq ? &e : nullptr;
}

const ReplayLog::Entry* ReplayLog::Find(uint64_t seq) const {
  const Entry& e = entries_[seq % entries_.size()];
  return e.seq == seq ? &e : nullptr;
}

bool ReplayLog::Record(const OpDesc& op) {
  Entry& e = entries_[op.seq % entries_.size()];
  e.seq = op.seq;
  e.op = op;
  e.replayable = !op.input.device.is_cuda() && !op.output.device.is_cuda();
  if (!e.replayable) return false;
  const size_t bytes = op.input.bytes();
  if (e.input.size() < bytes) e.input.resize(bytes);
  if (bytes > 0) std::memcpy(e.input.data(), op.input.data, bytes);
  return true;
}

bool ReplayLog::Covers(uint64_t from, uint64_t to) const {
  if (to >= from && to - from >= entries_.size()) return false;
  for (uint64_t seq = from; seq <= to; ++seq) {
    const Entry* e = Find(seq);
    if (e == nullptr || !e->replayable) return false;
  }
  return true;
}

void ReplayLog::RestoreInput(uint64_t seq) {
  Entry* e = Find(seq);
  if (e == nullptr || !InPlace(e->op.kind) || e->op.input.bytes() == 0) return;
  std::memcpy(e->op.input.data, e->input.data(), e->op.input.bytes());
}

OpDesc ReplayLog::DetachedCopy(uint64_t seq) {
  Entry* e = Find(seq);
  OpDesc op = e->op;
  op.input.data = op.input.bytes() > 0 ? e->input.data() : nullptr;
  if (InPlace(op.kind)) {
    // In place on a scratch copy of the record: the caller's buffer already holds the result, and
    // the record must survive for a further attempt.
    const size_t bytes = op.input.bytes();
    if (e->output_scratch.size() < bytes) e->output_scratch.resize(bytes);
    if (bytes > 0) std::memcpy(e->output_scratch.data(), e->input.data(), bytes);
    op.input.data = bytes > 0 ? e->output_scratch.data() : nullptr;
    op.output = op.input;
  } else if (op.output.bytes() > 0) {
    if (e->output_scratch.size() < op.output.bytes()) e->output_scratch.resize(op.output.bytes());
    op.output.data = e->output_scratch.data();
  }
  return op;
}

}  // namespace adaptcomm::internal

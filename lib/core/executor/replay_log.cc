#include "lib/core/executor/replay_log.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/byte_text.h"
#include "lib/base/stream_copy.h"

namespace adaptcomm::internal {
namespace {

bool InPlace(OpKind kind) {
  return kind == OpKind::kAllreduce || kind == OpKind::kBroadcast || kind == OpKind::kReduce;
}

// The view whose memory and stream the op's copies use: its input, or its output if it has none.
const TensorView& PrimaryView(const OpDesc& op) {
  return op.input.bytes() > 0 || op.output.bytes() == 0 ? op.input : op.output;
}

bool OnCuda(const OpDesc& op) { return op.input.device.is_cuda() || op.output.device.is_cuda(); }

}  // namespace

absl::StatusOr<void*> ReplayBuffer::Reserve(size_t bytes, Device device,
                                            const std::shared_ptr<DeviceMemory>& memory) {
  if (!device.is_cuda()) {
    if (host_.size() < bytes) host_.resize(bytes);
    return host_.data();
  }
  if (device_data_ != nullptr && device_.index == device.index && device_bytes_ >= bytes) {
    return device_data_;
  }
  ReleaseDevice();
  absl::StatusOr<void*> data = memory->Allocate(device, bytes);
  if (!data.ok()) return data.status();
  device_data_ = *data;
  device_bytes_ = bytes;
  device_ = device;
  memory_ = memory;
  return device_data_;
}

void ReplayBuffer::ReleaseDevice() {
  if (device_data_ != nullptr) memory_->Free(device_, device_data_);
  device_data_ = nullptr;
  device_bytes_ = 0;
  memory_ = nullptr;
}

ReplayLog::Entry* ReplayLog::Find(uint64_t seq) {
  Entry& e = entries_[seq % entries_.size()];
  return e.seq == seq ? &e : nullptr;
}

const ReplayLog::Entry* ReplayLog::Find(uint64_t seq) const {
  const Entry& e = entries_[seq % entries_.size()];
  return e.seq == seq ? &e : nullptr;
}

absl::Status ReplayLog::Copy(const Entry& e, void* dst, const void* src, size_t bytes,
                             StreamOrdered* ordered) {
  if (bytes == 0) return absl::OkStatus();
  if (e.memory == nullptr) {
    StreamCopy(dst, src, bytes);
    return absl::OkStatus();
  }
  if (ordered != nullptr && e.op.issued_at != nullptr) {
    return ordered->CopyAt(*e.op.issued_at, dst, src, bytes);
  }
  const TensorView& v = PrimaryView(e.op);
  return e.memory->CopyAsync(dst, src, bytes, v.device, v.stream);
}

absl::Status ReplayLog::Record(const OpDesc& op, std::shared_ptr<DeviceMemory> memory,
                               StreamOrdered* ordered) {
  const bool borrowed = op.stable_input && !InPlace(op.kind);
  if (!borrowed && !copy_inputs_ && op.input.bytes() > 0) {
    // Checked first, and the message made once: this is every such op's path with defaults.
    static const absl::Status kNotRecorded = absl::FailedPreconditionError(
        "retry.replay is auto, which copies no input: an op that overwrites its input, or an "
        "out-of-place op without stable_input, is not re-run alone (bracket the trainer's steps "
        "with BeginStep/CommitStep to redo a failed step, or set retry.replay: copy)");
    return kNotRecorded;
  }
  Entry& e = entries_[op.seq % entries_.size()];
  arena_.Release(e.record);  // the op it held is past the window
  e.record = {};
  e.seq = op.seq;
  e.op = op;
  e.replayable = false;
  e.memory = nullptr;
  if (OnCuda(op)) {
    if (memory == nullptr) {
      return absl::UnimplementedError(
          "the backend offers no device memory services: ops on CUDA memory are not replayable");
    }
    const bool one_device =
        (op.input.bytes() == 0 || op.input.device.is_cuda()) &&
        (op.output.bytes() == 0 ||
         (op.output.device.is_cuda() && op.output.device.index == PrimaryView(op).device.index));
    if (!one_device) {
      return absl::UnimplementedError("an op on host and CUDA memory at once is not replayable");
    }
    e.memory = std::move(memory);
  }
  e.borrowed = borrowed;
  if (e.borrowed) {
    e.input_copy = op.input.data;
  } else if (absl::Status s = CopyInput(e, op.input.data, ordered); !s.ok()) {
    return s;
  }
  e.replayable = true;
  return absl::OkStatus();
}

absl::Status ReplayLog::CopyInput(Entry& e, const void* src, StreamOrdered* ordered) {
  const size_t bytes = e.op.input.bytes();
  if (e.memory != nullptr) {
    // Record() released the range of the op this entry held before (a borrowed entry has none).
    absl::StatusOr<DeviceRecordArena::Range> range =
        arena_.Take(PrimaryView(e.op).device, bytes, e.memory);
    if (!range.ok()) return range.status();
    e.record = *range;
    if (absl::Status s = Copy(e, e.record.data, src, bytes, ordered); !s.ok()) return s;
    e.input_copy = e.record.data;
    e.borrowed = false;
    return absl::OkStatus();
  }
  const size_t turn = e.seq % kHostRecords;
  if (host_record_seq_[turn] != e.seq) {
    if (Entry* previous = host_record_seq_[turn] != 0 ? Find(host_record_seq_[turn]) : nullptr;
        previous != nullptr && previous->memory == nullptr && !previous->borrowed) {
      previous->replayable = false;
    }
    host_record_seq_[turn] = e.seq;
  }
  absl::StatusOr<void*> copy =
      host_records_[turn].Reserve(bytes, PrimaryView(e.op).device, /*memory=*/nullptr);
  if (!copy.ok()) return copy.status();
  if (absl::Status s = Copy(e, *copy, src, bytes, ordered); !s.ok()) return s;
  e.input_copy = *copy;
  e.borrowed = false;
  return absl::OkStatus();
}

void ReplayLog::BeforeOp(const OpDesc& next, StreamOrdered* ordered) {
  const OpKind k = next.kind;
  const bool proves_entry = k == OpKind::kAllreduce || k == OpKind::kAllgather ||
                            k == OpKind::kReduceScatter || k == OpKind::kAlltoall ||
                            k == OpKind::kBarrier;
  if (proves_entry || next.seq < 2) return;
  Entry* e = Find(next.seq - 1);
  if (e == nullptr || !e->borrowed) return;
  // Without copies (retry.replay auto) the record goes: the promise no longer covers it.
  if (!copy_inputs_ || !CopyInput(*e, e->input_copy, ordered).ok()) e->replayable = false;
}

bool ReplayLog::Covers(uint64_t from, uint64_t to) const {
  if (to >= from && to - from >= entries_.size()) return false;
  for (uint64_t seq = from; seq <= to; ++seq) {
    const Entry* e = Find(seq);
    if (e == nullptr || !e->replayable) return false;
  }
  return true;
}

absl::Status ReplayLog::RestoreInput(uint64_t seq, StreamOrdered* ordered) {
  Entry* e = Find(seq);
  if (e == nullptr || !e->replayable || !InPlace(e->op.kind)) return absl::OkStatus();
  return Copy(*e, e->op.input.data, e->input_copy, e->op.input.bytes(), ordered);
}

absl::StatusOr<OpDesc> ReplayLog::DetachedCopy(uint64_t seq, StreamOrdered* ordered) {
  Entry* e = Find(seq);
  if (e == nullptr || !e->replayable) {
    return absl::FailedPreconditionError(absl::StrCat("op #", seq, " was not recorded"));
  }
  OpDesc op = e->op;
  op.wire_stats = nullptr;  // the caller took its op's counts when it completed
  const Device device = PrimaryView(op).device;
  if (InPlace(op.kind)) {
    // In place on a scratch copy of the record: the caller's buffer already holds the result, and
    // the record must survive for a further attempt.
    const size_t bytes = op.input.bytes();
    absl::StatusOr<void*> scratch = scratch_.Reserve(bytes, device, e->memory);
    if (!scratch.ok()) return scratch.status();
    if (absl::Status s = Copy(*e, *scratch, e->input_copy, bytes, ordered); !s.ok()) return s;
    op.input.data = bytes > 0 ? *scratch : nullptr;
    op.output = op.input;
    return op;
  }
  op.input.data = op.input.bytes() > 0 ? const_cast<void*>(e->input_copy) : nullptr;
  if (op.output.bytes() > 0) {
    absl::StatusOr<void*> scratch = scratch_.Reserve(op.output.bytes(), device, e->memory);
    if (!scratch.ok()) return scratch.status();
    op.output.data = *scratch;
  }
  return op;
}

}  // namespace adaptcomm::internal

// ReplayLog: copies of the inputs of the last few operations, so that a coordinated retry can
// re-run them bit for bit after the backend was rebuilt. Used only with retry.replay copy, and for
// the ops that need no copy (out-of-place with stable_input, barriers) with retry.replay auto:
// a trainer's steps (OpExecutor, "Steps") need no record at all.
//
// Why copies: an in-place op (allreduce, broadcast, reduce) overwrites its input, and the caller
// may reuse any buffer as soon as its Work completed. Cost while retries are on: one copy of each
// op's input before it runs - a memcpy for host memory; for CUDA memory a device-to-device copy
// queued without any host synchronization: for a stream-ordered op on the backend's own stream,
// behind the op's issue point and ahead of the collective (StreamOrdered::CopyAt; on the caller's
// stream the collective, which waits only for the issue point, could overwrite the input before
// the copy read it), otherwise on the op's stream (through the backend's DeviceMemory). Device
// records live in device memory: up to `depth` times the largest input plus one output scratch,
// allocated on first use and reused (no allocation in steady state), and bounded by the record
// budget (profile retry.record_bytes): an op whose record would take the device records past it is
// not recorded, so it is not replayable, rather than taking the trainer's memory. Host ops run one
// at a time, so their records need no such depth: they share kHostRecords host buffers, whatever
// `depth` the device ops' window asks for (a host record older than that is dropped: not
// replayable). Ops on CUDA memory under a backend without DeviceMemory are not replayable.
#ifndef ADAPTCOMM_LIB_CORE_EXECUTOR_REPLAY_LOG_H_
#define ADAPTCOMM_LIB_CORE_EXECUTOR_REPLAY_LOG_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adaptcomm/ext/backend.h"
#include "lib/core/executor/device_record_arena.h"

namespace adaptcomm::internal {

// Host bytes or device bytes, grown on demand and kept.
class ReplayBuffer {
 public:
  ReplayBuffer() = default;
  ReplayBuffer(const ReplayBuffer&) = delete;
  ReplayBuffer& operator=(const ReplayBuffer&) = delete;
  ~ReplayBuffer() { ReleaseDevice(); }

  // At least `bytes` in the memory of `device` (through `memory` when it is a CUDA device).
  absl::StatusOr<void*> Reserve(size_t bytes, Device device,
                                const std::shared_ptr<DeviceMemory>& memory);
  // Device memory held (0 for host bytes).
  size_t device_bytes() const { return device_bytes_; }

 private:
  void ReleaseDevice();
  std::vector<unsigned char> host_;
  void* device_data_ = nullptr;
  size_t device_bytes_ = 0;
  Device device_;
  std::shared_ptr<DeviceMemory> memory_;
};

class ReplayLog {
 public:
  // Keeps the last `depth` ops. Collectives let no rank run more than one op ahead of another,
  // so a small depth covers every restart point a vote can produce.
  // `device_record_bytes`: the device memory the records of device ops share, per device (not
  // counting the re-run scratch, which a recovery's first re-run allocates).
  // `copy_inputs`: retry.replay copy; false (auto) records only ops whose input needs no copy
  // (out-of-place with stable_input, or none at all) and refuses the others.
  explicit ReplayLog(size_t depth = 4, uint64_t device_record_bytes = kDefaultDeviceRecordBytes,
                     bool copy_inputs = true)
      : entries_(depth), arena_(device_record_bytes), copy_inputs_(copy_inputs) {}
  static constexpr uint64_t kDefaultDeviceRecordBytes = uint64_t{64} << 20;

  // Host buffers of host ops' records: a window of one op behind and ahead of this rank's oldest
  // unfinished op, with room to spare.
  static constexpr size_t kHostRecords = 4;

  size_t depth() const { return entries_.size(); }

  // Copies op's input (before it runs). `memory`: the running backend's device services (null if
  // it has none); `ordered`: its stream order (null if it has none), which takes the copies of ops
  // with a stream position (OpDesc::issued_at). OK if the op can be replayed, else why not (the op
  // then runs without a retry).
  absl::Status Record(const OpDesc& op, std::shared_ptr<DeviceMemory> memory,
                      StreamOrdered* ordered);
  // Before op `next` runs: an op whose completion does not prove that every rank entered it
  // (broadcast, reduce, send, recv) cannot retire the op before it, so a record of that op that
  // refers to the caller's stable input (OpDesc::stable_input) is copied now, while the promise
  // still holds. A failed copy makes that op not replayable.
  void BeforeOp(const OpDesc& next, StreamOrdered* ordered);
  // Whether ops [from, to] are all recorded.
  bool Covers(uint64_t from, uint64_t to) const;
  // Restores the recorded input of `seq` into the op's own buffers (in-place ops, before a re-run
  // of the op that failed), through `ordered` as Record.
  absl::Status RestoreInput(uint64_t seq, StreamOrdered* ordered);
  // The op `seq` rewritten to read the recorded input and write into scratch: for re-running an op
  // that already completed here, whose buffers belong to the caller again (an in-place op's
  // record is copied into the scratch through `ordered` as Record). REQUIRES: Covers(seq, seq).
  absl::StatusOr<OpDesc> DetachedCopy(uint64_t seq, StreamOrdered* ordered);

 private:
  struct Entry {
    uint64_t seq = 0;
    bool replayable = false;
    OpDesc op;
    std::shared_ptr<DeviceMemory> memory;  // set for ops on CUDA memory
    DeviceRecordArena::Range record;       // a device op's record (host ops' are in host_records_)
    // The recorded bytes: in `input`, in host_records_, or the caller's own.
    const void* input_copy = nullptr;
    bool borrowed = false;  // input_copy is the caller's stable input
  };
  Entry* Find(uint64_t seq);
  const Entry* Find(uint64_t seq) const;
  // Copies the input into the entry's buffer: a range of the arena for a device op, else the host
  // buffer of its turn, whose previous record is dropped.
  absl::Status CopyInput(Entry& e, const void* src, StreamOrdered* ordered);
  // A copy in the memory of the op's views: memcpy, or queued on the device (see the top).
  static absl::Status Copy(const Entry& e, void* dst, const void* src, size_t bytes,
                           StreamOrdered* ordered);
  std::vector<Entry> entries_;
  DeviceRecordArena arena_;  // after entries_: its slabs outlive no record
  const bool copy_inputs_;
  ReplayBuffer host_records_[kHostRecords];
  uint64_t host_record_seq_[kHostRecords] = {};  // the op whose record each holds (0: none)
  ReplayBuffer scratch_;  // detached re-runs run one at a time: one scratch serves them all
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_EXECUTOR_REPLAY_LOG_H_

// DeviceRecordArena: the device memory of the coordinated retry's records of device ops
// (retry.replay copy), taken from each device once and handed out as a ring.
//
// Why: growing a record buffer when a larger op comes along calls cudaMalloc/cudaFree, which
// synchronise the device and may run on the trainer's issuing thread at any step. The arena
// allocates one slab of `capacity` bytes (profile retry.record_bytes) per device, at the first
// record on that device, and never again: records are cut from the slab in issue order, wrapping
// to its start, and a record that would overlap one still held is refused (the op then runs
// without a retry, counted as unprotected). Records are released in about the order they were
// taken (the replay log's window slides), so the free space stays one run and any op up to the
// capacity less the records in flight fits.
// Thread safety: none; the replay log's single writer owns it.
#ifndef ADAPTCOMM_LIB_CORE_EXECUTOR_DEVICE_RECORD_ARENA_H_
#define ADAPTCOMM_LIB_CORE_EXECUTOR_DEVICE_RECORD_ARENA_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "adaptcomm/ext/backend.h"

namespace adaptcomm::internal {

class DeviceRecordArena {
 public:
  // A piece of a slab; `bytes == 0`: none.
  struct Range {
    void* data = nullptr;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    int device = -1;
  };

  explicit DeviceRecordArena(uint64_t capacity) : capacity_(capacity) {}
  DeviceRecordArena(const DeviceRecordArena&) = delete;
  DeviceRecordArena& operator=(const DeviceRecordArena&) = delete;
  ~DeviceRecordArena();

  // `bytes` of `device`'s slab that no held range overlaps (the slab is allocated through
  // `memory` on the device's first call). ResourceExhausted says why not: past the capacity, or
  // the records still held leave no run that long.
  absl::StatusOr<Range> Take(Device device, uint64_t bytes,
                             const std::shared_ptr<DeviceMemory>& memory);
  // Gives `range` back (a range with no bytes is ignored).
  void Release(const Range& range);

  uint64_t capacity() const { return capacity_; }
  // Bytes held by records on every device together.
  uint64_t held_bytes() const;

 private:
  struct Slab {
    int device = -1;
    void* data = nullptr;
    std::shared_ptr<DeviceMemory> memory;
    uint64_t head = 0;        // where the next range starts
    std::vector<Range> held;  // in the order taken
  };
  Slab* SlabOf(int device);
  static bool Overlaps(const Slab& slab, uint64_t offset, uint64_t bytes);

  const uint64_t capacity_;
  std::vector<Slab> slabs_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_EXECUTOR_DEVICE_RECORD_ARENA_H_

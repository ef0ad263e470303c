#include "lib/core/executor/device_record_arena.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lib/base/byte_text.h"

namespace adaptcomm::internal {

DeviceRecordArena::~DeviceRecordArena() {
  for (Slab& slab : slabs_) {
    if (slab.data != nullptr) slab.memory->Free(Device::Cuda(slab.device), slab.data);
  }
}

DeviceRecordArena::Slab* DeviceRecordArena::SlabOf(int device) {
  for (Slab& slab : slabs_) {
    if (slab.device == device) return &slab;
  }
  return nullptr;
}

bool DeviceRecordArena::Overlaps(const Slab& slab, uint64_t offset, uint64_t bytes) {
  return std::any_of(slab.held.begin(), slab.held.end(), [&](const Range& r) {
    return offset < r.offset + r.bytes && r.offset < offset + bytes;
  });
}

absl::StatusOr<DeviceRecordArena::Range> DeviceRecordArena::Take(
    Device device, uint64_t bytes, const std::shared_ptr<DeviceMemory>& memory) {
  if (bytes == 0) return Range{};
  if (bytes > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "its retry record (", ByteSizeText(bytes), ") is larger than retry.record_bytes (",
        ByteSizeText(capacity_), "), the device memory kept for records"));
  }
  Slab* slab = SlabOf(device.index);
  if (slab == nullptr) {
    // The one allocation of this device's records.
    absl::StatusOr<void*> data = memory->Allocate(device, capacity_);
    if (!data.ok()) return data.status();
    slabs_.push_back(
        Slab{.device = device.index, .data = *data, .memory = memory, .head = 0, .held = {}});
    slab = &slabs_.back();
  }
  uint64_t offset = slab->head;
  if (offset + bytes > capacity_ || Overlaps(*slab, offset, bytes)) offset = 0;  // wrap
  if (Overlaps(*slab, offset, bytes)) {
    uint64_t held = 0;
    for (const Range& r : slab->held) held += r.bytes;
    return absl::ResourceExhaustedError(absl::StrCat(
        "its retry record (", ByteSizeText(bytes), ") does not fit beside the ", slab->held.size(),
        " records in flight (", ByteSizeText(held), ") in retry.record_bytes (",
        ByteSizeText(capacity_), "); lower retry.in_flight or raise retry.record_bytes"));
  }
  Range range{.data = static_cast<unsigned char*>(slab->data) + offset,
              .offset = offset,
              .bytes = bytes,
              .device = device.index};
  slab->held.push_back(range);
  slab->head = offset + bytes;
  return range;
}

void DeviceRecordArena::Release(const Range& range) {
  if (range.bytes == 0) return;
  Slab* slab = SlabOf(range.device);
  if (slab == nullptr) return;
  auto it = std::find_if(slab->held.begin(), slab->held.end(), [&](const Range& r) {
    return r.offset == range.offset && r.bytes == range.bytes;
  });
  if (it != slab->held.end()) slab->held.erase(it);
}

uint64_t DeviceRecordArena::held_bytes() const {
  uint64_t held = 0;
  for (const Slab& slab : slabs_) {
    for (const Range& r : slab.held) held += r.bytes;
  }
  return held;
}

}  // namespace adaptcomm::internal

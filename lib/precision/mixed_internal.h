// Internal to lib/precision/mixed*.cc: the hook registry, the context state, and the helpers the
// host runner (mixed_runner.h) and the device path (mixed_device.cc) share; defined in
// mixed_hooks.cc.
#ifndef ADAPTCOMM_LIB_PRECISION_MIXED_INTERNAL_H_
#define ADAPTCOMM_LIB_PRECISION_MIXED_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/precision.h"

namespace adaptcomm {

struct HookHandle::Registry {
  struct Entry {
    uint64_t id;
    HookPoint point;
    std::string name;
    std::shared_ptr<const MixedHook> fn;
  };
  absl::Mutex mu;
  std::vector<Entry> entries ABSL_GUARDED_BY(mu);
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;

  std::vector<Entry> Snapshot(HookPoint point) {
    absl::MutexLock lock(&mu);
    std::vector<Entry> out;
    for (const Entry& e : entries)
      if (e.point == point) out.push_back(e);
    return out;
  }
  bool Empty() {
    absl::MutexLock lock(&mu);
    return entries.empty();
  }
};

struct MixedPrecisionContext::State {
  Communicator* comm = nullptr;
  std::shared_ptr<HookHandle::Registry> hooks = std::make_shared<HookHandle::Registry>();
  absl::Mutex call_mu;  // one mixed op at a time per context
  uint64_t seq ABSL_GUARDED_BY(call_mu) = 0;
  // Scratch: the wire data this rank sends, and what it receives when that differs in size.
  std::vector<uint16_t> wire_in ABSL_GUARDED_BY(call_mu);
  std::vector<uint16_t> wire_out ABSL_GUARDED_BY(call_mu);
  std::vector<float> acc ABSL_GUARDED_BY(call_mu);  // fp32 sums of this rank's block
  // RunNarrow: the sums rounded to the wire (the split path does not use it).
  std::vector<uint16_t> wire_block ABSL_GUARDED_BY(call_mu);
  std::vector<int64_t> fp_local ABSL_GUARDED_BY(call_mu);
  std::vector<int64_t> fp_all ABSL_GUARDED_BY(call_mu);
  std::shared_ptr<void> device ABSL_GUARDED_BY(call_mu);  // mixed_device.cc's DeviceMixedState
};

// The wire collective of a mixed op (host and device paths alike): avg reduces a sum on the wire
// (the division happens in fp32, see MixedFactor).
Work IssueWireCollective(Communicator& comm, OpKind kind, const MixedOptions& opts, TensorView in,
                         TensorView out);
// What the cast back multiplies by: scale, divided by the world size for avg; 1 for allgather.
float MixedFactor(OpKind kind, const MixedOptions& opts, int world_size);

// `requested`, or the communicator profile's precision.fp16_overflow for kFromProfile.
OverflowPolicy ResolveOverflowPolicy(OverflowPolicy requested, const Communicator& comm);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_PRECISION_MIXED_INTERNAL_H_

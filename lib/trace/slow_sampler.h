// SlowSampler: the per-op times a fail-slow detector needs, kept for the last few seconds of
// collectives at a rate a low-rate side exchange can carry, with the same ops sampled on every
// rank.
//
// Per sampled collective (seq): how long this rank waited in it (entered to completed), how long
// its data phase took (started to completed), the time since it entered the previous op, and how
// long it had no op in flight before entering it (its work between collectives). These are
// durations on one rank's own clock: comparing them across ranks needs no clock sync.
//
// Which ops are kept must not depend on the rank (the detector matches samples by seq) nor alias
// with a trainer's period (16 bucket allreduces per step would always sample the same bucket with
// seq % 16). Each seq has a level from a hash of the seq alone: level k or more with probability
// 16^-k. Ring k keeps the last kSlots samples of level k or more, so a reader picks the level that
// brings it about as many samples per look as it wants, whatever the op rate.
//
// End() is called once per ended op by the executor's observer (ops end one at a time, in
// order): a hash, then a handful of relaxed stores into a ring slot guarded by a sequence lock; no
// allocation, no lock. Collect() may run on any thread at the same time.
#ifndef ADAPTCOMM_LIB_TRACE_SLOW_SAMPLER_H_
#define ADAPTCOMM_LIB_TRACE_SLOW_SAMPLER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace adaptcomm::trace {

struct SlowSample {
  uint64_t seq = 0;
  int64_t wait_ns = 0;  // entered to completed
  int64_t data_ns = 0;  // started to completed
  int64_t gap_ns = 0;   // entered the previous op to entered this one (0: unknown)
  int64_t idle_ns = 0;  // the previous op completed to entered this one (0 if it was in flight)
};

class SlowSampler {
 public:
  static constexpr int kLevels = 5;      // sampling 1, 1/16, ..., 1/65536 of the ops
  static constexpr size_t kSlots = 256;  // per level

  // The level of `seq`: k with probability 15/16 * 16^-k (the last level takes the rest).
  static int LevelOf(uint64_t seq);

  // An op ended (times in Unix nanoseconds); `keep`: a collective that succeeded, sampled at its
  // level. Every op counts for the next one's gap and idle time.
  void End(uint64_t seq, bool keep, int64_t entered_ns, int64_t started_ns, int64_t ended_ns);
  // The samples of level >= `level` (clamped to 0..kLevels-1) with a seq above `after`, in seq
  // order. Samples being overwritten while read are left out.
  std::vector<SlowSample> Collect(int level, uint64_t after) const;
  // The highest seq recorded (0: none).
  uint64_t last_seq() const { return last_seq_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    std::atomic<uint64_t> seq{0};  // 0 while being written
    std::atomic<int64_t> wait_ns{0};
    std::atomic<int64_t> data_ns{0};
    std::atomic<int64_t> gap_ns{0};
    std::atomic<int64_t> idle_ns{0};
  };
  std::array<std::array<Slot, kSlots>, kLevels> rings_;
  // The next slot of each ring: the only writer is the thread that ends the op.
  std::array<std::atomic<uint64_t>, kLevels> next_{};
  std::atomic<uint64_t> last_seq_{0};
  // The op that ended last: when it was entered and completed (0: none yet).
  std::atomic<int64_t> last_entered_ns_{0};
  std::atomic<int64_t> last_ended_ns_{0};
};

// The finest level at which `ops` new ops yield at most `per_look` samples.
int SamplingLevelFor(uint64_t ops, uint64_t per_look);

// The text a rank publishes: "host <name>\n" then one "seq wait_ns data_ns gap_ns idle_ns"
// line per sample. Decode refuses anything else (a store holding other data under the key).
std::string EncodeSlowSamples(const std::string& host, const std::vector<SlowSample>& samples);
struct DecodedSlowSamples {
  std::string host;
  std::vector<SlowSample> samples;
};
absl::StatusOr<DecodedSlowSamples> DecodeSlowSamples(const std::string& text);

}  // namespace adaptcomm::trace

#endif  // ADAPTCOMM_LIB_TRACE_SLOW_SAMPLER_H_

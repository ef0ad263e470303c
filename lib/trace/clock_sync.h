// Clock offset of each rank against rank 0, estimated through the job's store, so that per-rank
// timelines (written with each host's own clock) can be merged onto one clock.
//
// Protocol (NTP-like, one exchange at a time): rank r writes its send time t1 under
// "<prefix>/req/<r>/<i>"; rank 0, serving ranks in turn, reads it, stamps its own clock t0 and
// answers under "<prefix>/resp/<r>/<i>"; rank r reads the answer at t2. Each round estimates
// offset = (t1 + t2) / 2 - t0, exact when both legs take equally long; of all rounds, the one with
// the smallest round trip (t2 - t1) is kept, since queueing inflates legs unequally. Every key is
// deleted by its reader, so a communicator name can be reused on the same store.
//
// Collective: every rank of the store's scope must call it (rank 0 serves all others in turn, so
// its cost is about world_size x rounds store round trips).
#ifndef ADAPTCOMM_LIB_TRACE_CLOCK_SYNC_H_
#define ADAPTCOMM_LIB_TRACE_CLOCK_SYNC_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"

namespace adaptcomm::trace {

struct ClockSyncOptions {
  int rounds = 8;  // exchanges per rank; the fastest one wins
  std::string key_prefix = "clock_sync";
  std::function<absl::Time()> clock;  // this rank's clock; empty = absl::Now (tests inject skew)
};

struct ClockOffsetEstimate {
  double offset_us = 0;  // this rank's clock minus rank 0's (0 on rank 0)
  double rtt_us = 0;     // round trip of the exchange kept: the estimate's error is below half
};

// DeadlineExceeded (naming the key waited for) when a peer does not take part within `timeout`.
[[nodiscard]] absl::StatusOr<ClockOffsetEstimate> EstimateClockOffset(
    Store& store, int rank, int world, absl::Duration timeout, const ClockSyncOptions& options);

// Microseconds this rank's clock is ahead of rank 0's, with default options.
[[nodiscard]] absl::StatusOr<double> EstimateClockOffset(Store& store, int rank, int world,
                                                         absl::Duration timeout);

}  // namespace adaptcomm::trace

#endif  // ADAPTCOMM_LIB_TRACE_CLOCK_SYNC_H_

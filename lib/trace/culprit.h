// Reads the flight-recorder dumps of a job (DIR/flight.rank<R>.json) and says who is behind:
// ranks grouped by last completed seq, the op each is stuck in, ranks with no dump at all, and a
// one-line verdict ("rank 2 never entered allreduce #1834; all others are waiting in it").
#ifndef ADAPTCOMM_LIB_TRACE_CULPRIT_H_
#define ADAPTCOMM_LIB_TRACE_CULPRIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace adaptcomm::trace {

struct RankPosition {
  int rank = -1;
  uint64_t last_completed_seq = 0;
  uint64_t last_enqueued_seq = 0;
  // The first op after the last completed one, if the rank had queued it.
  uint64_t stuck_seq = 0;   // 0: none queued (the rank is idle or never got there)
  std::string stuck_op;     // "allreduce"
  std::string stuck_state;  // "running", "queued", "failed", "timed_out"
  std::string stuck_error;
  int64_t stuck_start_us = 0;  // when the rank entered that op (0: not started)
  std::string reason;          // why the rank dumped
};

struct CulpritReport {
  int world_size = 0;
  std::vector<RankPosition> ranks;  // ranks that left a dump, by rank
  std::vector<int> missing;         // ranks without a dump
  // Groups of ranks sharing a last completed seq, lowest seq first.
  std::vector<std::pair<uint64_t, std::vector<int>>> groups;
  std::string job;      // the run analysed: the one with the newest dump
  int stale_dumps = 0;  // dumps of other (older) runs in the same directory, ignored
  std::string verdict;
  std::string ToText() const;
  std::string ToJson() const;
};

// NotFound if DIR holds no dump; InvalidArgument naming a file that is not a dump.
absl::StatusOr<CulpritReport> AnalyzeFlightDumps(const std::string& dir);

}  // namespace adaptcomm::trace

#endif  // ADAPTCOMM_LIB_TRACE_CULPRIT_H_

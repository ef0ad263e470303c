// SlownessScorer: names the ranks that hold a job back, from every rank's SlowSamples
// (lib/trace/slow_sampler.h), without clock sync and without a collective.
//
// A compute-slow rank takes longer between collectives: it has no op in flight for longer before
// it enters the next one, while the others wait for it inside that op. Its idle time before op s
// (the previous op completed to it entered s, on its own clock) is that work. Per look (tick),
// over the ops every rank sampled since the last look, with X_r the sum of rank r's idle times
// and X_min the smallest sum over the ranks:
//
//   compute part  = (X_r - X_min) / max(G_r - (X_r - X_min) - D_r, T)
//   comm part     = D_r / (same)
//
// G_r is the sum of its op-to-op times (entered the previous op to entered this one), so the
// denominator is the op-to-op time the others would have had without this rank's extra: a score
// of 0.3 means the job's op-to-op time is 30% longer while they wait for it (a rank whose work
// between collectives takes 30% longer than the fastest rank's, when the collectives themselves
// take little time). D_r sums its data-phase lag: how much later than the others it began moving
// data, beyond how much later it entered (max_q data_q - data_r - (max_q wait_q - wait_r), never
// below 0; ranks leave a collective at about the same time, so these durations compare across
// ranks without clock sync): it entered in time but started late (its queue, its device stream or
// its own previous transfer was behind): comm-slow. T sums the ops' transfers (data phase once
// every rank was in): ops queued back to back are entered microseconds apart, so their op-to-op
// time says nothing of the job's time per op, which is then the transfer.
//
// Sums over many ops, not per-op maxima, so that one op's jitter does not lift every rank, and
// idle times rather than per-op arrival lag, which a pipeline of queued ops would count once per
// op. A rank's score is the median of its tick scores over the window, robust to one long pause;
// it is slow once that median exceeds the threshold with enough ticks in the window, and no
// longer slow once it falls below half the threshold.
//
// Not thread-safe: one detector thread owns it.
#ifndef ADAPTCOMM_LIB_TRACE_SLOWNESS_SCORER_H_
#define ADAPTCOMM_LIB_TRACE_SLOWNESS_SCORER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "lib/trace/slow_sampler.h"

namespace adaptcomm::trace {

struct SlownessScorerOptions {
  int world_size = 1;
  absl::Duration window = absl::Seconds(10);
  double threshold = 0.15;
  // Ticks with matched ops that the window must hold before a rank may be named.
  int min_ticks = 3;
  // Seqs some ranks sampled and others not yet; past it the oldest are dropped.
  size_t max_pending = 1024;
};

struct RankSlowness {
  int rank = 0;
  double score = 0;    // median over the window of compute + comm
  double compute = 0;  // median of the compute part (enters late)
  double comm = 0;     // median of the comm part (starts moving data late)
  bool slow = false;
  bool changed = false;  // named or cleared by this tick
  // Evidence: medians over the window's ticks of the per-op means.
  double work_ms = 0;      // this rank's idle time before an op: its work between collectives
  double min_work_ms = 0;  // the same on the rank with the least
  double data_lag_ms = 0;  // began moving data late beyond entering late
  double interval_ms = 0;  // this rank's op-to-op time
  double transfer_ms = 0;  // the op's data phase once every rank was in
  uint64_t ops = 0;        // ops matched in the window
  int ticks = 0;           // ticks with matched ops in the window
};

class SlownessScorer {
 public:
  explicit SlownessScorer(SlownessScorerOptions options);

  // Samples of `rank` (in seq order); samples at or below the last seq seen from it are
  // duplicates of an earlier look and skipped.
  void Add(int rank, const std::vector<SlowSample>& samples);
  // Closes the tick at `now`: every rank's standing over the window ending at `now`.
  std::vector<RankSlowness> Tick(absl::Time now);
  // Ops matched on every rank so far.
  uint64_t matched() const { return matched_; }
  const SlownessScorerOptions& options() const { return options_; }

 private:
  struct Pending {
    int have = 0;
    std::vector<SlowSample> by_rank;
    std::vector<bool> got;
  };
  struct Sums {
    double idle = 0, data_lag = 0, gap = 0, transfer = 0;
  };
  struct TickScore {
    absl::Time at;
    double compute = 0, comm = 0, work_ns = 0, min_work_ns = 0, data_lag_ns = 0, gap_ns = 0,
           transfer_ns = 0;
    uint64_t ops = 0;
  };
  void Match(const Pending& p);

  const SlownessScorerOptions options_;
  std::map<uint64_t, Pending> pending_;
  std::vector<uint64_t> last_seq_;  // per rank
  std::vector<Sums> sums_;          // this tick's, per rank
  uint64_t tick_ops_ = 0;           // ops matched this tick
  std::vector<std::deque<TickScore>> history_;
  std::vector<bool> slow_;
  uint64_t matched_ = 0;
};

// The evidence in words: "works 26.0 ms between collectives where the fastest rank works 20.1 ms,
// op-to-op time 26.3 ms, starts moving data 0.0 ms late, transfer 0.2 ms (medians over 10s, 412
// ops)".
std::string SlownessEvidence(const RankSlowness& r, absl::Duration window);

}  // namespace adaptcomm::trace

#endif  // ADAPTCOMM_LIB_TRACE_SLOWNESS_SCORER_H_

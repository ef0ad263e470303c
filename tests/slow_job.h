// A training-like job for the fail-slow tests: 4 ranks as threads, each step "works" (sleeps) for
// a base time, longer on the ranks slowed on purpose, then allreduces a 4 KiB gradient whose
// values are checked element by element. Every rank records the fail-slow events its communicator
// reports (CommunicatorOptions::on_slow_rank) with when they came.
#ifndef ADAPTCOMM_TESTS_SLOW_JOB_H_
#define ADAPTCOMM_TESTS_SLOW_JOB_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "adaptcomm/communicator.h"

namespace adaptcomm::testing {

struct SlowJobSpec {
  std::string name;  // the communicator's
  BackendChoice backend = BackendChoice::kGloo;
  int world_size = 4;
  std::vector<double> slowdown;  // per rank: 0.3 works 30% longer per step; missing: 0
  absl::Duration work = absl::Milliseconds(20);
  // The run ends once every rank was told of every slowed rank (unless keep_running), or at this
  // bound.
  absl::Duration bound = absl::Seconds(30);
  bool keep_running = false;
  // The profile's monitor section, as YAML lines below "monitor:" (indented by 4).
  std::string monitor_yaml;
};

struct TimedEvent {
  absl::Duration after;  // since the first step
  SlowRankEvent event;
};

struct SlowJobResult {
  std::vector<std::vector<TimedEvent>> events;  // per rank, in order
  // Per rank: the events in its flight record (DumpFlightRecord's "events") at the end.
  std::vector<std::vector<std::string>> flight_events;
  // Per rank: the slowness of its last state record in the store (what `adaptcomm status`
  // shows), read just before the communicators end.
  std::vector<double> status_slowness;
  absl::Duration ran;
  int steps = 0;
  bool values_ok = true;  // every allreduce completed with the right sum
};

SlowJobResult RunSlowJob(const SlowJobSpec& spec);

// The slowed ranks of `spec` (slowdown > 0).
std::vector<int> SlowedRanks(const SlowJobSpec& spec);
// When every rank had heard that each of `ranks` is slow; absl::InfiniteDuration() if some rank
// never did.
absl::Duration TimeAllTold(const SlowJobResult& result, const std::vector<int>& ranks);
// Ranks named slow on some rank that are not in `ranks`.
std::vector<int> WronglyNamed(const SlowJobResult& result, const std::vector<int>& ranks);

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_SLOW_JOB_H_

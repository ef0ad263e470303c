// SlownessMonitor: online fail-slow detection for one communicator, beside its ops, never in
// their way (docs/monitoring.md, "Fail-slow detection").
//
// Every rank's monitor thread looks every monitor.interval: it publishes the per-op samples its
// metrics kept since its last looks (lib/trace/slow_sampler.h; at most about 64 per look, a few
// KiB) under its own store key. The rank 0 of the moment is the detector: it reads every rank's
// samples, scores them (lib/trace/slowness_scorer.h) and publishes a verdict, which the other
// ranks read at their next look. On every rank, the verdict sets the rank's own
// adaptcomm_slowness_score and, for each rank named slow or no longer slow, adds a flight-record
// event and calls CommunicatorOptions::on_slow_rank; the detector also logs one line. No
// collective and nothing on the op path: store traffic per look is one write per rank, plus one
// read per rank on the detector and one read of the verdict on the others.
//
// Store keys, in the communicator's own scope of the job's store (a new one for each communicator
// created under the same name, so a stale run's keys are never read):
//   monitor/samples<R>   rank R's recent samples (EncodeSlowSamples)
//   monitor/verdict      {"serial","world","threshold","window_ms","ranks":[{"rank","host",
//                        "score","compute","comm","slow","evidence"}]}
#ifndef ADAPTCOMM_LIB_CORE_COMMUNICATOR_SLOWNESS_MONITOR_H_
#define ADAPTCOMM_LIB_CORE_COMMUNICATOR_SLOWNESS_MONITOR_H_

#include <functional>
#include <memory>
#include <string>

#include "adaptcomm/communicator.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "lib/core/communicator/periodic_thread.h"
#include "lib/core/executor/op_executor.h"
#include "lib/trace/flight_recorder.h"
#include "lib/trace/metrics.h"

namespace adaptcomm::internal {

std::string MonitorKey(const std::string& leaf);

struct SlownessMonitorOptions {
  std::string comm;
  MonitorSettings settings;
  std::shared_ptr<trace::CommMetrics> metrics;      // with a slow_sampler(); required
  std::shared_ptr<trace::FlightRecorder> recorder;  // required
  // The current rank and world (a membership change renumbers them); must not block.
  std::function<OpExecutor::MembershipSnapshot()> membership;
  std::function<void(const SlowRankEvent&)> on_slow_rank;  // may be empty
};

class SlownessMonitor {
 public:
  // Starts the monitor thread. `store`: the communicator's scope of the job's store.
  SlownessMonitor(std::shared_ptr<Store> store, SlownessMonitorOptions options);
  // Stops the thread: no callback starts once this began; returns within about a second whatever
  // the store or a callback in progress does (such a thread is left to finish on its own).
  ~SlownessMonitor();
  SlownessMonitor(const SlownessMonitor&) = delete;
  SlownessMonitor& operator=(const SlownessMonitor&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::unique_ptr<PeriodicThread> thread_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_COMMUNICATOR_SLOWNESS_MONITOR_H_

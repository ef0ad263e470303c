// What a communicator shows of itself while it runs: its metrics export (lib/trace/metrics.h,
// metrics_export.h) and the state record it publishes to the job's store for `adaptcomm status`.
//
// The state record: each rank's publisher thread looks every status.interval and writes the
// record when it changed, else only a small "alive" stamp, so that `adaptcomm status` answers
// without any collective and while the job hangs, and names a rank whose stamp stopped moving
// (stopped, hung, dead). Store keys, in the job's root store:
//   adaptcomm/status/<comm>/world        the world size (rank 0, at start and after a change)
//   adaptcomm/status/<comm>/rank<R>      the record, JSON (StatusRecordJson)
//   adaptcomm/status/<comm>/alive<R>     Unix milliseconds of the last look
#ifndef ADAPTCOMM_LIB_CORE_COMMUNICATOR_OBSERVABILITY_H_
#define ADAPTCOMM_LIB_CORE_COMMUNICATOR_OBSERVABILITY_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "lib/core/communicator/periodic_thread.h"
#include "lib/core/executor/op_executor.h"
#include "lib/trace/flight_recorder.h"
#include "lib/trace/metrics.h"
#include "lib/trace/metrics_export.h"

namespace adaptcomm::internal {

// Starts the metrics endpoint and textfile that `metrics` asks for (null when none): the port is
// the profile's base plus the launcher's local rank (else the rank).
std::unique_ptr<trace::MetricsExportHandle> StartMetricsExportFor(const MetricsSettings& metrics,
                                                                  int rank, int world_size);

// This host's name, as the state records and the fail-slow monitor show it.
const std::string& ThisHost();

// The store keys of the state records of communicator `comm`.
std::string StatusKey(const std::string& comm, const std::string& leaf);

// What a publisher reads each time it looks; each source must not block.
struct StatusSources {
  std::string comm;
  std::shared_ptr<trace::FlightRecorder> recorder;  // progress; required
  std::shared_ptr<trace::CommMetrics> metrics;      // slowness; null when metrics are off
  std::function<int()> rank;                        // current rank (membership changes it)
  std::function<int()> world_size;
  std::function<absl::Status()> health;
};

// The record as JSON: {"rank","world","pid","host","t_ms","interval_ms","health","last_enqueued",
// "last_started","last_completed","op":{"kind","seq","bytes","entered_ms","started_ms"}|null,
// "slowness","metrics_port"}; times are Unix milliseconds (0: not yet).
std::string StatusRecordJson(const StatusSources& sources, absl::Duration interval,
                             const std::string& health_override = "");

// The coordinated-retry handler the executor sees when metrics are on: counts each retry round by
// its cause on this rank (a timeout, a lost peer), then lets `inner` run it.
class CountingRecoveryHandler final : public RecoveryHandler {
 public:
  CountingRecoveryHandler(std::shared_ptr<RecoveryHandler> inner,
                          std::shared_ptr<trace::CommMetrics> metrics)
      : inner_(std::move(inner)), metrics_(std::move(metrics)) {}
  absl::StatusOr<RecoveryPlan> Recover(int generation, uint64_t position, uint64_t issued_through,
                                       const std::string& fingerprint, int attempt,
                                       const absl::Status& cause) override {
    metrics_->AddRetry(cause.code());
    return inner_->Recover(generation, position, issued_through, fingerprint, attempt, cause);
  }
  int max_attempts() const override { return inner_->max_attempts(); }
  bool Retryable(const absl::Status& status) const override { return inner_->Retryable(status); }

 private:
  const std::shared_ptr<RecoveryHandler> inner_;
  const std::shared_ptr<trace::CommMetrics> metrics_;
};

class StatusPublisher {
 public:
  // Starts the publisher thread. `store`: the job's root store.
  StatusPublisher(std::shared_ptr<Store> store, StatusSources sources, absl::Duration interval);
  // Destruction writes a last record ("left") and stops the thread; it returns within about a
  // second whatever the store does (a thread stuck in the store is left to finish on its own).

 private:
  std::unique_ptr<PeriodicThread> thread_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_COMMUNICATOR_OBSERVABILITY_H_

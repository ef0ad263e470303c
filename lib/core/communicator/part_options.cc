#include "lib/core/communicator/part_options.h"

#include <algorithm>
#include <string>

#include "lib/base/log.h"
#include "lib/config/nccl_plan.h"

namespace adaptcomm::internal {

PartOptions PartOptionsFor(const EffectiveConfig& config) {
  PartOptions p;
  p.elastic = ElasticPolicyOf(config.elastic);

  selection::SelectionDeps& deps = p.selection;
  deps.intra_host_shm = config.backend.intra_host_shm;
  deps.hierarchical = config.backend.hierarchical;
  deps.gloo_algorithm = config.gloo.algorithm;
  deps.gloo_max_segment_bytes = config.gloo.max_segment_bytes;
  deps.gloo_max_connections = config.gloo.max_connections;
  // Device timing feeds only the metrics (and the fail-slow detector, which reads them).
  deps.device_timing_every = config.metrics.enabled ? config.metrics.device_timing_every : 0;
  deps.tuned_table = config.tuning.loaded;
  deps.elastic = p.elastic.elastic;
  deps.configure_nccl = [&config](int version) {
    // Read-once variables must be in the environment before the first NCCL init.
    config::NcclEnvReport env = config::ApplyNcclEnvironment(config, version);
    for (const std::string& c : env.conflicts) ADAPTCOMM_LOG(kWarning, "nccl env: ", c);
    return config::PlanNccl(config, version).config;
  };

  trace::FlightRecorderOptions& fr = p.recorder;
  fr.capacity = static_cast<size_t>(config.flight_recorder.entries);
  fr.dump_dir = config.flight_recorder.dump_dir.empty() ? trace::DefaultFlightRecorderDir()
                                                        : config.flight_recorder.dump_dir;

  ExecutorOptions& exec = p.executor;
  exec.abort_bound = config.timeouts.abort;
  exec.in_flight_with_retries = static_cast<size_t>(config.retry.in_flight);
  exec.retry_record_bytes = config.retry.record_bytes;
  // retry.replay auto copies nothing, except under elastic membership: a shrink re-runs the op it
  // interrupted on the survivors (inside a step no op is recorded either way).
  exec.copy_inputs = config.retry.replay == ReplayMode::kCopy || p.elastic.elastic;

  FailureCoordinatorOptions& fc = p.coordinator;
  fc.report_window = config.retry.report_window;
  // Already at least 2 under elastic membership, whose changes the retry's vote agrees.
  fc.max_attempts = config.retry.max_attempts;
  fc.initial_backoff = config.retry.initial_backoff;
  fc.backoff_multiplier = config.retry.multiplier;
  fc.max_backoff = config.retry.max_backoff;
  fc.jitter = config.retry.jitter;
  fc.retryable = config.retry.retryable;
  fc.elastic = p.elastic;
  // A stalled rank gets its own op timeout to notice and vote, plus the report window.
  fc.vote_timeout = config.timeouts.collective + config.retry.report_window;
  fc.stop_bound = std::min(config.timeouts.abort, absl::Seconds(2));
  return p;
}

}  // namespace adaptcomm::internal

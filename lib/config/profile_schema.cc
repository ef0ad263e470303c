#include "lib/config/profile_schema.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "adaptcomm/store.h"
#include "lib/config/units.h"

namespace adaptcomm::config {

namespace {

// The schema, one function per group of sections. The order of the keys is the order
// Explain() lists them in and the cross-rank configuration hash reads them in: keep it.

// Timeouts and their scaling with the world size.
std::vector<KeySpec> TimeoutKeys() {
  return {
      {"timeouts.store_connect", Kind::kDuration, 0, 0, {}, "60s", "store client connect bound"},
      {"timeouts.init",
       Kind::kDuration,
       0,
       0,
       {},
       "300s",
       "creation bound (store, rendezvous, backend init)"},
      {"timeouts.collective",
       Kind::kDuration,
       0,
       0,
       {},
       "600s",
       "per-operation watchdog bound (NCCL has no timeout of its own)"},
      {"timeouts.heartbeat",
       Kind::kDuration,
       0,
       0,
       {},
       "900s",
       "watchdog liveness bound: past it the process aborts"},
      {"timeouts.abort", Kind::kDuration, 0, 0, {}, "30s", "bound of an abort before a hard exit"},
      {"timeouts.long_operation",
       Kind::kDuration,
       0,
       0,
       {},
       "7200s",
       "bound inside a long-operation scope (checkpoint save)"},
      {"world_scaling.reference_world",
       Kind::kInt,
       1,
       1 << 24,
       {},
       "8",
       "timeout scaling: worlds up to this size are not scaled"},
      {"world_scaling.per_doubling",
       Kind::kDouble,
       0,
       10,
       {},
       "0.25",
       "timeout scaling: added factor per doubling of the world"},
      {"world_scaling.max_factor", Kind::kDouble, 1, 100, {}, "3", "timeout scaling: cap"},
  };
}

// Retry: which failures are retried, how often, and what a retry replays.
std::vector<KeySpec> RetryKeys() {
  return {
      {"retry.max_attempts",
       Kind::kInt,
       1,
       100,
       {},
       "3",
       "retry: attempts incl. the first (abort + re-init, agreed by all ranks)"},
      {"retry.replay",
       Kind::kEnum,
       0,
       0,
       {"auto", "copy"},
       "auto",
       "retry: how an op is re-run (auto: only ops whose input survives, no copies; inside a "
       "step the step is redone; copy: every op's input copied first)"},
      {"retry.in_flight",
       Kind::kInt,
       1,
       256,
       {},
       "8",
       "retry: device ops in flight at once (records: 2 x this x the largest input, in device "
       "memory)"},
      {"retry.record_bytes",
       Kind::kBytes,
       0,
       0,
       {},
       "1GiB",
       "retry: device memory for device ops' records; an op past it runs without retry"},
      {"retry.initial_backoff", Kind::kDuration, 0, 0, {}, "1s", "retry: first backoff"},
      {"retry.multiplier", Kind::kDouble, 1, 10, {}, "2", "retry: backoff growth per attempt"},
      {"retry.max_backoff", Kind::kDuration, 0, 0, {}, "30s", "retry: backoff cap"},
      {"retry.jitter", Kind::kDouble, 0, 1, {}, "0.2", "retry: backoff x uniform[1-j, 1+j]"},
      {"retry.retryable",
       Kind::kCodeList,
       0,
       0,
       {},
       "unavailable,aborted",
       "retry: status codes classified transient"},
      {"retry.report_window",
       Kind::kDuration,
       0,
       0,
       {},
       "5s",
       "after a failure, wait this long for every rank's report before naming the silent ones"},
  };
}

// Backend selection and the Gloo backend.
std::vector<KeySpec> BackendKeys() {
  return {
      {"backend.choice",
       Kind::kEnum,
       0,
       0,
       {"auto", "nccl", "gloo", "shm"},
       "auto",
       "backend selection (auto: NCCL for CUDA tensors; else shm on one host, hierarchical "
       "across hosts with several ranks each, else Gloo)"},
      {"backend.fallback",
       Kind::kEnum,
       0,
       0,
       {"allow", "deny"},
       "allow",
       "NCCL -> Gloo fallback when NCCL is unavailable or unstable"},
      {"backend.degrade_after_failures",
       Kind::kInt,
       1,
       1000,
       {},
       "3",
       "degrade to Gloo after this many NCCL failures..."},
      {"backend.degrade_window", Kind::kDuration, 0, 0, {}, "600s", "...within this window"},
      {"backend.intra_host",
       Kind::kEnum,
       0,
       0,
       {"shm", "gloo"},
       "shm",
       "auto selection, ranks on one host (alone or inside hierarchical): shm or Gloo on loopback"},
      {"backend.hierarchical",
       Kind::kEnum,
       0,
       0,
       {"auto", "off"},
       "auto",
       "several hosts with several ranks each: hierarchical (auto) or flat Gloo (off)"},
      {"gloo.algorithm",
       Kind::kEnum,
       0,
       0,
       {"auto", "ring", "bcube", "recursive_doubling"},
       "auto",
       "allreduce algorithm; auto: bcube (or recursive doubling where bcube's groups are wide) "
       "where ring's steps are latency-bound"},
      {"gloo.timeout",
       Kind::kDuration,
       0,
       0,
       {},
       "collective",
       "Gloo context and per-op setTimeout"},
      {"gloo.max_segment_bytes",
       Kind::kBytes,
       0,
       0,
       {},
       "0",
       "Gloo setMaxSegmentSize (0: Gloo's default)"},
      {"gloo.max_connections",
       Kind::kInt,
       2,
       1 << 20,
       {},
       "1024",
       "Gloo pairs a rank opens at most, each when an op first needs it (alltoall: world - 1)"},
  };
}

// The flight recorder, trace, metrics, status record and monitor.
std::vector<KeySpec> ObservabilityKeys() {
  return {
      {"flight_recorder.entries",
       Kind::kInt,
       0,
       1 << 20,
       {},
       "2000",
       "last N collectives per rank, dumped on timeout"},
      {"flight_recorder.dump_dir",
       Kind::kString,
       0,
       0,
       {},
       "/tmp/adaptcomm",
       "where flight-recorder dumps go"},
      {"trace.enabled", Kind::kBool, 0, 0, {}, "false", "collective timeline trace"},
      {"trace.dir", Kind::kString, 0, 0, {}, "", "where timeline traces go (empty: cwd)"},
      {"metrics.enabled",
       Kind::kBool,
       0,
       0,
       {},
       "true",
       "per-op counts, bytes and time histograms per collective, size band and backend"},
      {"metrics.port",
       Kind::kInt,
       -1,
       65535,
       {},
       "-1",
       "HTTP /metrics: -1 off, 0 any free port, else base + local rank (ADAPTCOMM_METRICS_PORT "
       "wins)"},
      {"metrics.address", Kind::kString, 0, 0, {}, "0.0.0.0", "address /metrics listens on"},
      {"metrics.textfile",
       Kind::kString,
       0,
       0,
       {},
       "",
       "node-exporter textfile, {rank}: the rank (ADAPTCOMM_METRICS_TEXTFILE wins); empty: none"},
      {"metrics.textfile_interval",
       Kind::kDuration,
       0,
       0,
       {},
       "15s",
       "how often the textfile is rewritten (1s to 1h)"},
      {"metrics.device_timing_every",
       Kind::kInt,
       0,
       65536,
       {},
       "16",
       "NCCL device ops timed on the GPU with CUDA events: one in N, the same on every rank; 0 "
       "off"},
      {"metrics.max_scrapes_per_second",
       Kind::kInt,
       1,
       10000,
       {},
       "10",
       "requests to /metrics accepted per second; more wait or are dropped"},
      {"status.enabled",
       Kind::kBool,
       0,
       0,
       {},
       "true",
       "publish this rank's state to the store for `adaptcomm status`"},
      {"status.interval",
       Kind::kDuration,
       0,
       0,
       {},
       "1s",
       "how often the state record is refreshed (100ms to 10s); stale past 1.5 intervals"},
      {"monitor.enabled",
       Kind::kBool,
       0,
       0,
       {},
       "true",
       "online fail-slow detection: per-op samples through the store, scored on the lowest rank"},
      {"monitor.interval",
       Kind::kDuration,
       0,
       0,
       {},
       "1s",
       "how often each rank publishes its samples and the detector scores (100ms to 10s)"},
      {"monitor.window",
       Kind::kDuration,
       0,
       0,
       {},
       "10s",
       "a rank is named once its median score over this window passes the threshold (3 "
       "intervals to 10min)"},
      {"monitor.slow_threshold",
       Kind::kDouble,
       0.01,
       10,
       {},
       "0.15",
       "slowness score that names a rank: the others' op-to-op time grows by this fraction "
       "waiting for it"},
  };
}

// Mixed precision and gradient buckets.
std::vector<KeySpec> PrecisionKeys() {
  return {
      {"precision.fp16_overflow",
       Kind::kEnum,
       0,
       0,
       {"report", "fail", "resend_bf16", "resend_f32"},
       "report",
       "mixed-precision fp16 wire overflow: report, fail the op, or resend it in bf16/fp32"},
      {"buckets.bytes",
       Kind::kBytes,
       4096,
       double(uint64_t{1} << 40),
       {},
       "25MiB",
       "gradient bucketer: bytes of gradients fused into one allreduce (adaptcomm/bucketer.h)"},
  };
}

// Elastic membership: what a rank loss does.
std::vector<KeySpec> ElasticKeys() {
  return {
      {"elastic.on_loss",
       Kind::kEnum,
       0,
       0,
       {"fail", "shrink", "wait_for_replacement"},
       "fail",
       "a rank lost for good: fail every rank, continue without it, or wait for it first"},
      {"elastic.min_world_size",
       Kind::kInt,
       1,
       1 << 24,
       {},
       "1",
       "elastic: never shrink below this many ranks (fail instead)"},
      {"elastic.loss_window",
       Kind::kDuration,
       0,
       0,
       {},
       "5s",
       "elastic: a rank that has not voted this long into a coordinated retry is lost"},
      {"elastic.replacement_timeout",
       Kind::kDuration,
       0,
       0,
       {},
       "60s",
       "elastic wait_for_replacement: how long past the loss window to wait"},
      {"elastic.after_timeout",
       Kind::kEnum,
       0,
       0,
       {"shrink", "fail"},
       "shrink",
       "elastic wait_for_replacement: what to do once the wait ran out"},
  };
}

// The tuned table and the online tuner.
std::vector<KeySpec> TuningKeys() {
  return {
      {"tuning.table",
       Kind::kString,
       0,
       0,
       {},
       "",
       "tuned table from adaptcomm tune (ADAPTCOMM_TUNED_TABLE wins), per size band on the "
       "topology it was measured on"},
      // Online tuning (issue #15 item 3, lib/core/tuning/online_tuner.h): `tuning: {online:
      // {...}}`.
      {"tuning.online.enabled",
       Kind::kBool,
       0,
       0,
       {},
       "false",
       "online tuning: try each candidate knob value on the first ops of each op and size band, "
       "keep the winner agreed by all ranks (ADAPTCOMM_ONLINE_TUNING wins)"},
      {"tuning.online.trials_per_candidate",
       Kind::kInt,
       1,
       100,
       {},
       "5",
       "online tuning: ops timed per candidate and band (its median is what counts)"},
      {"tuning.online.ops",
       Kind::kNameList,
       0,
       0,
       {"allreduce", "reduce"},
       "allreduce",
       "online tuning: the ops tuned (those with knobs: shm allreduce and reduce, Gloo allreduce)"},
      {"tuning.online.allow_reorder",
       Kind::kBool,
       0,
       0,
       {},
       "false",
       "online tuning: also try values that change the float reduction order (Gloo, > 2 ranks)"},
      {"tuning.online.threshold_pct",
       Kind::kDouble,
       0,
       100,
       {},
       "3",
       "online tuning: a candidate replaces the static values only when faster by more than this"},
      {"tuning.online.decision_timeout",
       Kind::kDuration,
       0,
       0,
       {},
       "30s",
       "online tuning: bound of a band's agreement; past it the static values stay (logged)"},
  };
}

// The store, the collective checks and diagnose.
std::vector<KeySpec> StoreAndDebugKeys() {
  return {
      {"store.url",
       Kind::kString,
       0,
       0,
       {},
       "",
       "the job's store: redis://[user:password@]host:port or etcd://...; empty: rank 0 serves a "
       "TCP store (ADAPTCOMM_STORE wins; docs/stores.md)"},
      {"debug.check_collectives",
       Kind::kBool,
       0,
       0,
       {},
       "false",
       "every rank checks through the store that all ranks call the same op (a store round trip "
       "per op)"},
      {"diagnose.min_busbw_gbps",
       Kind::kDouble,
       0,
       1e6,
       {},
       "0.1",
       "diagnose --ranks: warn below this allreduce bus bandwidth (GB/s)"},
  };
}

}  // namespace

const std::vector<KeySpec>& Schema() {
  static const auto* schema = [] {
    auto* keys = new std::vector<KeySpec>;
    for (auto* group : {TimeoutKeys, RetryKeys, BackendKeys, ObservabilityKeys, PrecisionKeys,
                        ElasticKeys, TuningKeys, StoreAndDebugKeys}) {
      std::vector<KeySpec> part = group();
      keys->insert(keys->end(), part.begin(), part.end());
    }
    return keys;
  }();
  return *schema;
}

const KeySpec* FindKey(const std::string& key) {
  for (const KeySpec& spec : Schema()) {
    if (key == spec.key) return &spec;
  }
  return nullptr;
}

const std::vector<std::string>& SectionNames() {
  static const auto* names = new std::vector<std::string>{
      "timeouts", "world_scaling", "retry",     "backend", "gloo",    "flight_recorder",
      "trace",    "diagnose",      "precision", "buckets", "elastic", "tuning",
      "store",    "metrics",       "status",    "monitor", "debug"};
  return *names;
}

namespace {
const std::vector<std::string>& CodeNames() {
  static const auto* names =
      new std::vector<std::string>{"cancelled",   "unknown",  "deadline_exceeded",  "aborted",
                                   "unavailable", "internal", "resource_exhausted", "data_loss"};
  return *names;
}
}  // namespace

namespace {
// The canonical text, or why `text` is not a valid value (without the key: the caller names it).
absl::StatusOr<std::string> CanonicalText(const KeySpec& spec, const std::string& text) {
  switch (spec.kind) {
    case Kind::kDuration: {
      // gloo.timeout may follow the collective timeout.
      if (text == "collective" && std::string(spec.key) == "gloo.timeout") return text;
      auto d = ParseDuration(text);
      if (!d.ok()) return d.status();
      if (*d <= absl::ZeroDuration()) {
        return absl::InvalidArgumentError("must be positive");
      }
      return DurationText(*d);
    }
    case Kind::kInt: {
      auto v = ParseInt(text);
      if (!v.ok()) return v.status();
      if (*v < spec.min || *v > spec.max) {
        return absl::OutOfRangeError(absl::StrCat(*v, " is outside ",
                                                  static_cast<int64_t>(spec.min), "..",
                                                  static_cast<int64_t>(spec.max)));
      }
      return absl::StrCat(*v);
    }
    case Kind::kDouble: {
      auto v = ParseDouble(text);
      if (!v.ok()) return v.status();
      if (*v < spec.min || *v > spec.max) {
        return absl::OutOfRangeError(absl::StrCat(*v, " is outside ", spec.min, "..", spec.max));
      }
      return absl::StrCat(*v);
    }
    case Kind::kBool: {
      auto v = ParseBool(text);
      if (!v.ok()) return v.status();
      return std::string(*v ? "true" : "false");
    }
    case Kind::kEnum:
      if (std::find(spec.choices.begin(), spec.choices.end(), text) == spec.choices.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("must be one of ", absl::StrJoin(spec.choices, ", ")));
      }
      return text;
    case Kind::kString:
      if (std::string(spec.key) == "store.url" && !text.empty()) {
        absl::StatusOr<StoreUrl> url = ParseStoreUrl(text);
        if (!url.ok()) return url.status();
      }
      return text;
    case Kind::kBytes: {
      auto v = ParseByteSize(text);
      if (!v.ok()) return v.status();
      // A range of 0..0 means any size (gloo.max_segment_bytes: 0 is "Gloo's default").
      if (spec.max > 0 &&
          (static_cast<double>(*v) < spec.min || static_cast<double>(*v) > spec.max)) {
        return absl::OutOfRangeError(absl::StrCat(*v, " is outside ",
                                                  static_cast<uint64_t>(spec.min), "..",
                                                  static_cast<uint64_t>(spec.max)));
      }
      return absl::StrCat(*v);
    }
    case Kind::kNameList: {
      std::vector<std::string> out;
      for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
        std::string name(absl::StripAsciiWhitespace(part));
        if (std::find(spec.choices.begin(), spec.choices.end(), name) == spec.choices.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("'", name, "' is not one of ", absl::StrJoin(spec.choices, ", ")));
        }
        if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
      }
      if (out.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("names none of ", absl::StrJoin(spec.choices, ", ")));
      }
      return absl::StrJoin(out, ",");
    }
    case Kind::kCodeList: {
      std::vector<std::string> out;
      for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
        std::string name(absl::StripAsciiWhitespace(part));
        if (std::find(CodeNames().begin(), CodeNames().end(), name) == CodeNames().end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("'", name, "' is not one of ", absl::StrJoin(CodeNames(), ", ")));
        }
        if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
      }
      return absl::StrJoin(out, ",");
    }
  }
  return text;
}
}  // namespace

absl::StatusOr<std::string> CanonicalValue(const KeySpec& spec, const std::string& text) {
  absl::StatusOr<std::string> v = CanonicalText(spec, text);
  if (v.ok()) return v;
  return absl::Status(v.status().code(), absl::StrCat(spec.key, ": ", v.status().message()));
}

}  // namespace adaptcomm::config

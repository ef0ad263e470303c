// Size-tiered profiles: a trainer says "a 70B model on 64 ranks" and gets every setting adaptcomm
// and NCCL/Gloo should use, each with the place it came from.
//
//   adaptcomm::ProfileRequest req;
//   req.model_size = "70B";
//   req.world_size = 64;
//   absl::StatusOr<adaptcomm::EffectiveConfig> cfg = adaptcomm::ResolveProfile(req);
//   if (!cfg.ok()) return Fail(cfg.status());    // file:line:column for a broken profile
//   std::puts(cfg->Explain().c_str());
//
// Precedence, highest first: an explicit API value (ProfileRequest::overrides, the fields of
// CommunicatorOptions) > a variable the user exported (ADAPTCOMM_* for adaptcomm's settings,
// NCCL_* for NCCL's; an NCCL_* one is never overwritten unless the profile marks it `force`) >
// the selected tier > the profile's `defaults`/`infrastructure` blocks > built-in defaults. Every
// source is merged in one place into the EffectiveConfig, which the communicator runs on and
// Explain() prints; a value that beat another source's names it (SettingRecord::overridden).
// Unset, in every options struct, is an empty std::optional.
//
// Tier selection: tiers in the file are ordered by parameter count. A size inside a tier's range
// selects it; a size between two tiers (the article leaves 7B-30B uncovered) selects the NEXT
// LARGER tier - more generous timeouts and channels are the safe side - and says so in a log line
// and in Explain(). A size above every tier selects the largest one.
//
// World-size scaling of the collective (and heartbeat) timeout, monotone non-decreasing in world:
//   factor(world) = 1                                                   for world <= R
//   factor(world) = min(max_factor, 1 + per_doubling * log2(world / R)) for world >  R
// with R = world_scaling.reference_world (8), per_doubling 0.25, max_factor 3 by default; the
// result is rounded to whole seconds. An explicit API collective timeout is used as given.
//
// Timeouts must be ordered store_connect < collective < heartbeat (checked after scaling), and
// init >= store_connect; a profile that inverts them is refused with both values named.
//
// Compiles as C++17: trainers include it. No NCCL header is needed: the NCCL settings are listed
// in EffectiveConfig::settings and applied by the library itself.
#ifndef ADAPTCOMM_PROFILE_H_
#define ADAPTCOMM_PROFILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/export.h"

namespace adaptcomm {

class Store;
namespace config {
struct TunedTable;   // internal, reached only through TuningSettings
struct NcclSetting;  // internal, reached only through EffectiveConfig::nccl
}  // namespace config

// kShm: the shared-memory backend, for ranks that all run on one host (auto picks it there when
// NCCL is not usable).
enum class BackendChoice : uint8_t { kAuto, kGloo, kNccl, kShm };
ADAPTCOMM_EXPORT const char* BackendChoiceName(BackendChoice choice);
// What creation does when NCCL (auto or nccl) is not usable on every rank: build Gloo on every
// rank (device buffers staged through host memory), or fail on every rank naming the reason.
enum class Fallback : uint8_t { kAllow, kDeny };
// How a coordinated retry gets an op's input back to re-run it bit for bit (profile retry.replay;
// docs/resilience.md has the cost of each).
//   kAuto: only where it is free: an op that does not overwrite its input and whose caller
//          promised to leave it alone (stable_input), and ops without data (barrier). Every other
//          op outside a step fails instead of being re-run; inside a step (BeginStep/CommitStep)
//          no op is re-run: the step is redone. No copy of any input, on any path.
//   kCopy: every op's input is copied before it runs (a memcpy on the host; a device-to-device
//          copy on the GPU), so any op can be re-run alone, outside a step too.
enum class ReplayMode : uint8_t { kAuto, kCopy };
ADAPTCOMM_EXPORT const char* ReplayModeName(ReplayMode mode);
// What a communicator does when a rank is lost for good (profile elastic.on_loss; docs/elastic.md):
// it did not vote in a coordinated retry within the loss window (dead, stopped, or cut off).
enum class LossPolicy : uint8_t {
  kFail,    // every rank's op fails naming the lost ranks
  kShrink,  // the survivors continue: renumbered densely in their old order, backend rebuilt
  // Waits up to the replacement timeout for the lost ranks to vote after all (a stopped rank that
  // resumes), then does `after_timeout` (shrink or fail). A new process that replaces a lost rank
  // is admitted at a step boundary instead (ElasticOptions::join, Communicator::AdmitJoiners).
  kWaitForReplacement,
};
ADAPTCOMM_EXPORT const char* LossPolicyName(LossPolicy policy);  // "fail", "shrink", ...

// Values a trainer sets in code; each one set wins over the environment and the profile.
struct ProfileOverrides {
  std::optional<absl::Duration> store_connect_timeout;
  std::optional<absl::Duration> init_timeout;
  std::optional<absl::Duration> collective_timeout;  // used as given: not scaled by world size
  std::optional<absl::Duration> heartbeat_timeout;
  std::optional<absl::Duration> abort_timeout;
  std::optional<absl::Duration> long_operation_timeout;
  std::optional<BackendChoice> backend;
  std::optional<bool> allow_fallback;
  std::optional<int> max_retry_attempts;
  std::optional<ReplayMode> replay;
  std::optional<absl::Duration> failure_report_window;  // retry.report_window
  std::optional<std::string> store_url;                 // store.url; "": rank 0's TCP store
  std::optional<int> flight_recorder_entries;
  std::optional<std::string> flight_recorder_dir;
  std::optional<bool> check_collectives;  // debug.check_collectives
  std::optional<LossPolicy> on_loss;      // elastic.*
  std::optional<int> min_world_size;
  std::optional<absl::Duration> loss_window;
  std::optional<absl::Duration> replacement_timeout;
  std::optional<LossPolicy> after_timeout;   // kShrink or kFail
  std::optional<uint64_t> nccl_buffer_size;  // bytes (NCCL_BUFFSIZE)
  std::optional<int> nccl_min_ctas;          // channels (ncclConfig_t.minCTAs / NCCL_MIN_CTAS)
  std::optional<int> nccl_max_ctas;
  // Any other NCCL_* variable by name (checked against the parameter registry like the profile).
  std::map<std::string, std::string> nccl_env;
};

struct ProfileRequest {
  // "7B", "235B", "1.5T", "7000000000", or a tier name. Unset: ADAPTCOMM_MODEL_SIZE, else the
  // smallest tier. Set: not empty (InvalidArgument otherwise).
  std::optional<std::string> model_size;
  int world_size = 1;
  // Profile file. Set: not empty (InvalidArgument otherwise). Unset: ADAPTCOMM_PROFILE, else
  // profiles.yaml in the configuration directory
  // (DefaultConfigDir(): ADAPTCOMM_CONFIG_DIR, else share/adaptcomm/configs of the prefix the
  // loaded libadaptcomm.so is installed in, wherever it was moved; the source tree's configs/
  // only for the build tree's own library).
  std::optional<std::string> file;
  // Refuse profiles naming variables NCCL never reads or does not know. Also
  // ADAPTCOMM_PROFILE_STRICT=1.
  bool strict = false;
  ProfileOverrides overrides;
};

struct TimeoutConfig {
  absl::Duration store_connect;    // a store client's connect bound
  absl::Duration init;             // creation: rendezvous + backend init
  absl::Duration collective_base;  // before world-size scaling
  absl::Duration collective;       // per-operation bound, scaled by world size
  double world_factor = 1.0;       // collective / collective_base (1 if set by the API)
  absl::Duration heartbeat;        // watchdog silent this long: the process aborts (scaled too)
  absl::Duration abort;            // how long an abort may take before a hard exit
  absl::Duration long_operation;   // bound inside a long-operation scope (checkpoint save)
};

struct RetryPolicy {
  // Including the first. The effective value is what runs: 1 where no coordinated retry can
  // happen (a communicator without a store), at least 2 under elastic membership (a membership
  // change is agreed by the retry's vote).
  int max_attempts = 3;
  ReplayMode replay = ReplayMode::kAuto;
  // After a failure, how long a rank waits for every other rank to report before naming the
  // silent ones as dead or stalled.
  absl::Duration report_window = absl::Seconds(5);
  // Stream-ordered device ops in flight at once while retries are on (more wait in the queue):
  // each keeps a copy of its input, as do as many completed ones before them, so the records take
  // 2 x in_flight x the largest device op's input of device memory.
  int in_flight = 8;
  // Device memory the records of device ops may hold (records of every rank's window, above): an
  // op whose record would take them past it runs without coordinated retry (logged once, with
  // the retry.in_flight at which ops of its size fit).
  uint64_t record_bytes = uint64_t{1} << 30;
  absl::Duration initial_backoff;
  double multiplier = 2.0;
  absl::Duration max_backoff;
  double jitter = 0.2;  // each backoff is multiplied by a uniform factor in [1-jitter, 1+jitter]
  std::vector<absl::StatusCode> retryable;
};

struct BackendPolicy {
  BackendChoice choice{};          // value 0: kAuto
  bool allow_fallback = true;      // NCCL -> Gloo when NCCL is unavailable or unstable
  int degrade_after_failures = 3;  // K failed NCCL operations...
  absl::Duration degrade_window;   // ...within this window: degrade to Gloo
  // backend.intra_host: ranks of one host talk through shared memory (true: the shm backend on one
  // host, shm inside each host of the hierarchical one) or through Gloo on loopback (false).
  bool intra_host_shm = true;
  // backend.hierarchical: several hosts with several ranks on some get the hierarchical backend
  // (true) or flat Gloo (false).
  bool hierarchical = true;
};

struct GlooSettings {
  std::string algorithm = "ring";  // "ring" or "bcube"
  absl::Duration timeout;          // per-operation (defaults to the collective timeout)
  uint64_t max_segment_bytes = 0;  // 0: Gloo's default
  int max_connections = 1024;      // pairs a rank opens at most (docs/scale.md)
};

struct FlightRecorderSettings {
  int entries = 2000;    // last N collectives per rank kept for the timeout dump
  std::string dump_dir;  // empty: $TMPDIR/adaptcomm-flight
};

// Debug mode (CommunicatorOptions::check_collectives, ADAPTCOMM_CHECK_COLLECTIVES).
struct DebugSettings {
  bool check_collectives = false;
};

struct TraceSettings {
  bool enabled = false;
  std::string dir;
};

// Metrics export (docs/monitoring.md): per-op counters always kept when enabled; the HTTP endpoint
// and the textfile only when a port or a path is set.
struct MetricsSettings {
  bool enabled = true;
  int port = -1;            // -1: no endpoint; 0: any free port; else the base, plus the local rank
  std::string port_source;  // "default", "profiles.yaml:12", "env ADAPTCOMM_METRICS_PORT"
  std::string address = "0.0.0.0";
  std::string textfile;  // "{rank}" becomes the rank; empty: none
  absl::Duration textfile_interval = absl::Seconds(15);
  int max_scrapes_per_second = 10;
  // NCCL device ops timed on the device with CUDA events (docs/monitoring.md): one in this many,
  // the same ops on every rank; 0: none (their times are the host's: launch to found done).
  int device_timing_every = 16;
};

// The state record `adaptcomm status` reads from the store.
struct StatusSettings {
  bool enabled = true;
  absl::Duration interval = absl::Seconds(1);
};

// Online fail-slow detection (docs/monitoring.md, "Fail-slow detection").
struct MonitorSettings {
  bool enabled = true;
  absl::Duration interval = absl::Seconds(1);  // samples published and scored this often
  absl::Duration window = absl::Seconds(10);   // the median of the scores over it names a rank
  double slow_threshold = 0.15;                // the score that names a rank
};

struct PrecisionSettings {
  // The default OverflowPolicy of mixed-precision collectives (adaptcomm/precision.h) with an fp16
  // wire: "report", "fail", "resend_bf16" or "resend_f32".
  std::string fp16_overflow = "report";
};

// The gradient bucketer (adaptcomm/bucketer.h; BucketerOptions::bucket_bytes wins).
struct BucketSettings {
  // Gradients fused into one allreduce: a bucket closes once it holds at least this many bytes.
  uint64_t bytes = uint64_t{25} << 20;
};

// Elastic membership (README, "Elastic membership"; CommunicatorOptions::elastic wins).
struct ElasticSettings {
  std::string on_loss = "fail";                   // "fail", "shrink" or "wait_for_replacement"
  int min_world_size = 1;                         // a shrink below it fails every rank instead
  absl::Duration loss_window = absl::Seconds(5);  // a rank not voting this long is lost
  absl::Duration replacement_timeout = absl::Seconds(60);
  std::string after_timeout = "shrink";  // wait_for_replacement, once it ran out: shrink or fail
};

// The tuned table (written by `adaptcomm tune`): the profile's `tuning.table`, or
// ADAPTCOMM_TUNED_TABLE, which wins. A corrupt or hand-edited table (unknown knob, value out of
// range...) is refused here with file:line and the reason, and the static profile applies. Its
// values apply only on the topology it was measured on: checked at communicator creation, when
// hosts and ranks per host are known (a table for another topology is refused by field).
// Online tuning: `tuning.online` of the profile,
// `enabled` also from ADAPTCOMM_ONLINE_TUNING (wins). During the first trials_per_candidate x
// candidates ops of each op x size band the communicator runs each candidate value of its
// backend's knobs in turn, times them, agrees on the winner with every rank through the store and
// keeps it for the rest of the job. Candidates that may change a float result (another reduction
// order: Gloo with more than 2 ranks) are tried only with allow_reorder.
struct OnlineTuningSettings {
  bool enabled = false;
  int trials_per_candidate = 5;
  std::vector<std::string> ops = {"allreduce"};  // OpKindName() names
  bool allow_reorder = false;
  // A candidate replaces the static values only when faster by more than this (percent).
  double threshold_pct = 3;
  // Bound of one band's agreement (its own trials finishing, every rank's medians, the verdict).
  absl::Duration decision_timeout = absl::Seconds(30);
  std::string source;  // where `enabled` came from ("profiles.yaml:12", "default", ...)
};

struct TuningSettings {
  std::string table;    // path, "" for none (relative paths in a profile: to the profile's dir)
  std::string source;   // "profiles.yaml:42", "env ADAPTCOMM_TUNED_TABLE"
  std::string digest;   // FNV-1a 64 of the file's bytes ("" for none): every rank must agree
  std::string refused;  // why the table is not used ("tuned.yaml:7:5: ..."); "" when it loaded
  std::shared_ptr<const config::TunedTable> loaded;  // null when none or refused
  OnlineTuningSettings online;
};

// The job's store (profile store.url; ADAPTCOMM_STORE wins over it, the API over both).
struct StoreSettings {
  // "redis://[user:password@]host:port" or "etcd://..." (StoreUrl, adaptcomm/store.h); empty:
  // rank 0 serves a TCP store. Explain() shows it with the password replaced by "***".
  std::string url;
  std::string source;  // "profiles.yaml:12", "env ADAPTCOMM_STORE", "API", "default"
};

// One row of the effective-configuration report.
struct SettingRecord {
  std::string key;         // "timeouts.collective", "nccl.NCCL_MIN_CTAS"
  std::string value;       // canonical text ("4200s", "2097152")
  std::string source;      // "profiles.yaml:42", "env NCCL_IB_HCA", "API", "default"
  std::string applied_as;  // "ncclConfig_t.minCTAs (NCCL >= 2.17)", "process env", "Gloo option"
  // The values of lower-precedence sources this one beat, "profiles.yaml:61 said 3"; empty when
  // no other source gave the setting a different value.
  std::string overridden;
};

struct ADAPTCOMM_EXPORT EffectiveConfig {
  std::string file;           // the profile file, as found
  std::string tier;           // selected tier name
  std::string tier_range;     // e.g. ">=100B"
  uint64_t model_params = 0;  // 0: no size given (smallest tier)
  int world_size = 1;
  bool strict = false;

  TimeoutConfig timeouts;
  RetryPolicy retry;
  BackendPolicy backend;
  // The NCCL_* settings after precedence, as the library applies them when it initialises NCCL
  // (ncclConfig_t fields where the loaded NCCL has them, else the process environment). Opaque
  // to a trainer, who reads them as the "nccl.*" rows of `settings`; null when none resolved.
  std::shared_ptr<const std::vector<config::NcclSetting>> nccl;
  GlooSettings gloo;
  FlightRecorderSettings flight_recorder;
  TraceSettings trace;
  MetricsSettings metrics;
  StatusSettings status;
  MonitorSettings monitor;
  PrecisionSettings precision;
  BucketSettings buckets;
  ElasticSettings elastic;
  TuningSettings tuning;
  StoreSettings store;
  DebugSettings debug;

  std::vector<SettingRecord> settings;  // every setting, sorted by key
  std::vector<std::string> warnings;    // dead/deprecated variables, non-power-of-two buffers...
  std::vector<std::string> notes;       // selection and scaling explanations

  // Human-readable table: every setting, its value, source and how it is applied.
  std::string Explain() const;
  std::string ExplainJson() const;
  // "key=value" lines sorted by key (no sources): what must match on every rank. Every setting is
  // in it except NCCL variables the user exported (interface names legitimately differ between
  // hosts) and the tuned table's path (its digest is compared instead).
  std::string CanonicalListing() const;
  // FNV-1a 64 of CanonicalListing().
  uint64_t Hash() const;
};

// Loads, validates and resolves a profile. InvalidArgument "file:line:column: ..." for a broken
// file; FailedPrecondition for strict-mode refusals; NotFound for a missing file.
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<EffectiveConfig> ResolveProfile(
    const ProfileRequest& request);

// The configuration directory (see ProfileRequest::file); empty if none exists.
ADAPTCOMM_EXPORT std::string DefaultConfigDir();

// ---- consistency across ranks ----

// Every rank publishes Hash() (and, for the error message, CanonicalListing()) to `store` under
// "adaptcomm/config/..." and reads everyone's. On any mismatch EVERY rank returns
// FailedPrecondition naming the ranks and the keys that differ, e.g.
// "rank 2 differs from rank 0 on timeouts.collective (2400s vs 1200s)". Use a fresh store prefix
// per communicator: keys are not deleted.
[[nodiscard]] ADAPTCOMM_EXPORT absl::Status CheckSameConfigOnAllRanks(Store& store, int rank,
                                                                      int world_size,
                                                                      const EffectiveConfig& cfg,
                                                                      absl::Duration timeout);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_PROFILE_H_

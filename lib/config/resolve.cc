// Finish(): built-in defaults < profile layers < exported environment < API, then world-size
// scaling and the cross-field checks.
#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "lib/base/log.h"
#include "lib/config/nccl_plan.h"
#include "lib/config/profile_schema.h"
#include "lib/config/resolve_internal.h"
#include "lib/config/sources.h"
#include "lib/config/units.h"

namespace adaptcomm::config {
namespace {

absl::StatusCode CodeFromName(const std::string& name) {
  if (name == "cancelled") return absl::StatusCode::kCancelled;
  if (name == "deadline_exceeded") return absl::StatusCode::kDeadlineExceeded;
  if (name == "aborted") return absl::StatusCode::kAborted;
  if (name == "unavailable") return absl::StatusCode::kUnavailable;
  if (name == "internal") return absl::StatusCode::kInternal;
  if (name == "resource_exhausted") return absl::StatusCode::kResourceExhausted;
  if (name == "data_loss") return absl::StatusCode::kDataLoss;
  return absl::StatusCode::kUnknown;
}

// Typed accessors over the merged values; canonical text was validated when parsed.
class Values {
 public:
  explicit Values(std::map<std::string, Layered>* v) : v_(v) {}
  const Layered& At(const std::string& key) const { return v_->at(key); }
  absl::Duration Duration(const std::string& key) const {
    auto d = ParseDuration(At(key).text);
    return d.ok() ? *d : absl::ZeroDuration();
  }
  int64_t Int(const std::string& key) const {
    int64_t v = 0;
    (void)absl::SimpleAtoi(At(key).text, &v);
    return v;
  }
  // A byte size as written (a default such as "1GiB") or as normalized (a plain integer).
  uint64_t Bytes(const std::string& key) const {
    auto b = ParseByteSize(At(key).text);
    return b.ok() ? *b : 0;
  }
  double Double(const std::string& key) const {
    double v = 0;
    (void)absl::SimpleAtod(At(key).text, &v);
    return v;
  }
  // A new value or source; what it overrode stays named.
  void Set(const std::string& key, std::string text, std::string source) {
    Layered& l = (*v_)[key];
    l.text = std::move(text);
    l.where = source;
    l.source = std::move(source);
  }
  void Insert(const std::string& key, Layered l) { (*v_)[key] = std::move(l); }

 private:
  std::map<std::string, Layered>* v_;
};

std::string Describe(const std::string& key, const Layered& l) {
  return absl::StrCat(key, " ", l.text, " (", l.where, ")");
}

absl::Status CheckLess(const std::string& a_key, absl::Duration a, const Layered& a_src,
                       const std::string& b_key, absl::Duration b, const Layered& b_src) {
  if (a < b) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("timeouts out of order: ", a_key, " ", DurationText(a), " (", a_src.where,
                   ") must be shorter than ", b_key, " ", DurationText(b), " (", b_src.where,
                   "); required: store_connect < collective < heartbeat"));
}

std::string AppliedAs(const NcclSetting& s) {
  if (s.user_exported) return "process env (exported by the user; NCCL reads it)";
  std::string env = s.per_process ? "process env before the first NCCL init (read once)"
                                  : "process env (read at each communicator init)";
  if (s.config_field.empty()) return env;
  return absl::StrCat("ncclConfig_t.", s.config_field,
                      " (NCCL >= ", NcclVersionText(s.config_since), "), else ", env);
}

// World-size scaling and the ordering checks of timeouts.*; writes the scaled rows back.
absl::Status ResolveTimeouts(const ResolveInputs& in, Values& v, EffectiveConfig& cfg) {
  TimeoutConfig& t = cfg.timeouts;
  t.store_connect = v.Duration("timeouts.store_connect");
  t.init = v.Duration("timeouts.init");
  t.collective_base = v.Duration("timeouts.collective");
  t.heartbeat = v.Duration("timeouts.heartbeat");
  t.abort = v.Duration("timeouts.abort");
  t.long_operation = v.Duration("timeouts.long_operation");
  const int reference = static_cast<int>(v.Int("world_scaling.reference_world"));
  const double per_doubling = v.Double("world_scaling.per_doubling");
  const double max_factor = v.Double("world_scaling.max_factor");
  const double factor = WorldScalingFactor(in.world_size, reference, per_doubling, max_factor);
  auto scale = [&](absl::Duration d) {
    return absl::Seconds(std::llround(absl::ToDoubleSeconds(d) * factor));
  };
  const bool collective_from_api = v.At("timeouts.collective").source == "API";
  t.world_factor = collective_from_api ? 1.0 : factor;
  t.collective = collective_from_api ? t.collective_base : scale(t.collective_base);
  if (v.At("timeouts.heartbeat").source != "API") t.heartbeat = scale(t.heartbeat);
  std::string formula = absl::StrFormat(
      "collective = base x min(%g, 1 + %g x log2(world/%d)) when world > %d, else base; "
      "world %d: %s x %g = %s (heartbeat scaled alike)",
      max_factor, per_doubling, reference, reference, in.world_size,
      DurationText(t.collective_base), factor, DurationText(scale(t.collective_base)));
  cfg.notes.push_back(collective_from_api
                          ? absl::StrCat("world scaling not applied: collective timeout set by API")
                          : absl::StrCat("world scaling: ", formula));

  // Timeouts set in code may be shorter than the profile's store bound (tests, small jobs). The
  // ordering store < collective and store <= init must still hold, so a store bound that the API
  // did not set follows them down (to half the op timeout, or the init timeout), visibly.
  if (v.At("timeouts.store_connect").source != "API") {
    absl::Duration store = t.store_connect;
    if (collective_from_api && store >= t.collective) store = t.collective / 2;
    if (v.At("timeouts.init").source == "API") store = std::min(store, t.init);
    if (store < t.store_connect) {
      t.store_connect = store;
      v.Set("timeouts.store_connect", DurationText(store), "API (follows the API timeouts)");
      cfg.notes.push_back(absl::StrCat("timeouts.store_connect lowered to ", DurationText(store),
                                       " to stay below the timeouts set by the API"));
    }
  }

  // Ordering: a store that outlives the collective bound, or a heartbeat that fires before the
  // collective bound, turns a slow step into a confusing failure.
  Layered coll = v.At("timeouts.collective");
  Layered hb = v.At("timeouts.heartbeat");
  if (absl::Status s =
          CheckLess("timeouts.store_connect", t.store_connect, v.At("timeouts.store_connect"),
                    "timeouts.collective", t.collective, coll);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLess("timeouts.collective", t.collective, coll, "timeouts.heartbeat",
                                 t.heartbeat, hb);
      !s.ok()) {
    return s;
  }
  if (t.init < t.store_connect) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeouts out of order: ", Describe("timeouts.init", v.At("timeouts.init")),
                     " must not be shorter than ",
                     Describe("timeouts.store_connect", v.At("timeouts.store_connect")),
                     ": creation includes connecting to the store"));
  }
  if (t.abort >= t.heartbeat) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeouts out of order: ", Describe("timeouts.abort", v.At("timeouts.abort")),
                     " must be shorter than timeouts.heartbeat ", DurationText(t.heartbeat), " (",
                     hb.where, ")"));
  }
  if (t.long_operation < t.collective) {
    cfg.warnings.push_back(absl::StrCat("timeouts.long_operation ", DurationText(t.long_operation),
                                        " is shorter than the scaled collective timeout ",
                                        DurationText(t.collective),
                                        ": a long-operation scope would tighten the bound"));
  }
  v.Set("timeouts.collective", DurationText(t.collective),
        collective_from_api
            ? "API"
            : (factor == 1.0 ? coll.source : absl::StrCat(coll.source, " x world scaling")));
  v.Insert("timeouts.collective_base",
           {DurationText(t.collective_base), coll.source, coll.where, coll.overridden});
  v.Set("timeouts.heartbeat", DurationText(t.heartbeat),
        hb.source == "API" || factor == 1.0 ? hb.source
                                            : absl::StrCat(hb.source, " x world scaling"));

  return absl::OkStatus();
}

// The typed fields of every section but timeouts and NCCL, from the merged values.
absl::Status ReadSettings(Values& v, EffectiveConfig& cfg) {
  const TimeoutConfig& t = cfg.timeouts;
  RetryPolicy& r = cfg.retry;
  r.max_attempts = static_cast<int>(v.Int("retry.max_attempts"));
  r.replay = v.At("retry.replay").text == "copy" ? ReplayMode::kCopy : ReplayMode::kAuto;
  r.report_window = v.Duration("retry.report_window");
  r.in_flight = static_cast<int>(v.Int("retry.in_flight"));
  r.record_bytes = v.Bytes("retry.record_bytes");
  r.initial_backoff = v.Duration("retry.initial_backoff");
  r.multiplier = v.Double("retry.multiplier");
  r.max_backoff = v.Duration("retry.max_backoff");
  r.jitter = v.Double("retry.jitter");
  for (absl::string_view name :
       absl::StrSplit(v.At("retry.retryable").text, ',', absl::SkipEmpty())) {
    r.retryable.push_back(CodeFromName(std::string(name)));
  }
  if (r.max_backoff < r.initial_backoff) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe("retry.max_backoff", v.At("retry.max_backoff")), " is shorter than ",
                     Describe("retry.initial_backoff", v.At("retry.initial_backoff"))));
  }

  const std::string choice = v.At("backend.choice").text;
  cfg.backend.choice = choice == "nccl"   ? BackendChoice::kNccl
                       : choice == "gloo" ? BackendChoice::kGloo
                       : choice == "shm"  ? BackendChoice::kShm
                                          : BackendChoice::kAuto;
  cfg.backend.allow_fallback = v.At("backend.fallback").text == "allow";
  cfg.backend.degrade_after_failures = static_cast<int>(v.Int("backend.degrade_after_failures"));
  cfg.backend.degrade_window = v.Duration("backend.degrade_window");
  cfg.backend.intra_host_shm = v.At("backend.intra_host").text == "shm";
  cfg.backend.hierarchical = v.At("backend.hierarchical").text == "auto";

  cfg.gloo.algorithm = v.At("gloo.algorithm").text;
  if (v.At("gloo.timeout").text == "collective") {
    cfg.gloo.timeout = t.collective;
    Layered g = v.At("gloo.timeout");
    v.Set("gloo.timeout", DurationText(t.collective), g.source);
  } else {
    cfg.gloo.timeout = v.Duration("gloo.timeout");
  }
  cfg.gloo.max_segment_bytes = static_cast<uint64_t>(v.Int("gloo.max_segment_bytes"));
  cfg.gloo.max_connections = static_cast<int>(v.Int("gloo.max_connections"));
  cfg.flight_recorder.entries = static_cast<int>(v.Int("flight_recorder.entries"));
  cfg.flight_recorder.dump_dir = v.At("flight_recorder.dump_dir").text;
  cfg.trace.enabled = v.At("trace.enabled").text == "true";
  cfg.trace.dir = v.At("trace.dir").text;
  cfg.metrics.enabled = v.At("metrics.enabled").text == "true";
  cfg.metrics.port = static_cast<int>(v.Int("metrics.port"));
  cfg.metrics.port_source = v.At("metrics.port").source;
  cfg.metrics.address = v.At("metrics.address").text;
  cfg.metrics.textfile = v.At("metrics.textfile").text;
  cfg.metrics.textfile_interval = v.Duration("metrics.textfile_interval");
  cfg.metrics.max_scrapes_per_second = static_cast<int>(v.Int("metrics.max_scrapes_per_second"));
  cfg.metrics.device_timing_every = static_cast<int>(v.Int("metrics.device_timing_every"));
  if (cfg.metrics.textfile_interval < absl::Seconds(1) ||
      cfg.metrics.textfile_interval > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe("metrics.textfile_interval", v.At("metrics.textfile_interval")),
                     " is out of range (1s to 1h)"));
  }
  cfg.status.enabled = v.At("status.enabled").text == "true";
  cfg.status.interval = v.Duration("status.interval");
  if (cfg.status.interval < absl::Milliseconds(100) || cfg.status.interval > absl::Seconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe("status.interval", v.At("status.interval")), " is out of range (100ms to 10s)"));
  }
  cfg.monitor.enabled = v.At("monitor.enabled").text == "true";
  cfg.monitor.interval = v.Duration("monitor.interval");
  cfg.monitor.window = v.Duration("monitor.window");
  cfg.monitor.slow_threshold = v.Double("monitor.slow_threshold");
  if (cfg.monitor.interval < absl::Milliseconds(100) || cfg.monitor.interval > absl::Seconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe("monitor.interval", v.At("monitor.interval")), " is out of range (100ms to 10s)"));
  }
  if (cfg.monitor.window < 3 * cfg.monitor.interval || cfg.monitor.window > absl::Minutes(10)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe("monitor.window", v.At("monitor.window")), " is out of range (3 x ",
                     Describe("monitor.interval", v.At("monitor.interval")), " to 10min)"));
  }
  cfg.precision.fp16_overflow = v.At("precision.fp16_overflow").text;
  cfg.buckets.bytes = v.Bytes("buckets.bytes");
  cfg.elastic.on_loss = v.At("elastic.on_loss").text;
  cfg.elastic.min_world_size = static_cast<int>(v.Int("elastic.min_world_size"));
  cfg.elastic.loss_window = v.Duration("elastic.loss_window");
  cfg.elastic.replacement_timeout = v.Duration("elastic.replacement_timeout");
  cfg.elastic.after_timeout = v.At("elastic.after_timeout").text;
  OnlineTuningSettings& online = cfg.tuning.online;
  online.enabled = v.At("tuning.online.enabled").text == "true";
  online.source = v.At("tuning.online.enabled").source;
  online.trials_per_candidate = static_cast<int>(v.Int("tuning.online.trials_per_candidate"));
  online.ops = absl::StrSplit(v.At("tuning.online.ops").text, ',', absl::SkipEmpty());
  online.allow_reorder = v.At("tuning.online.allow_reorder").text == "true";
  online.threshold_pct = v.Double("tuning.online.threshold_pct");
  online.decision_timeout = v.Duration("tuning.online.decision_timeout");
  cfg.tuning.table = v.At("tuning.table").text;
  cfg.tuning.source = v.At("tuning.table").source;
  cfg.debug.check_collectives = v.At("debug.check_collectives").text == "true";
  return absl::OkStatus();
}

// `old` takes `l`, naming the value it beat.
void Replace(NcclLayered& old, NcclLayered l) {
  l.overridden = old.overridden;
  if (old.value != l.value) {
    absl::StrAppend(&l.overridden, l.overridden.empty() ? "" : "; ", old.source, " said ",
                    old.value);
  }
  old = std::move(l);
}

// NCCL: profile, then what the user exported, then the API; appends the nccl.* rows.
absl::Status ResolveNccl(const ResolveInputs& in, const NcclRegistry& reg,
                         std::vector<std::pair<std::string, NcclLayered>> nccl,
                         EffectiveConfig& cfg) {
  const ProfileOverrides& o = in.overrides;
  auto find = [&](const std::string& name) {
    return std::find_if(nccl.begin(), nccl.end(), [&](const auto& e) { return e.first == name; });
  };
  std::map<std::string, bool> user_exported;
  for (const auto& [name, value] : in.user_env) {
    const NcclParam* p = reg.Lookup(name);
    if (p != nullptr && p->status == ParamStatus::kMetadata) continue;
    if (p == nullptr || p->status == ParamStatus::kNeverRead ||
        p->status == ParamStatus::kDeprecated) {
      if (absl::StartsWith(name, "NCCL_")) {
        cfg.warnings.push_back(absl::StrCat("exported ", reg.Describe(name)));
      }
      if (p == nullptr || p->status == ParamStatus::kNeverRead) continue;
    }
    auto it = find(name);
    if (it != nccl.end() && it->second.force) {
      if (it->second.value != value) {
        cfg.notes.push_back(absl::StrCat(name, ": the profile forces ", it->second.value,
                                         " over the exported ", value, " (", it->second.source,
                                         ")"));
      }
      continue;
    }
    NcclLayered l{value, absl::StrCat("env ", name), absl::StrCat("env ", name), false, ""};
    if (it == nccl.end()) {
      nccl.emplace_back(name, l);
    } else {
      if (it->second.value != value) {
        cfg.notes.push_back(absl::StrCat(name, ": the exported ", value,
                                         " wins over the profile's ", it->second.value, " (",
                                         it->second.source, "; mark it force: true to override)"));
      }
      Replace(it->second, std::move(l));
    }
    user_exported[name] = true;
  }
  std::vector<std::pair<std::string, std::string>> api = {o.nccl_env.begin(), o.nccl_env.end()};
  if (o.nccl_buffer_size) api.emplace_back("NCCL_BUFFSIZE", absl::StrCat(*o.nccl_buffer_size));
  if (o.nccl_min_ctas) api.emplace_back("NCCL_MIN_CTAS", absl::StrCat(*o.nccl_min_ctas));
  if (o.nccl_max_ctas) api.emplace_back("NCCL_MAX_CTAS", absl::StrCat(*o.nccl_max_ctas));
  for (const auto& [name, value] : api) {
    const NcclParam* p = reg.Lookup(name);
    if (p == nullptr || p->status == ParamStatus::kNeverRead) {
      return absl::InvalidArgumentError(absl::StrCat("API NCCL setting: ", reg.Describe(name)));
    }
    const NcclParam* c = reg.Canonical(name);
    auto normalized = reg.Normalize(*c, value);
    if (!normalized.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("API ", normalized.status().message()));
    }
    if (p->status == ParamStatus::kDeprecated) {
      cfg.warnings.push_back(
          absl::StrCat("API ", name, " is a deprecated alias of ", c->name, ": using ", c->name));
    }
    // API beats an exported variable, so it must be written even over the user's value.
    NcclLayered l{*normalized, "API", "API", /*force=*/true, ""};
    auto it = find(c->name);
    if (it == nccl.end()) {
      nccl.emplace_back(c->name, l);
    } else {
      Replace(it->second, std::move(l));
    }
    user_exported.erase(c->name);
  }
  std::sort(nccl.begin(), nccl.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<NcclSetting> nccl_settings;
  for (const auto& [name, l] : nccl) {
    NcclSetting s;
    s.name = name;
    s.value = l.value;
    s.source = l.source;
    s.force = l.force;
    s.user_exported = user_exported.count(name) > 0;
    if (const NcclParam* p = reg.Lookup(name)) {
      s.per_process = p->per_process;
      s.config_field = p->config_field;
      s.config_since = p->config_since;
      s.env_overrides_config = p->env_overrides_config;
    }
    cfg.settings.push_back({absl::StrCat(absl::StartsWith(name, "NCCL_") ? "nccl." : "env.", name),
                            s.value, s.source, AppliedAs(s), l.overridden});
    nccl_settings.push_back(std::move(s));
  }
  cfg.nccl = std::make_shared<const std::vector<NcclSetting>>(std::move(nccl_settings));
  auto ctas = [&](const char* name) -> std::pair<int64_t, std::string> {
    auto it = find(name);
    int64_t n = 0;
    if (it == nccl.end() || !absl::SimpleAtoi(it->second.value, &n)) return {0, ""};
    return {n, it->second.where};
  };
  auto [min_ctas, min_where] = ctas("NCCL_MIN_CTAS");
  auto [max_ctas, max_where] = ctas("NCCL_MAX_CTAS");
  if (min_ctas > 0 && max_ctas > 0 && min_ctas > max_ctas) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL_MIN_CTAS=", min_ctas, " (", min_where,
                                                   ") is greater than NCCL_MAX_CTAS=", max_ctas,
                                                   " (", max_where, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EffectiveConfig> Finish(const ResolveInputs& in, const NcclRegistry& reg,
                                       const Selection& sel, MergeInputs merge) {
  EffectiveConfig cfg;
  cfg.file = in.file;
  cfg.tier = sel.tier;
  cfg.tier_range = sel.range;
  cfg.model_params = in.model_params;
  cfg.world_size = in.world_size;
  cfg.strict = in.strict;
  cfg.warnings = std::move(merge.warnings);
  cfg.notes.push_back(sel.note);
  if (sel.gap) {
    ADAPTCOMM_LOG(kInfo, "profile: ", sel.note);
  } else {
    ADAPTCOMM_LOG(kDebug, "profile: ", sel.note);
  }

  // ---- adaptcomm's own settings: profile < exported ADAPTCOMM_* < API < what can run ----
  for (const KeySpec& spec : Schema()) {
    if (merge.values.count(spec.key) == 0) {
      merge.values[spec.key] = {spec.default_text, "default", "built-in default", ""};
    }
  }
  if (absl::Status s = ApplyLayer(EnvLayer(in.env), merge.values); !s.ok()) return s;
  absl::StatusOr<std::vector<Given>> api = ApiLayer(in.overrides);
  if (!api.ok()) return api.status();
  if (absl::Status s = ApplyLayer(*api, merge.values); !s.ok()) return s;
  ApplyRunRules(in.run, merge.values);
  Values v(&merge.values);
  cfg.store.url = v.At("store.url").text;
  cfg.store.source = v.At("store.url").source;
  if (!cfg.store.url.empty()) {
    // Explain() and the cross-rank check show the URL without its password.
    absl::StatusOr<StoreUrl> url = ParseStoreUrl(cfg.store.url);
    if (url.ok()) merge.values["store.url"].text = RedactedStoreUrl(*url);
  }
  if (absl::Status s = ResolveTimeouts(in, v, cfg); !s.ok()) return s;
  if (absl::Status s = ReadSettings(v, cfg); !s.ok()) return s;
  for (const auto& [key, l] : merge.values) {
    const KeySpec* spec = FindKey(key);
    std::string applied = spec != nullptr ? spec->applied_as : "watchdog bound before scaling";
    cfg.settings.push_back({key, l.text, l.source, applied, l.overridden});
  }
  if (absl::Status s = ResolveNccl(in, reg, std::move(merge.nccl), cfg); !s.ok()) return s;
  std::sort(cfg.settings.begin(), cfg.settings.end(),
            [](const SettingRecord& a, const SettingRecord& b) { return a.key < b.key; });
  for (const std::string& w : cfg.warnings) ADAPTCOMM_LOG(kWarning, "profile: ", w);
  return cfg;
}

}  // namespace adaptcomm::config

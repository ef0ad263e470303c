#include "lib/config/sources.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/config/profile_schema.h"
#include "lib/config/units.h"

namespace adaptcomm::config {
namespace {

const char* BoolText(bool b) { return b ? "true" : "false"; }

}  // namespace

const std::vector<EnvSetting>& EnvSettings() {
  // `adaptcomm launch` exports several of these to every rank; docs/operations.md lists them.
  static const auto* vars = new std::vector<EnvSetting>{
      {"ADAPTCOMM_STORE", "store.url"},
      {"ADAPTCOMM_CHECK_COLLECTIVES", "debug.check_collectives"},
      {"ADAPTCOMM_ELASTIC", "elastic.on_loss"},
      {"ADAPTCOMM_ELASTIC_MIN_WORLD", "elastic.min_world_size"},
      {"ADAPTCOMM_FLIGHT_RECORDER_DIR", "flight_recorder.dump_dir"},
      {"ADAPTCOMM_METRICS_PORT", "metrics.port"},
      {"ADAPTCOMM_METRICS_TEXTFILE", "metrics.textfile"},
      {"ADAPTCOMM_ONLINE_TUNING", "tuning.online.enabled"},
      {"ADAPTCOMM_TRACE", "trace.enabled"},
      {"ADAPTCOMM_TRACE_DIR", "trace.dir"},
      {"ADAPTCOMM_TUNED_TABLE", "tuning.table"},
  };
  return *vars;
}

std::vector<Given> EnvLayer(const std::map<std::string, std::string>& env) {
  std::vector<Given> out;
  for (const EnvSetting& e : EnvSettings()) {
    auto it = env.find(e.var);
    if (it == env.end() || it->second.empty()) continue;
    out.push_back({e.key, it->second, absl::StrCat("env ", e.var)});
  }
  return out;
}

absl::StatusOr<std::vector<Given>> ApiLayer(const ProfileOverrides& o) {
  std::vector<Given> out;
  const std::pair<const std::optional<absl::Duration>*, const char*> durations[] = {
      {&o.store_connect_timeout, "timeouts.store_connect"},
      {&o.init_timeout, "timeouts.init"},
      {&o.collective_timeout, "timeouts.collective"},
      {&o.heartbeat_timeout, "timeouts.heartbeat"},
      {&o.abort_timeout, "timeouts.abort"},
      {&o.long_operation_timeout, "timeouts.long_operation"},
      {&o.failure_report_window, "retry.report_window"},
      {&o.loss_window, "elastic.loss_window"},
      {&o.replacement_timeout, "elastic.replacement_timeout"}};
  for (const auto& [d, key] : durations) {
    if (!d->has_value()) continue;
    // DurationText would round a sub-millisecond value to "0ms": refuse it as what it is.
    if (**d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("API ", key, " must be positive, got ", absl::FormatDuration(**d)));
    }
    out.push_back({key, DurationText(**d), "API"});
  }
  auto add = [&out](const char* key, std::string text) {
    out.push_back({key, std::move(text), "API"});
  };
  if (o.backend) add("backend.choice", BackendChoiceName(*o.backend));
  if (o.allow_fallback) add("backend.fallback", *o.allow_fallback ? "allow" : "deny");
  if (o.max_retry_attempts) add("retry.max_attempts", absl::StrCat(*o.max_retry_attempts));
  if (o.replay) add("retry.replay", ReplayModeName(*o.replay));
  if (o.store_url) add("store.url", *o.store_url);
  if (o.flight_recorder_entries) {
    add("flight_recorder.entries", absl::StrCat(*o.flight_recorder_entries));
  }
  if (o.flight_recorder_dir) add("flight_recorder.dump_dir", *o.flight_recorder_dir);
  if (o.check_collectives) add("debug.check_collectives", BoolText(*o.check_collectives));
  if (o.on_loss) add("elastic.on_loss", LossPolicyName(*o.on_loss));
  if (o.min_world_size) add("elastic.min_world_size", absl::StrCat(*o.min_world_size));
  if (o.after_timeout) add("elastic.after_timeout", LossPolicyName(*o.after_timeout));
  return out;
}

void Override(Layered& l, const std::string& text, const std::string& source) {
  if (l.source != "default" && l.text != text) {
    absl::StrAppend(&l.overridden, l.overridden.empty() ? "" : "; ", l.source, " said ",
                    l.text.empty() ? "\"\"" : l.text);
  }
  l.text = text;
  l.source = source;
  l.where = source;
}

absl::Status ApplyLayer(const std::vector<Given>& layer, std::map<std::string, Layered>& values) {
  for (const Given& g : layer) {
    const KeySpec* spec = FindKey(g.key);
    if (spec == nullptr) return absl::InternalError(absl::StrCat(g.source, ": no key ", g.key));
    absl::StatusOr<std::string> c = CanonicalValue(*spec, g.text);
    if (!c.ok()) {
      return absl::Status(c.status().code(), absl::StrCat(g.source, ": ", c.status().message()));
    }
    Override(values.at(g.key), *c, g.source);
  }
  return absl::OkStatus();
}

void ApplyRunRules(const RunContext& context, std::map<std::string, Layered>& values) {
  Layered& attempts = values.at("retry.max_attempts");
  Layered& on_loss = values.at("elastic.on_loss");
  if (!context.coordinated) {
    const std::string why = absl::StrCat(context.why_not, ": no coordinated retry");
    if (attempts.text != "1") Override(attempts, "1", why);
    if (on_loss.text != "fail") Override(on_loss, "fail", why);
    return;
  }
  if (on_loss.text != "fail" && attempts.text == "1") {
    Override(attempts, "2",
             absl::StrCat("elastic.on_loss ", on_loss.text,
                          " (a membership change is agreed by "
                          "the retry's vote)"));
  }
}

}  // namespace adaptcomm::config

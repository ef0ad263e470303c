// NCCL application: which settings go into ncclConfig_t for the loaded NCCL, which into the
// process environment, and setting that environment without trampling the user's exports.
#include <cstdlib>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/log.h"
#include "lib/config/nccl_plan.h"
#include "lib/config/nccl_registry.h"
#include "lib/config/resolve_internal.h"

namespace adaptcomm::config {
namespace {

struct AppliedEnv {
  absl::Mutex mu;
  std::map<std::string, std::string> values ABSL_GUARDED_BY(mu);  // what adaptcomm set
};

AppliedEnv& Applied() {
  static auto* applied = new AppliedEnv();
  return *applied;
}

// Returns false if `field` is not an ncclConfig_t member this code knows.
bool SetField(NcclConfigValues* c, const std::string& field, const std::string& value) {
  int n = 0;
  bool is_int = absl::SimpleAtoi(value, &n);
  auto set_int = [&](std::optional<int>* slot) {
    if (!is_int) return false;
    *slot = n;
    return true;
  };
  if (field == "blocking") return set_int(&c->blocking);
  if (field == "cgaClusterSize") return set_int(&c->cga_cluster_size);
  if (field == "minCTAs") return set_int(&c->min_ctas);
  if (field == "maxCTAs") return set_int(&c->max_ctas);
  if (field == "splitShare") return set_int(&c->split_share);
  if (field == "trafficClass") return set_int(&c->traffic_class);
  if (field == "CTAPolicy") return set_int(&c->cta_policy);
  if (field == "nvlsCTAs") return set_int(&c->nvls_ctas);
  if (field == "netName") {
    c->net_name = value;
    return true;
  }
  if (field == "commName") {
    c->comm_name = value;
    return true;
  }
  return false;
}

}  // namespace

bool SetByAdaptcomm(const std::string& name, const std::string& value) {
  AppliedEnv& a = Applied();
  absl::MutexLock lock(&a.mu);
  auto it = a.values.find(name);
  return it != a.values.end() && it->second == value;
}

void ResetAppliedEnvForTest() {
  AppliedEnv& a = Applied();
  absl::MutexLock lock(&a.mu);
  a.values.clear();
}

const std::vector<NcclSetting>& NcclSettingsOf(const EffectiveConfig& cfg) {
  static const auto* const kNone = new std::vector<NcclSetting>();
  return cfg.nccl != nullptr ? *cfg.nccl : *kNone;
}

NcclPlan PlanNccl(const EffectiveConfig& cfg, int nccl_version_code) {
  NcclPlan plan;
  const std::string version =
      nccl_version_code > 0 ? absl::StrCat("NCCL ", config::NcclVersionText(nccl_version_code))
                            : std::string("an NCCL of unknown version");
  for (const NcclSetting& s : NcclSettingsOf(cfg)) {
    if (s.user_exported) continue;  // already in the environment, where NCCL reads it
    if (!s.config_field.empty()) {
      if (nccl_version_code >= s.config_since && SetField(&plan.config, s.config_field, s.value)) {
        // NCCL lets these variables override the field, so a value that must beat the user's
        // export is written to the environment too.
        if (s.env_overrides_config && s.force) plan.env.push_back({s.name, s.value, true});
        continue;
      }
      plan.notes.push_back(absl::StrCat(version, " lacks ncclConfig_t.", s.config_field,
                                        " (added in ", config::NcclVersionText(s.config_since),
                                        "): ", s.name, "=", s.value,
                                        " goes to the process environment instead"));
    }
    plan.env.push_back({s.name, s.value, s.force});
  }
  return plan;
}

NcclEnvReport ApplyNcclEnvironment(const EffectiveConfig& cfg, int nccl_version_code) {
  NcclPlan plan = PlanNccl(cfg, nccl_version_code);
  NcclEnvReport report;
  AppliedEnv& a = Applied();
  absl::MutexLock lock(&a.mu);
  for (const NcclEnvVar& var : plan.env) {
    bool per_process = true;
    for (const NcclSetting& s : NcclSettingsOf(cfg)) {
      if (s.name == var.name) per_process = s.per_process;
    }
    auto prev = a.values.find(var.name);
    if (prev != a.values.end()) {
      if (prev->second == var.value) continue;
      if (per_process) {
        std::string msg = absl::StrCat(
            var.name, ": this profile wants ", var.value, " but ", prev->second,
            " was already set for an earlier communicator and NCCL reads it once per process; "
            "keeping ",
            prev->second);
        ADAPTCOMM_LOG(kWarning, "profile: ", msg);
        report.conflicts.push_back(msg);
        continue;
      }
    } else if (const char* existing = std::getenv(var.name.c_str());
               existing != nullptr && !var.force) {
      if (existing != var.value) {
        ADAPTCOMM_LOG(kInfo, "profile: keeping exported ", var.name, "=", existing,
                      " (profile: ", var.value, ")");
      }
      report.kept_user.push_back(absl::StrCat(var.name, "=", existing));
      continue;
    }
    setenv(var.name.c_str(), var.value.c_str(), 1);
    a.values[var.name] = var.value;
    report.set.push_back(absl::StrCat(var.name, "=", var.value));
  }
  return report;
}

}  // namespace adaptcomm::config

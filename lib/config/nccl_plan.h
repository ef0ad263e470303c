// The NCCL part of the effective configuration and its application: which NCCL_* settings a
// profile resolved to (EffectiveConfig::nccl), which of them go into ncclConfig_t for the loaded
// NCCL and which into the process environment, and setting that environment without trampling
// the user's exports. Internal: a trainer sees these settings as the "nccl.*" rows of
// EffectiveConfig::settings; the NCCL backend (lib/nccl) and communicator creation (lib/core)
// read the plan. Defined in lib/config/apply.cc.
#ifndef ADAPTCOMM_LIB_CONFIG_NCCL_PLAN_H_
#define ADAPTCOMM_LIB_CONFIG_NCCL_PLAN_H_

#include <optional>
#include <string>
#include <vector>

#include "adaptcomm/profile.h"

namespace adaptcomm::config {

// One NCCL setting after precedence. Where it goes is decided by PlanNccl() once the loaded NCCL
// version is known.
struct NcclSetting {
  std::string name;            // canonical NCCL_* name (deprecated aliases already translated)
  std::string value;           // as NCCL parses it (sizes in bytes)
  std::string source;          // "profiles.yaml:42", "env NCCL_IB_HCA", "API", "default"
  bool force = false;          // overwrite a value the user exported
  bool user_exported = false;  // the value IS the user's exported one: nothing to set
  bool per_process = true;     // NCCL reads it once per process and caches it
  std::string config_field;    // ncclConfig_t field, empty if none
  int config_since = 0;        // NCCL_VERSION_CODE that added config_field (2.17 -> 21700)
  bool env_overrides_config = false;  // NCCL lets the env win over the ncclConfig_t field
};

// cfg.nccl, or an empty list when the configuration resolved none (a default-built one).
const std::vector<NcclSetting>& NcclSettingsOf(const EffectiveConfig& cfg);

// Mirrors ncclConfig_t; an unset field keeps NCCL's default.
struct NcclConfigValues {
  std::optional<int> blocking;
  std::optional<int> cga_cluster_size;
  std::optional<int> min_ctas;
  std::optional<int> max_ctas;
  std::optional<std::string> net_name;
  std::optional<int> split_share;
  std::optional<int> traffic_class;
  std::optional<std::string> comm_name;
  std::optional<int> cta_policy;
  std::optional<int> nvls_ctas;
};

struct NcclEnvVar {
  std::string name;
  std::string value;
  bool force = false;
};

struct NcclPlan {
  NcclConfigValues config;         // for ncclCommInitRankConfig
  std::vector<NcclEnvVar> env;     // to set before the first NCCL init
  std::vector<std::string> notes;  // e.g. "trafficClass needs NCCL 2.26; NCCL_IB_TC set instead"
};

// Pure: splits the NCCL settings of `cfg` for the loaded NCCL (version code as NCCL_VERSION_CODE:
// 2.27.3 -> 22703). Fields the version lacks go to the env instead, with a note.
NcclPlan PlanNccl(const EffectiveConfig& cfg, int nccl_version_code);

struct NcclEnvReport {
  std::vector<std::string> set;        // NAME=value set now
  std::vector<std::string> kept_user;  // NAME: user's exported value kept
  std::vector<std::string> conflicts;  // read-once variables a later call wanted different
};

// Sets the process environment for PlanNccl(cfg, version).env by precedence: a variable the user
// exported is kept unless the setting is forced or came from the API. Read-once variables already
// set by an earlier call are not changed; a different wanted value is logged as a warning and
// listed in conflicts. Thread-safe.
NcclEnvReport ApplyNcclEnvironment(const EffectiveConfig& cfg, int nccl_version_code);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_NCCL_PLAN_H_

// Between parsing and the final EffectiveConfig: the merged profile layers, before the
// environment, the API overrides, world-size scaling and the cross-field checks.
#ifndef ADAPTCOMM_LIB_CONFIG_RESOLVE_INTERNAL_H_
#define ADAPTCOMM_LIB_CONFIG_RESOLVE_INTERNAL_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "adaptcomm/profile.h"
#include "lib/config/nccl_registry.h"
#include "lib/config/profile_loader.h"

namespace adaptcomm::config {

struct Layered {
  std::string text;        // canonical value
  std::string source;      // "profiles.yaml:42", "API", "default"
  std::string where;       // "profiles.yaml:42:16" for error messages
  std::string overridden;  // what lower sources said, "profiles.yaml:42 said 3" (Explain)
};

struct NcclLayered {
  std::string value;
  std::string source;
  std::string where;
  bool force = false;
  std::string overridden;
};

struct Selection {
  std::string tier;
  std::string range;
  std::string note;
  bool gap = false;
};

struct MergeInputs {
  std::map<std::string, Layered> values;
  std::vector<std::pair<std::string, NcclLayered>> nccl;
  std::vector<std::string> warnings;
  std::vector<std::string> refusals;
};

absl::StatusOr<EffectiveConfig> Finish(const ResolveInputs& in, const NcclRegistry& reg,
                                       const Selection& sel, MergeInputs merge);

// True if adaptcomm itself set `name` to `value` in this process (ApplyNcclEnvironment), so
// finding it in the environment does not mean the user exported it.
bool SetByAdaptcomm(const std::string& name, const std::string& value);
// Forgets what ApplyNcclEnvironment set (tests only; the variables themselves stay).
void ResetAppliedEnvForTest();

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_RESOLVE_INTERNAL_H_

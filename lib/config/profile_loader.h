// The profile loader proper: YAML text -> validated layers -> EffectiveConfig. ResolveProfile()
// (profile.cc) finds the file and the environment; this part is pure, so tests and the fuzzer
// drive it with fixed inputs.
#ifndef ADAPTCOMM_LIB_CONFIG_PROFILE_LOADER_H_
#define ADAPTCOMM_LIB_CONFIG_PROFILE_LOADER_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "adaptcomm/profile.h"
#include "lib/config/nccl_registry.h"
#include "lib/config/settings.h"

namespace adaptcomm::config {

struct ResolveInputs {
  std::string text;             // the profile file's contents
  std::string file;             // its path, as shown in messages
  uint64_t model_params = 0;    // 0: select by tier_name, else the smallest tier
  std::string tier_name;        // a profile (tier) name instead of a size
  std::string model_size_text;  // as the user wrote it, for messages
  int world_size = 1;
  bool strict = false;
  ProfileOverrides overrides;
  // NCCL_* variables the user exported (not ones adaptcomm set itself).
  std::map<std::string, std::string> user_env;
  // The ADAPTCOMM_* variables of EnvSettings() (lib/config/sources.h) that are exported.
  std::map<std::string, std::string> env;
  RunContext run;
};

absl::StatusOr<EffectiveConfig> ResolveFromText(const ResolveInputs& in, const NcclRegistry& reg);

// factor(world) as documented in adaptcomm/profile.h.
double WorldScalingFactor(int world, int reference_world, double per_doubling, double max_factor);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_PROFILE_LOADER_H_

// The one place every source of a setting is merged: the trainer's options (as
// ProfileRequest::overrides), the exported ADAPTCOMM_* and NCCL_* variables, the profile's tiers
// and the tuned table, into one immutable EffectiveConfig that the communicator runs on and
// Explain() prints. Precedence: include/adaptcomm/profile.h; the layers above the profile:
// lib/config/sources.h.
#ifndef ADAPTCOMM_LIB_CONFIG_SETTINGS_H_
#define ADAPTCOMM_LIB_CONFIG_SETTINGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "adaptcomm/profile.h"

namespace adaptcomm::config {

// What the caller can run, which some settings depend on (ApplyRunRules, lib/config/sources.h).
struct RunContext {
  bool coordinated = true;  // a store the ranks agree coordinated retries on
  std::string why_not;      // when not: "CreateWithBackend (no store)"
};

// Finds the profile file, reads the environment, resolves and attaches the tuned table.
// ResolveProfile() is this with the default context; communicator creation passes its own.
absl::StatusOr<EffectiveConfig> ResolveSettings(const ProfileRequest& request,
                                                const RunContext& run);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_SETTINGS_H_

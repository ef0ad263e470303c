// The tuned table in the effective configuration (issue #15): found through the profile's
// `tuning.table` or ADAPTCOMM_TUNED_TABLE, parsed and validated once when the profile resolves,
// shown by Explain() value by value with its source, and compared across ranks by digest.
#ifndef ADAPTCOMM_LIB_CONFIG_TUNING_H_
#define ADAPTCOMM_LIB_CONFIG_TUNING_H_

#include <string>

#include "adaptcomm/profile.h"

namespace adaptcomm::config {

inline constexpr char kTunedTableEnv[] = "ADAPTCOMM_TUNED_TABLE";

// FNV-1a 64 of `bytes` as 16 hex digits.
std::string TunedTableDigest(const std::string& bytes);

// Loads the table at `path` (from `source`: "profiles.yaml:42" or "env ADAPTCOMM_TUNED_TABLE")
// into cfg.tuning and adds its rows to cfg.settings: tuning.table, tuning.table_digest (compared
// across ranks even when the path came from the environment) and one tuned.* row per entry with
// its file:line and measurement. A table that cannot be read or does not validate is refused:
// cfg.tuning.refused says why (file:line: reason) and a warning says the static profile applies.
// An empty path leaves cfg without a table.
void AttachTunedTable(EffectiveConfig& cfg, const std::string& path, const std::string& source);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_TUNING_H_

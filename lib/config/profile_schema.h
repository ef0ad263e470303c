// The keys a profile section may hold, their types and how each one is applied.
#ifndef ADAPTCOMM_LIB_CONFIG_PROFILE_SCHEMA_H_
#define ADAPTCOMM_LIB_CONFIG_PROFILE_SCHEMA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace adaptcomm::config {

// kNameList: names from `choices`, a YAML list or comma-separated ("allreduce,reduce").
enum class Kind { kDuration, kInt, kDouble, kBool, kEnum, kString, kBytes, kCodeList, kNameList };

struct KeySpec {
  const char* key;  // "timeouts.collective", "tuning.online.enabled" (a map inside the section)
  Kind kind;
  double min = 0, max = 0;           // kInt, kDouble (inclusive)
  std::vector<std::string> choices;  // kEnum, kNameList
  const char* default_text;          // built-in default, canonical text
  const char* applied_as;            // for Explain()
};

const std::vector<KeySpec>& Schema();
const KeySpec* FindKey(const std::string& key);
// Sections ("timeouts", ...) a defaults or tier block may contain, besides "nccl".
const std::vector<std::string>& SectionNames();

// Validates `text` against the spec and returns its canonical form ("40min" -> "2400s").
absl::StatusOr<std::string> CanonicalValue(const KeySpec& spec, const std::string& text);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_PROFILE_SCHEMA_H_

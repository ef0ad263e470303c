// The sources of a setting above the profile file, and the rules that make an effective value the
// one that runs. Finish() (resolve.cc) applies them over the merged profile layers in precedence
// order: the profile < the exported ADAPTCOMM_* variables < the API (ProfileOverrides, which
// CommunicatorOptions fills) < the run rules. Each step keeps what it beat (Layered::overridden),
// so Explain() names both sources of a setting given two values.
#ifndef ADAPTCOMM_LIB_CONFIG_SOURCES_H_
#define ADAPTCOMM_LIB_CONFIG_SOURCES_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adaptcomm/profile.h"
#include "lib/config/resolve_internal.h"

namespace adaptcomm::config {

// An ADAPTCOMM_* variable that sets a profile key.
struct EnvSetting {
  const char* var;  // "ADAPTCOMM_STORE"
  const char* key;  // "store.url"
};
const std::vector<EnvSetting>& EnvSettings();

// One value of one source, not yet checked against the schema.
struct Given {
  std::string key;
  std::string text;
  std::string source;  // "env ADAPTCOMM_STORE", "API"
};

// The exported variables among EnvSettings(), from `env` (variable -> value; empty values ignored).
std::vector<Given> EnvLayer(const std::map<std::string, std::string>& env);
// Every field of `o` that is set, as schema keys. InvalidArgument for a non-positive duration.
absl::StatusOr<std::vector<Given>> ApiLayer(const ProfileOverrides& o);

// `l` takes `text` from `source`; a different value of an explicit source is kept in `overridden`.
void Override(Layered& l, const std::string& text, const std::string& source);
// Checks each value against the schema and applies it over `values`. The error names the source:
// "env ADAPTCOMM_STORE: store.url: ...".
absl::Status ApplyLayer(const std::vector<Given>& layer, std::map<std::string, Layered>& values);

// What the communicator can run, whatever the sources say: without a store (CreateWithBackend)
// there is no coordinated retry (retry.max_attempts 1, elastic.on_loss fail); elastic membership is
// agreed by the retry's vote (retry.max_attempts at least 2).
void ApplyRunRules(const RunContext& context, std::map<std::string, Layered>& values);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_SOURCES_H_

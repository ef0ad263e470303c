// The NCCL parameter registry: what NCCL does with each NCCL_* name (configs/nccl_params.yaml).
// Profiles use it to translate deprecated names, refuse dead ones and route per-communicator
// settings into ncclConfig_t; `adaptcomm diagnose` uses it to lint a user's environment.
//
//   auto reg = config::NcclRegistry::LoadCached(path);            // shared, immutable
//   const config::NcclParam* p = (*reg)->Lookup("NCCL_MIN_NRINGS");  // status kDeprecated
//   const config::NcclParam* cur = (*reg)->Canonical("NCCL_MIN_NRINGS");  // NCCL_MIN_CTAS
//   std::string hint = (*reg)->DidYouMean("NCCL_MAX_RINGS");            // "NCCL_MAX_CTAS"
#ifndef ADAPTCOMM_LIB_CONFIG_NCCL_REGISTRY_H_
#define ADAPTCOMM_LIB_CONFIG_NCCL_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace adaptcomm::config {

// kMetadata: an NCCL_* name that is no setting at all, such as NCCL_VERSION, which NVIDIA's
// container images export to name the NCCL they ship; NCCL never reads it, and seeing it exported
// is normal, so it is neither applied nor warned about.
enum class ParamStatus { kCurrent, kDeprecated, kNeverRead, kPluginOnly, kMetadata };

enum class ParamType { kInt, kBool, kBytes, kString };

struct NcclParam {
  std::string name;
  ParamStatus status = ParamStatus::kCurrent;
  ParamType type = ParamType::kString;
  std::optional<int64_t> min, max;  // int and bytes
  std::vector<std::string> values;  // allowed strings, empty = any
  std::string default_value;        // NCCL's default as text ("auto": decided at run time)
  bool per_process = true;          // read once per process and cached
  std::string config_field;         // ncclConfig_t member, empty if none
  int config_since = 0;             // NCCL_VERSION_CODE that added it (2.17 -> 21700)
  bool env_overrides_config = false;
  std::string alias_of;  // kDeprecated: the current name
  std::string since;     // kDeprecated: "2.17"
  std::string suggest;   // kNeverRead: the name probably meant
  std::string plugin;    // kPluginOnly: who reads it
  std::string note;      // one line for the user
};

class NcclRegistry {
 public:
  // Parses a registry file. InvalidArgument "path:line:column: ..." on a malformed entry.
  static absl::StatusOr<NcclRegistry> Load(const std::string& path);
  static absl::StatusOr<NcclRegistry> Parse(const std::string& text, const std::string& name);
  // Load() once per path per process.
  static absl::StatusOr<std::shared_ptr<const NcclRegistry>> LoadCached(const std::string& path);

  // The entry for exactly `name`, nullptr if unknown.
  const NcclParam* Lookup(const std::string& name) const;
  // The current entry `name` stands for (follows alias_of), nullptr if unknown.
  const NcclParam* Canonical(const std::string& name) const;
  // A name the user probably meant: the entry's `suggest`, else the closest known name by edit
  // distance (deprecated ones replaced by their current name); "" if nothing is close.
  std::string DidYouMean(const std::string& name) const;
  // Checks `value` against type and range; returns the form NCCL parses (sizes in bytes).
  absl::StatusOr<std::string> Normalize(const NcclParam& param, const std::string& value) const;
  // One line: status, note, and what to do ("NCCL_IB_MTU: never read by NCCL: ...").
  std::string Describe(const std::string& name) const;

  const std::map<std::string, NcclParam>& params() const { return params_; }

 private:
  std::map<std::string, NcclParam> params_;
};

// "2.17" -> 21700, "2.27.3" -> 22703; 0 if malformed.
int NcclVersionCode(const std::string& version);
std::string NcclVersionText(int code);  // 21700 -> "2.17"

// Levenshtein distance (used for did-you-mean on profile keys too).
int EditDistance(const std::string& a, const std::string& b);
// The closest candidate within a distance proportional to the length, "" if none.
std::string ClosestName(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_NCCL_REGISTRY_H_

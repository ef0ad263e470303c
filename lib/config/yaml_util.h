// yaml-cpp helpers shared by the profile loader and the NCCL registry: parsing without
// exceptions escaping, and errors that point at file:line:column with the offending text.
#ifndef ADAPTCOMM_LIB_CONFIG_YAML_UTIL_H_
#define ADAPTCOMM_LIB_CONFIG_YAML_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "yaml-cpp/yaml.h"

namespace adaptcomm::config {

// Larger files are refused: profiles are small, and a bound keeps a fuzzed input cheap.
inline constexpr size_t kMaxConfigBytes = 1 << 20;

// Parses one YAML document; InvalidArgument "file:line:column: message" on a syntax error.
absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& file);
// Reads a whole file (bounded by kMaxConfigBytes); NotFound if absent.
absl::StatusOr<std::string> ReadConfigFile(const std::string& path);

// "file:line:column" of a node (1-based), "file" alone if the node has no position.
std::string Where(const std::string& file, const YAML::Node& node);
// "profiles.yaml:42": base name and line (the form used as a setting's source).
std::string WhereLine(const std::string& file, const YAML::Node& node);
// A short single-line rendering of the node's text, for error messages.
std::string Excerpt(const YAML::Node& node);
// InvalidArgument "file:line:column: message (at 'text')".
absl::Status ErrorAt(const std::string& file, const YAML::Node& node, const std::string& message);
// The node's scalar text; an error naming the position if it is a map or a sequence.
absl::StatusOr<std::string> ScalarAt(const std::string& file, const YAML::Node& node,
                                     const std::string& what);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_YAML_UTIL_H_

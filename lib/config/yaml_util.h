// yaml-cpp helpers shared by every YAML file the library loads (profiles, templates, the NCCL
// registry, the doctor's knowledge base, the compatibility matrix): parsing without exceptions
// escaping, duplicate keys refused, and errors that point at file:line:column with the text.
#ifndef ADAPTCOMM_LIB_CONFIG_YAML_UTIL_H_
#define ADAPTCOMM_LIB_CONFIG_YAML_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "yaml-cpp/yaml.h"

namespace adaptcomm::config {

// Larger files are refused: profiles are small, and a bound keeps a fuzzed input cheap.
inline constexpr size_t kMaxConfigBytes = 1 << 20;

// Parses one YAML document; InvalidArgument "file:line:column: message" on a syntax error or a
// duplicate key (see CheckNoDuplicateKeys).
absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& file);
// yaml-cpp keeps every copy of a repeated map key, and lookups and iteration then disagree on
// which copy counts. InvalidArgument naming the key and both positions, e.g.
// "p.yaml:7:3: duplicate key 'name' (first at p.yaml:2:3): a key may appear only once in a map".
absl::Status CheckNoDuplicateKeys(const YAML::Node& root, const std::string& file);
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

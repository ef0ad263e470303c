#include "lib/config/yaml_util.h"

#include <exception>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace adaptcomm::config {

absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& file) {
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", text.size(),
                                                   " bytes is larger than the ", kMaxConfigBytes,
                                                   "-byte limit for configuration files"));
  }
  try {
    YAML::Node root = YAML::Load(text);
    if (absl::Status s = CheckNoDuplicateKeys(root, file); !s.ok()) return s;
    return root;
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": YAML error: ", e.msg));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(file, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML error: ", e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": YAML error: ", e.what()));
  }
}

absl::Status CheckNoDuplicateKeys(const YAML::Node& root, const std::string& file) {
  // An alias shares its anchor's node, so a container is visited once (keyed by its position
  // and type): a document of nested aliases costs its size, not the size of its expansion. An
  // explicit stack keeps a deeply nested document off the call stack.
  std::set<std::pair<int, int>> visited;
  std::vector<YAML::Node> pending = {root};
  while (!pending.empty()) {
    const YAML::Node node = pending.back();
    pending.pop_back();
    if (!node.IsMap() && !node.IsSequence()) continue;
    if (!visited.emplace(node.Mark().pos, static_cast<int>(node.Type())).second) continue;
    if (node.IsSequence()) {
      for (const auto& item : node) pending.push_back(item);
      continue;
    }
    std::map<std::string, YAML::Node> keys;  // key text -> its first occurrence
    for (const auto& kv : node) {
      pending.push_back(kv.first);  // a complex key can hold maps too
      pending.push_back(kv.second);
      if (!kv.first.IsScalar()) continue;
      auto [first, inserted] = keys.emplace(kv.first.Scalar(), kv.first);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(file, kv.first), ": duplicate key '", Excerpt(kv.first), "' (first at ",
            Where(file, first->second), "): a key may appear only once in a map"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open configuration file ", path));
  std::string text;
  char buffer[8192];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxConfigBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": larger than the ", kMaxConfigBytes,
                                                     "-byte limit for configuration files"));
    }
  }
  return text;
}

namespace {
// Mark() throws on a node that stands for a missing key.
YAML::Mark MarkOf(const YAML::Node& node) {
  return node.IsDefined() ? node.Mark() : YAML::Mark::null_mark();
}
}  // namespace

std::string Where(const std::string& file, const YAML::Node& node) {
  YAML::Mark mark = MarkOf(node);
  if (mark.is_null()) return file;
  return absl::StrCat(file, ":", mark.line + 1, ":", mark.column + 1);
}

std::string WhereLine(const std::string& file, const YAML::Node& node) {
  // The base name keeps the report readable and the same on every host.
  size_t slash = file.find_last_of('/');
  std::string base = slash == std::string::npos ? file : file.substr(slash + 1);
  YAML::Mark mark = MarkOf(node);
  if (mark.is_null()) return base;
  return absl::StrCat(base, ":", mark.line + 1);
}

std::string Excerpt(const YAML::Node& node) {
  std::string text;
  try {
    if (!node.IsDefined()) {
      text.clear();
    } else if (node.IsScalar()) {
      text = node.Scalar();
    } else if (node.IsDefined() && !node.IsNull()) {
      YAML::Emitter out;
      out << YAML::Flow << node;
      text = out.c_str();
    }
  } catch (const std::exception&) {
    text = "?";
  }
  text = absl::StrReplaceAll(text, {{"\n", " "}, {"\r", " "}});
  if (text.size() > 60) text = absl::StrCat(text.substr(0, 57), "...");
  return text;
}

absl::Status ErrorAt(const std::string& file, const YAML::Node& node, const std::string& message) {
  std::string excerpt = Excerpt(node);
  if (excerpt.empty())
    return absl::InvalidArgumentError(absl::StrCat(Where(file, node), ": ", message));
  return absl::InvalidArgumentError(
      absl::StrCat(Where(file, node), ": ", message, " (at '", excerpt, "')"));
}

absl::StatusOr<std::string> ScalarAt(const std::string& file, const YAML::Node& node,
                                     const std::string& what) {
  if (!node.IsScalar()) {
    return ErrorAt(file, node,
                   absl::StrCat(what, " must be a single value, not a ",
                                node.IsMap()        ? "map"
                                : node.IsSequence() ? "list"
                                                    : "null"));
  }
  return node.Scalar();
}

}  // namespace adaptcomm::config

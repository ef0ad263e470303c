#include "lib/diag/knowledge_base.h"

#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/config/yaml_util.h"
#include "yaml-cpp/yaml.h"

namespace adaptcomm::diag {
namespace {

std::vector<std::string> StringList(const YAML::Node& node) {
  std::vector<std::string> out;
  if (!node) return out;
  if (node.IsScalar()) {
    out.push_back(node.as<std::string>());
  } else if (node.IsSequence()) {
    for (const auto& item : node) out.push_back(item.as<std::string>());
  }
  return out;
}

absl::StatusOr<KbEntry> ParseEntry(const YAML::Node& node, const std::string& where) {
  KbEntry e;
  for (const char* field : {"id", "pattern", "cause", "fix"}) {
    if (!node[field] || !node[field].IsScalar() || node[field].as<std::string>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing field '", field, "'"));
    }
  }
  e.id = node["id"].as<std::string>();
  e.pattern = node["pattern"].as<std::string>();
  e.cause = node["cause"].as<std::string>();
  e.fix = node["fix"].as<std::string>();
  e.doc = node["doc"] ? node["doc"].as<std::string>() : "";
  e.failure_class = node["class"] ? node["class"].as<std::string>() : "";
  e.source = node["source"] ? node["source"].as<std::string>() : "";
  const std::string kind = node["kind"] ? node["kind"].as<std::string>() : "root";
  if (kind != "root" && kind != "symptom") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", e.id, "): kind must be root or symptom, got '", kind, "'"));
  }
  e.root_cause = kind == "root";
  e.needles = StringList(node["needles"]);
  e.examples = StringList(node["examples"]);
  if (node["seq_group"]) e.seq_group = node["seq_group"].as<int>();
  try {
    e.regex = std::regex(e.pattern, std::regex::ECMAScript | std::regex::optimize);
  } catch (const std::regex_error& err) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", e.id, "): bad pattern '", e.pattern, "': ", err.what()));
  }
  if (e.seq_group < 0 || static_cast<size_t>(e.seq_group) > e.regex.mark_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", e.id, "): seq_group ", e.seq_group, " is not a capture group"));
  }
  return e;
}

}  // namespace

absl::StatusOr<KnowledgeBase> KnowledgeBase::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read knowledge base ", path));
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

absl::StatusOr<KnowledgeBase> KnowledgeBase::Parse(const std::string& yaml_text,
                                                   const std::string& name) {
  KnowledgeBase kb;
  // The shared parser: syntax errors with positions, duplicate keys refused.
  absl::StatusOr<YAML::Node> root = config::ParseYaml(yaml_text, name);
  if (!root.ok()) return root.status();
  try {
    YAML::Node entries = (*root)["entries"];
    if (!entries || !entries.IsSequence()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": no 'entries' list"));
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      const std::string where = absl::StrCat(name, ":", entries[i].Mark().line + 1);
      absl::StatusOr<KbEntry> e = ParseEntry(entries[i], where);
      if (!e.ok()) return e.status();
      kb.entries_.push_back(*std::move(e));
    }
  } catch (const YAML::Exception& err) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", err.what()));
  }
  return kb;
}

const KbEntry* KnowledgeBase::Classify(const std::string& line) const {
  for (const KbEntry& e : entries_) {
    bool candidate = e.needles.empty();
    for (const std::string& needle : e.needles) {
      if (line.find(needle) != std::string::npos) {
        candidate = true;
        break;
      }
    }
    if (candidate && std::regex_search(line, e.regex)) return &e;
  }
  return nullptr;
}

}  // namespace adaptcomm::diag

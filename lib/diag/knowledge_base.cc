#include "lib/diag/knowledge_base.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/config/yaml_util.h"
#include "lib/diag/kb_similarity.h"
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

// Includes nest at most this deep: a file that includes itself fails instead of recursing.
constexpr int kMaxIncludeDepth = 4;

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

absl::StatusOr<KbEntry> ParseEntry(const YAML::Node& node, const std::string& where,
                                   const std::string& default_family) {
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
  e.emitted_by = node["emitted_by"] ? node["emitted_by"].as<std::string>() : "";
  e.family = node["family"] ? node["family"].as<std::string>() : default_family;
  const std::string kind = node["kind"] ? node["kind"].as<std::string>() : "root";
  if (kind != "root" && kind != "symptom") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", e.id, "): kind must be root or symptom, got '", kind, "'"));
  }
  e.root_cause = kind == "root";
  e.needles = StringList(node["needles"]);
  e.examples = StringList(node["examples"]);
  if (node["seq_group"]) e.seq_group = node["seq_group"].as<int>();
  if (node["culprit_group"]) e.culprit_group = node["culprit_group"].as<int>();
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
  if (e.culprit_group < 0 || static_cast<size_t>(e.culprit_group) > e.regex.mark_count()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " (", e.id, "): culprit_group ",
                                                   e.culprit_group, " is not a capture group"));
  }
  return e;
}

// Appends the entries of one file (and of the files it includes, in place) to `out`.
absl::Status ParseEntries(const std::string& yaml_text, const std::string& name, int depth,
                          std::vector<KbEntry>& out, std::vector<KbFamily>* families) {
  // The shared parser: syntax errors with positions, duplicate keys refused.
  absl::StatusOr<YAML::Node> root = config::ParseYaml(yaml_text, name);
  if (!root.ok()) return root.status();
  try {
    if (families != nullptr && (*root)["families"]) {
      for (const YAML::Node& f : (*root)["families"]) {
        if (!f["id"] || !f["title"] || !f["summary"]) {
          return absl::InvalidArgumentError(
              absl::StrCat(name, ":", f.Mark().line + 1, ": a family needs id, title and summary"));
        }
        families->push_back(KbFamily{f["id"].as<std::string>(), f["title"].as<std::string>(),
                                     f["summary"].as<std::string>()});
      }
    }
    // An included file may name the family of all its entries once.
    const std::string default_family = (*root)["family"] ? (*root)["family"].as<std::string>() : "";
    YAML::Node entries = (*root)["entries"];
    if (!entries || !entries.IsSequence()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": no 'entries' list"));
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      const std::string where = absl::StrCat(name, ":", entries[i].Mark().line + 1);
      if (entries[i]["include"]) {
        if (depth >= kMaxIncludeDepth) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": includes nest deeper than ", kMaxIncludeDepth));
        }
        const std::string file = entries[i]["include"].as<std::string>();
        const std::string path = file.rfind('/', 0) == 0 ? file : DirectoryOf(name) + file;
        absl::StatusOr<std::string> text = config::ReadConfigFile(path);
        if (!text.ok()) {
          return absl::Status(text.status().code(),
                              absl::StrCat(where, ": include: ", text.status().message()));
        }
        if (absl::Status s = ParseEntries(*text, path, depth + 1, out, nullptr); !s.ok()) return s;
        continue;
      }
      absl::StatusOr<KbEntry> e = ParseEntry(entries[i], where, default_family);
      if (!e.ok()) return e.status();
      out.push_back(*std::move(e));
    }
  } catch (const YAML::Exception& err) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", err.what()));
  }
  return absl::OkStatus();
}

}  // namespace

KnowledgeBase::KnowledgeBase() : similarity_(std::make_unique<SimilarityIndex>(entries_)) {}
KnowledgeBase::KnowledgeBase(KnowledgeBase&&) noexcept = default;
KnowledgeBase& KnowledgeBase::operator=(KnowledgeBase&&) noexcept = default;
KnowledgeBase::~KnowledgeBase() = default;

const KbFamily* KnowledgeBase::Family(const std::string& id) const {
  for (const KbFamily& f : families_) {
    if (f.id == id) return &f;
  }
  return nullptr;
}

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
  if (absl::Status s = ParseEntries(yaml_text, name, 0, kb.entries_, &kb.families_); !s.ok()) {
    return s;
  }
  std::set<std::string> ids;
  for (const KbEntry& e : kb.entries_) {
    if (!ids.insert(e.id).second) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": duplicate entry id '", e.id, "'"));
    }
    // Without declared families (a small test base) any family goes; with them, a typo in one
    // would silently make a family of its own.
    if (!kb.families_.empty() && kb.Family(e.family) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": entry '", e.id, "' names undeclared family '", e.family, "'"));
    }
  }
  // After the last push_back: the index keeps pointers into entries_.
  kb.similarity_ = std::make_unique<SimilarityIndex>(kb.entries_);
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

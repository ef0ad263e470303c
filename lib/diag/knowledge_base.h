// The failure knowledge base (configs/knowledge_base.yaml): log line signature -> cause -> fix ->
// documentation link. `adaptcomm doctor` classifies each log line with the first entry whose
// pattern matches.
#ifndef ADAPTCOMM_LIB_DIAG_KNOWLEDGE_BASE_H_
#define ADAPTCOMM_LIB_DIAG_KNOWLEDGE_BASE_H_

#include <regex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace adaptcomm::diag {

struct KbEntry {
  std::string id;
  // A root cause explains an incident; a symptom (a watchdog timeout) is what other ranks see
  // of somebody else's root cause. Reports list root causes first.
  bool root_cause = true;
  // One of these literals must occur in the line before the regex runs (none listed: always
  // run it). Regexes are the slow part of reading a multi-GB log, and few lines hold a literal.
  std::vector<std::string> needles;
  std::string pattern;
  std::regex regex;
  std::string cause;
  std::string fix;
  std::string doc;
  std::string failure_class;  // the YAML's `class`: network, timeout, version, ... ("" if unset)
  std::string source;         // the public issue threads the signature comes from ("" if unset)
  std::vector<std::string> examples;  // lines the entry must classify (checked by the tests)
  // Capture group of `regex` holding a collective sequence number (0: none). The report names
  // the origin whose lowest sequence number is smallest: the rank that is behind.
  int seq_group = 0;
};

class KnowledgeBase {
 public:
  // InvalidArgument naming the entry for a bad regex or a missing field; NotFound for no file.
  static absl::StatusOr<KnowledgeBase> Load(const std::string& path);
  static absl::StatusOr<KnowledgeBase> Parse(const std::string& yaml_text, const std::string& name);

  // The first entry matching the line, nullptr if none does.
  const KbEntry* Classify(const std::string& line) const;
  const std::vector<KbEntry>& entries() const { return entries_; }

 private:
  std::vector<KbEntry> entries_;
};

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_KNOWLEDGE_BASE_H_

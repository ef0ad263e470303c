// The failure knowledge base (configs/knowledge_base.yaml and the per-family files it includes):
// log line signature -> family -> cause -> fix -> documentation link. `adaptcomm doctor`
// classifies each log line with the first entry whose pattern matches, and says which family an
// error line that no pattern matches resembles (kb_similarity.h).
#ifndef ADAPTCOMM_LIB_DIAG_KNOWLEDGE_BASE_H_
#define ADAPTCOMM_LIB_DIAG_KNOWLEDGE_BASE_H_

#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace adaptcomm::diag {

class SimilarityIndex;

// A family groups the signatures of one mechanism (the socket transport, NCCL's proxy thread,
// Gloo's monitored barrier, ...): a line that no signature matches can still be told to resemble
// one of them.
struct KbFamily {
  std::string id;
  std::string title;    // "NCCL proxy thread"
  std::string summary;  // what fails in this family, in one sentence
};

struct KbEntry {
  std::string id;
  std::string family;  // a KbFamily id ("" only in knowledge bases that declare no families)
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
  // The public source files that print the message ("NVIDIA/nccl src/proxy.cc"): the message
  // text is taken from there, so the pattern follows the library's own wording.
  std::string emitted_by;
  std::vector<std::string> examples;  // lines the entry must classify (checked by the tests)
  // Capture group of `regex` holding a collective sequence number (0: none). The report names
  // the origin whose lowest sequence number is smallest: the rank that is behind.
  int seq_group = 0;
  // Capture group of `regex` holding the rank(s) at fault that the line names ("1" or "1, 3":
  // Gloo's monitored barrier lists the ranks that never arrived), 0: none.
  int culprit_group = 0;
};

class KnowledgeBase {
 public:
  KnowledgeBase();
  KnowledgeBase(KnowledgeBase&&) noexcept;
  KnowledgeBase& operator=(KnowledgeBase&&) noexcept;
  KnowledgeBase(const KnowledgeBase&) = delete;
  KnowledgeBase& operator=(const KnowledgeBase&) = delete;
  ~KnowledgeBase();

  // InvalidArgument naming the entry for a bad regex, a missing field or an undeclared family;
  // NotFound for no file (the main one or an included one).
  static absl::StatusOr<KnowledgeBase> Load(const std::string& path);
  // `name` is the file's path: `- include: FILE` items of `entries` are read relative to its
  // directory, at their place in the list (first match wins, so the place matters).
  static absl::StatusOr<KnowledgeBase> Parse(const std::string& yaml_text, const std::string& name);

  // The first entry matching the line, nullptr if none does.
  const KbEntry* Classify(const std::string& line) const;
  const std::vector<KbEntry>& entries() const { return entries_; }
  const std::vector<KbFamily>& families() const { return families_; }
  const KbFamily* Family(const std::string& id) const;
  // Built from the entries' examples: what `Resembles` (kb_similarity.h) compares lines with.
  const SimilarityIndex& similarity() const { return *similarity_; }

 private:
  std::vector<KbEntry> entries_;
  std::vector<KbFamily> families_;
  std::unique_ptr<SimilarityIndex> similarity_;
};

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_KNOWLEDGE_BASE_H_

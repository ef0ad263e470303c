// Which knowledge-base family an error line resembles when no signature matches it. Libraries
// reword their messages between releases (NCCL's "message truncated" gained a peer and a hint;
// its proxy errors were renamed twice), so an exact pattern misses a new variant that still
// shares most of its distinctive words with the old one. The doctor then names the family as a
// likely cause instead of saying nothing.
//
// Lines are compared as sets of words: lower-cased, without numbers, addresses, host names with
// digits or common English words. Each word weighs by how rare it is across the entries (a word
// every entry uses, "failed", weighs little; "monitoredbarrier" weighs much), and a line's
// similarity to an example is the weight of the words both hold over the weight of the words
// either holds (weighted Jaccard). Words the knowledge base never uses weigh the most, so a line
// about something else entirely stays far from every example.
#ifndef ADAPTCOMM_LIB_DIAG_KB_SIMILARITY_H_
#define ADAPTCOMM_LIB_DIAG_KB_SIMILARITY_H_

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace adaptcomm::diag {

struct KbEntry;

// A line is said to resemble a family when its best example scores at least this and shares at
// least kMinSharedWords words with it. Chosen on the shipped knowledge base: rewordings of known
// messages score 0.43 and up, lines of other failures (Python errors, vLLM's loader, a torchrun
// summary) below 0.3.
inline constexpr double kResemblanceThreshold = 0.4;
inline constexpr size_t kMinSharedWords = 3;
// Only the first words of a line and of an example are compared (see SimilarityIndex).
inline constexpr size_t kMaxComparedWords = 14;

struct Resemblance {
  const KbEntry* entry = nullptr;   // the entry whose example is closest
  double score = 0;                 // weighted Jaccard, 0..1
  std::vector<std::string> shared;  // the words line and example share, rarest first
};

// The words a line is compared by (see the file comment), deduplicated, in order of appearance.
std::vector<std::string> SignatureWords(std::string_view line);

class SimilarityIndex {
 public:
  // Indexes every example of every entry; `entries` must outlive the index (pointers are kept).
  explicit SimilarityIndex(const std::vector<KbEntry>& entries);

  // The closest example's entry, whatever the score (nullptr entry if the line has no words).
  Resemblance Closest(std::string_view line) const;
  // Closest, if it passes kResemblanceThreshold and kMinSharedWords.
  std::optional<Resemblance> Resembles(std::string_view line) const;

 private:
  struct Example {
    const KbEntry* entry;
    std::vector<std::string> words;
    double weight;  // sum of the words' weights
  };
  double Weight(const std::string& word) const;

  std::unordered_map<std::string, double> idf_;
  double unseen_weight_ = 1;
  std::vector<Example> examples_;
};

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_KB_SIMILARITY_H_

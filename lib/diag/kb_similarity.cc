#include "lib/diag/kb_similarity.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "lib/diag/knowledge_base.h"

namespace adaptcomm::diag {
namespace {

bool IsStopWord(const std::string& w) {
  // Function words carry no signal about a failure; neither do the log framing words every NCCL
  // and PyTorch line has.
  static const auto* words = new std::set<std::string>{
      "the",   "and",   "for",   "with",   "from", "this",   "that",  "was",   "were", "are",
      "not",   "but",   "have",  "has",    "had",  "been",   "will",  "all",   "any",  "can",
      "you",   "your",  "its",   "into",   "than", "then",   "there", "their", "what", "when",
      "which", "while", "after", "before", "only", "please", "see",   "use",   "may",  "also",
      "our",   "out",   "more",  "info",   "warn", "nccl",   "some",  "other", "such", "one"};
  return words->count(w) > 0;
}

}  // namespace

std::vector<std::string> SignatureWords(std::string_view line) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && !std::isalnum(static_cast<unsigned char>(line[i])) &&
           line[i] != '_') {
      ++i;
    }
    const size_t start = i;
    bool digit = false;
    while (i < line.size() &&
           (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_')) {
      digit |= std::isdigit(static_cast<unsigned char>(line[i])) != 0;
      ++i;
    }
    // Numbers, hex, sizes, host names and device names with digits ("node3", "mlx5_0") differ
    // from run to run: they would make two reports of one failure look unrelated.
    if (digit || i - start < 3) continue;
    std::string w(line.substr(start, i - start));
    for (char& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    // "ranks"/"rank", "errors"/"error": plural and singular are one word here.
    if (w.size() > 4 && w.back() == 's' && w[w.size() - 2] != 's') w.pop_back();
    if (IsStopWord(w)) continue;
    if (seen.insert(w).second) out.push_back(std::move(w));
  }
  return out;
}

SimilarityIndex::SimilarityIndex(const std::vector<KbEntry>& entries) {
  std::unordered_map<std::string, size_t> df;  // entries whose examples or needles use the word
  for (const KbEntry& e : entries) {
    std::set<std::string> words;
    for (const std::string& example : e.examples) {
      std::vector<std::string> w = SignatureWords(example);
      words.insert(w.begin(), w.end());
      // The message's head is its signature; a long tail of advice (NCCL's "If you believe your
      // socket network is in healthy state, ...") would make a short variant look unrelated.
      if (w.size() > kMaxComparedWords) w.resize(kMaxComparedWords);
      examples_.push_back(Example{&e, std::move(w), 0});
    }
    for (const std::string& needle : e.needles) {
      for (std::string& w : SignatureWords(needle)) words.insert(std::move(w));
    }
    for (const std::string& w : words) ++df[w];
  }
  const double n = static_cast<double>(std::max<size_t>(entries.size(), 1));
  for (const auto& [word, count] : df) idf_[word] = std::log(1 + n / static_cast<double>(count));
  unseen_weight_ = std::log(1 + n);
  for (Example& ex : examples_) {
    for (const std::string& w : ex.words) ex.weight += Weight(w);
  }
}

double SimilarityIndex::Weight(const std::string& word) const {
  auto it = idf_.find(word);
  return it == idf_.end() ? unseen_weight_ : it->second;
}

Resemblance SimilarityIndex::Closest(std::string_view line) const {
  Resemblance best;
  std::vector<std::string> words = SignatureWords(line);
  if (words.size() > kMaxComparedWords) words.resize(kMaxComparedWords);
  if (words.empty()) return best;
  double line_weight = 0;
  for (const std::string& w : words) line_weight += Weight(w);
  const std::set<std::string> line_set(words.begin(), words.end());
  for (const Example& ex : examples_) {
    double shared = 0;
    std::vector<std::string> common;
    for (const std::string& w : ex.words) {
      if (line_set.count(w) > 0) {
        shared += Weight(w);
        common.push_back(w);
      }
    }
    const double union_weight = line_weight + ex.weight - shared;
    const double score = union_weight > 0 ? shared / union_weight : 0;
    if (score > best.score) {
      best.entry = ex.entry;
      best.score = score;
      best.shared = std::move(common);
    }
  }
  std::stable_sort(best.shared.begin(), best.shared.end(),
                   [this](const auto& a, const auto& b) { return Weight(a) > Weight(b); });
  return best;
}

std::optional<Resemblance> SimilarityIndex::Resembles(std::string_view line) const {
  Resemblance r = Closest(line);
  if (r.entry == nullptr || r.score < kResemblanceThreshold || r.shared.size() < kMinSharedWords) {
    return std::nullopt;
  }
  return r;
}

}  // namespace adaptcomm::diag

#include "lib/diag/log_doctor.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/diag/kb_similarity.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::diag {
namespace {

std::string Truncate(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n) + "...";
}

// Patterns built once: std::regex construction is far more expensive than matching.
const std::regex& AdaptcommRank() {
  static const auto* re = new std::regex(R"(\[adaptcomm r(\d+) )");
  return *re;
}
const std::regex& BracketRank() {
  static const auto* re = new std::regex(R"(\[[Rr]ank ?(\d+)\])");
  return *re;
}
const std::regex& NcclPrefix() {
  static const auto* re =
      new std::regex(R"((?:^|[\s\]:])([A-Za-z0-9_.\-]+):(\d+):(\d+) \[(\d+)\])");
  return *re;
}
const std::regex& WordRank() {
  static const auto* re = new std::regex(R"(\b[Rr]ank[ =:]?(\d+)\b)");
  return *re;
}
const std::regex& PeerAddress() {
  static const auto* re =
      new std::regex(R"((\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})(?:\]?:|<|, )(\d{1,5})\b)");
  return *re;
}

}  // namespace

std::string ExtractOrigin(const std::string& line) {
  std::smatch m;
  if (std::regex_search(line, m, AdaptcommRank())) return absl::StrCat("rank ", m[1].str());
  if (std::regex_search(line, m, BracketRank())) return absl::StrCat("rank ", m[1].str());
  if (std::regex_search(line, m, NcclPrefix())) {
    return absl::StrCat(m[1].str(), " gpu", m[4].str());
  }
  if (std::regex_search(line, m, WordRank())) return absl::StrCat("rank ", m[1].str());
  return "";
}

std::vector<std::string> ExtractPeers(const std::string& line) {
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(line.begin(), line.end(), PeerAddress());
       it != std::sregex_iterator(); ++it) {
    std::string peer = absl::StrCat((*it)[1].str(), ":", (*it)[2].str());
    if (std::find(out.begin(), out.end(), peer) == out.end()) out.push_back(std::move(peer));
  }
  return out;
}

std::vector<std::string> ExtractCulprits(const KbEntry& entry, const std::string& line) {
  std::vector<std::string> out;
  if (entry.culprit_group <= 0) return out;
  std::smatch m;
  if (!std::regex_search(line, m, entry.regex) || !m[entry.culprit_group].matched) return out;
  // The group holds one rank or a list ("1, 3"): every number in it is one.
  const std::string ranks = m[entry.culprit_group].str();
  static const auto* number = new std::regex(R"(\d+)");
  for (auto it = std::sregex_iterator(ranks.begin(), ranks.end(), *number);
       it != std::sregex_iterator(); ++it) {
    std::string rank = absl::StrCat("rank ", it->str());
    if (std::find(out.begin(), out.end(), rank) == out.end()) out.push_back(std::move(rank));
  }
  return out;
}

void LogDoctor::Count(std::map<std::string, uint64_t>& map, uint64_t& dropped, size_t cap,
                      const std::string& key) {
  auto it = map.find(key);
  if (it != map.end()) {
    ++it->second;
  } else if (map.size() < cap) {
    map.emplace(key, 1);
  } else {
    ++dropped;
  }
}

bool LooksLikeError(const std::string& line) {
  auto has = [&line](const char* text) { return line.find(text) != std::string::npos; };
  if (has("NCCL INFO") || has("frame #") || has("Exception raised from") ||
      (has("File \"") && has("\", line "))) {
    return false;
  }
  for (const char* marker : {"error", "Error", "ERROR", "failed", "Failed", "FAILED", "FATAL",
                             "Fatal", "Exception", "NCCL WARN", "Segmentation fault"}) {
    if (has(marker)) return true;
  }
  return false;
}

DoctorVerdict Verdict(const DoctorReport& report) {
  if (!report.causes.empty()) return DoctorVerdict::kKnownFailure;
  if (!report.resemblances.empty()) return DoctorVerdict::kResemblesKnownFamily;
  if (report.unclassified_errors > 0) return DoctorVerdict::kUnrecognizedErrors;
  return DoctorVerdict::kClean;
}

int DoctorExitCode(const DoctorReport& report) { return static_cast<int>(Verdict(report)); }

std::string VerdictName(DoctorVerdict verdict) {
  switch (verdict) {
    case DoctorVerdict::kClean:
      return "clean";
    case DoctorVerdict::kKnownFailure:
      return "known_failure";
    case DoctorVerdict::kUnrecognizedErrors:
      return "unrecognized_errors";
    case DoctorVerdict::kResemblesKnownFamily:
      return "resembles_known_family";
  }
  return "unknown";
}

void LogDoctor::CountUnclassified(DoctorReport& totals, const std::string& example, bool warning) {
  ++totals.unclassified_errors;
  if (warning) ++totals.unclassified_warnings;
  if (totals.unclassified_examples.size() < kMaxUnclassified) {
    totals.unclassified_examples.push_back(example);
  }
}

void LogDoctor::NoteResemblance(const std::string& line, const std::string& location) {
  std::vector<std::string> words = SignatureWords(line);
  if (words.size() > kMaxComparedWords) words.resize(kMaxComparedWords);
  const std::string key = absl::StrJoin(words, " ");
  std::optional<Resemblance> r;
  if (auto it = resemblance_cache_.find(key); it != resemblance_cache_.end()) {
    r = it->second;
  } else {
    r = kb_.similarity().Resembles(line);
    if (resemblance_cache_.size() < kMaxResemblanceCache) resemblance_cache_.emplace(key, r);
  }
  if (!r.has_value()) return;
  const std::string family = r->entry->family.empty() ? r->entry->id : r->entry->family;
  ResemblanceSummary& s = resemblances_[family];
  if (s.lines++ == 0) {
    s.family = family;
    const KbFamily* f = kb_.Family(family);
    s.family_title = f != nullptr ? f->title : "";
    s.first_example = Truncate(line, kMaxExampleBytes);
    s.first_location = location;
  }
  if (r->score > s.score) {
    s.score = r->score;
    s.closest = r->entry;
    s.shared = std::move(r->shared);
  }
}

void LogDoctor::FlushPendingTraceback() {
  if (pending_traceback_.empty()) return;
  CountUnclassified(totals_, pending_traceback_, /*warning=*/false);
  pending_traceback_.clear();
}

void LogDoctor::FeedLine(const std::string& full_line, const std::string& file,
                         uint64_t line_number) {
  ++totals_.lines;
  std::string head;
  if (full_line.size() > kMaxMatchBytes) head = full_line.substr(0, kMaxMatchBytes);
  const std::string& line = full_line.size() > kMaxMatchBytes ? head : full_line;
  const KbEntry* entry = kb_.Classify(line);
  if (entry == nullptr) {
    const bool traceback = line.find("Traceback (most recent call last)") != std::string::npos;
    if (!traceback && !LooksLikeError(line)) return;
    const std::string example =
        absl::StrCat(file, ":", line_number, ": ", Truncate(line, kMaxExampleBytes));
    if (traceback) {
      FlushPendingTraceback();  // the previous traceback ended without an error line
      pending_traceback_ = example;
    } else {
      pending_traceback_.clear();  // this line is the traceback's (counted) error
      CountUnclassified(totals_, example, line.find("NCCL WARN") != std::string::npos);
      NoteResemblance(line, absl::StrCat(file, ":", line_number));
    }
    return;
  }
  pending_traceback_.clear();  // the traceback (if any) ended in an explained line
  ++totals_.classified_lines;
  CauseSummary& c = causes_[entry];
  if (c.lines++ == 0) {
    c.entry = entry;
    c.first_example = Truncate(line, kMaxExampleBytes);
    c.first_location = absl::StrCat(file, ":", line_number);
    c.first_order = totals_.lines;
  }
  std::string origin = ExtractOrigin(line);
  if (origin.empty()) origin = "unknown";
  Count(c.origins, c.origins_dropped, kMaxOriginsPerCause, origin);
  for (const std::string& peer : ExtractPeers(line)) {
    Count(c.peers, c.peers_dropped, kMaxPeersPerCause, peer);
  }
  for (const std::string& culprit : ExtractCulprits(*entry, line)) {
    Count(c.culprits, c.culprits_dropped, kMaxOriginsPerCause, culprit);
  }
  if (entry->seq_group > 0 && origin != "unknown") {
    std::smatch m;
    if (std::regex_search(line, m, entry->regex) && m[entry->seq_group].matched) {
      const uint64_t seq = std::strtoull(m[entry->seq_group].str().c_str(), nullptr, 10);
      auto it = c.lowest_seq.find(origin);
      if (it != c.lowest_seq.end()) {
        it->second = std::min(it->second, seq);
      } else if (c.lowest_seq.size() < kMaxOriginsPerCause) {
        c.lowest_seq.emplace(origin, seq);
      }
    }
  }
}

void LogDoctor::FeedStream(std::istream& in, const std::string& name) {
  ++totals_.files;
  // A fixed read buffer and a line capped at kMaxLineBytes: a multi-GB log, or one without any
  // newline, costs the same memory as a small one.
  std::vector<char> buf(1 << 20);
  std::string line;
  bool truncated = false;
  uint64_t number = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const size_t got = static_cast<size_t>(in.gcount());
    size_t start = 0;
    for (size_t i = 0; i < got; ++i) {
      if (buf[i] != '\n') continue;
      const size_t room = kMaxLineBytes - line.size();
      if (i - start > room) truncated = true;
      line.append(buf.data() + start, std::min(i - start, room));
      if (!line.empty() && line.back() == '\r') line.pop_back();
      totals_.truncated_lines += truncated;
      FeedLine(line, name, ++number);
      line.clear();
      truncated = false;
      start = i + 1;
    }
    const size_t room = kMaxLineBytes - line.size();
    if (got - start > room) truncated = true;
    line.append(buf.data() + start, std::min(got - start, room));
  }
  if (!line.empty()) {
    totals_.truncated_lines += truncated;
    FeedLine(line, name, ++number);
  }
  FlushPendingTraceback();  // a traceback does not continue into the next file
}

absl::Status LogDoctor::FeedFile(const std::string& path) {
  if (path == "-") {
    FeedStream(std::cin, "<stdin>");
    return absl::OkStatus();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read log ", path));
  FeedStream(in, path);
  if (in.bad()) return absl::DataLossError(absl::StrCat("read error in ", path));
  return absl::OkStatus();
}

DoctorReport LogDoctor::Report() const {
  DoctorReport r = totals_;
  if (!pending_traceback_.empty()) CountUnclassified(r, pending_traceback_, /*warning=*/false);
  for (const auto& [entry, summary] : causes_) {
    CauseSummary c = summary;
    uint64_t lowest = UINT64_MAX;
    for (const auto& [origin, seq] : c.lowest_seq) {
      if (seq < lowest) {
        lowest = seq;
        c.behind_origin = origin;
      }
    }
    // Only meaningful when several origins disagree.
    if (c.lowest_seq.size() < 2) c.behind_origin.clear();
    r.causes.push_back(std::move(c));
  }
  std::stable_sort(r.causes.begin(), r.causes.end(), [](const auto& a, const auto& b) {
    if (a.entry->root_cause != b.entry->root_cause) return a.entry->root_cause;
    if (a.lines != b.lines) return a.lines > b.lines;
    return a.first_order < b.first_order;  // ties: the earliest cause first
  });
  for (const auto& [family, summary] : resemblances_) r.resemblances.push_back(summary);
  std::stable_sort(r.resemblances.begin(), r.resemblances.end(),
                   [](const auto& a, const auto& b) { return a.lines > b.lines; });
  return r;
}

namespace {

std::string JoinCounts(const std::map<std::string, uint64_t>& m, uint64_t dropped, size_t limit) {
  std::vector<std::pair<std::string, uint64_t>> v(m.begin(), m.end());
  std::stable_sort(v.begin(), v.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (size_t i = 0; i < v.size() && i < limit; ++i) {
    absl::StrAppend(&out, i ? ", " : "", v[i].first, " (", v[i].second, ")");
  }
  if (v.size() > limit) absl::StrAppend(&out, ", +", v.size() - limit, " more");
  if (dropped > 0) absl::StrAppend(&out, ", +", dropped, " lines from further origins");
  return out;
}

}  // namespace

std::string RenderDoctorText(const DoctorReport& report, size_t max_causes) {
  std::string out = absl::StrFormat("Read %d line(s) from %d file(s): %d classified", report.lines,
                                    report.files, report.classified_lines);
  if (report.truncated_lines > 0) {
    absl::StrAppend(&out, ", ", report.truncated_lines, " over ", kMaxLineBytes,
                    " bytes truncated");
  }
  absl::StrAppend(&out, ".\n");
  if (report.causes.empty()) {
    if (!report.resemblances.empty()) {
      absl::StrAppend(&out,
                      "No known failure signature found, but error lines resemble a known family "
                      "(below): a likely cause, to confirm by reading them.\n");
    } else if (report.unclassified_errors > 0) {
      absl::StrAppend(&out,
                      "No known failure signature found, but the log reports errors (below): an "
                      "unknown failure.\n");
    } else {
      absl::StrAppend(&out, "No known failure signature found.\n");
    }
  }
  size_t n = 0;
  for (const CauseSummary& c : report.causes) {
    if (n++ == max_causes) {
      absl::StrAppend(&out, "\n(", report.causes.size() - max_causes, " more cause(s) omitted)\n");
      break;
    }
    std::string tags = c.entry->family;
    if (!c.entry->failure_class.empty()) {
      absl::StrAppend(&tags, tags.empty() ? "" : ", ", c.entry->failure_class);
    }
    absl::StrAppend(&out, "\n", n, ". [", c.entry->root_cause ? "root cause" : "symptom", "] ",
                    c.entry->id, tags.empty() ? "" : absl::StrCat(" (", tags, ")"), ": ", c.lines,
                    " line(s), first at ", c.first_location, "\n");
    absl::StrAppend(&out, "   cause:   ", c.entry->cause, "\n");
    absl::StrAppend(&out, "   from:    ", JoinCounts(c.origins, c.origins_dropped, 8), "\n");
    if (!c.culprits.empty()) {
      absl::StrAppend(&out, "   culprit: ", JoinCounts(c.culprits, c.culprits_dropped, 8), "\n");
    }
    if (!c.peers.empty()) {
      absl::StrAppend(&out, "   peers:   ", JoinCounts(c.peers, c.peers_dropped, 8), "\n");
    }
    if (!c.behind_origin.empty()) {
      absl::StrAppend(&out, "   behind:  ", c.behind_origin, " (lowest sequence number ",
                      c.lowest_seq.at(c.behind_origin), ")\n");
    }
    absl::StrAppend(&out, "   example: ", c.first_example, "\n");
    absl::StrAppend(&out, "   fix:     ", c.entry->fix, "\n");
    if (!c.entry->doc.empty()) absl::StrAppend(&out, "   doc:     ", c.entry->doc, "\n");
    if (!c.entry->source.empty()) absl::StrAppend(&out, "   source:  ", c.entry->source, "\n");
    if (!c.entry->emitted_by.empty()) {
      absl::StrAppend(&out, "   emitted: ", c.entry->emitted_by, "\n");
    }
  }
  if (!report.resemblances.empty()) {
    absl::StrAppend(&out,
                    "\nResembles (no signature matched these error lines; the closest known "
                    "family by shared words, a likely cause):\n");
    for (const ResemblanceSummary& s : report.resemblances) {
      absl::StrAppend(&out, "  - ", s.family,
                      s.family_title.empty() ? "" : absl::StrCat(" (", s.family_title, ")"), ": ",
                      s.lines, " line(s), first at ", s.first_location, "; closest ", s.closest->id,
                      absl::StrFormat(" (similarity %.2f, shared: ", s.score),
                      absl::StrJoin(s.shared, " "), ")\n");
      absl::StrAppend(&out, "    line:    ", s.first_example, "\n");
      absl::StrAppend(&out, "    cause:   ", s.closest->cause, "\n");
      absl::StrAppend(&out, "    fix:     ", s.closest->fix, "\n");
    }
  }
  if (report.unclassified_errors > 0) {
    absl::StrAppend(&out, "\n", report.unclassified_errors,
                    " error line(s) matched no known signature");
    if (report.unclassified_warnings > 0) {
      absl::StrAppend(&out, " (", report.unclassified_warnings, " of them NCCL WARN)");
    }
    absl::StrAppend(&out, "; first: ", report.unclassified_examples.front(), "\n");
    for (size_t i = 1; i < report.unclassified_examples.size(); ++i) {
      absl::StrAppend(&out, "  then: ", report.unclassified_examples[i], "\n");
    }
  }
  return out;
}

std::string RenderDoctorJson(const DoctorReport& report) {
  nlohmann::json j;
  j["verdict"] = VerdictName(Verdict(report));
  j["exit_code"] = DoctorExitCode(report);
  j["files"] = report.files;
  j["lines"] = report.lines;
  j["classified_lines"] = report.classified_lines;
  j["truncated_lines"] = report.truncated_lines;
  j["causes"] = nlohmann::json::array();
  for (const CauseSummary& c : report.causes) {
    nlohmann::json cj;
    cj["id"] = c.entry->id;
    cj["kind"] = c.entry->root_cause ? "root" : "symptom";
    cj["class"] = c.entry->failure_class;
    cj["family"] = c.entry->family;
    cj["emitted_by"] = c.entry->emitted_by;
    cj["source"] = c.entry->source;
    cj["lines"] = c.lines;
    cj["cause"] = c.entry->cause;
    cj["fix"] = c.entry->fix;
    cj["doc"] = c.entry->doc;
    cj["origins"] = c.origins;
    cj["origins_dropped"] = c.origins_dropped;
    cj["peers"] = c.peers;
    cj["peers_dropped"] = c.peers_dropped;
    cj["culprits"] = c.culprits;
    cj["culprits_dropped"] = c.culprits_dropped;
    cj["first_location"] = c.first_location;
    cj["first_example"] = c.first_example;
    if (!c.behind_origin.empty()) {
      cj["behind"] = {{"origin", c.behind_origin}, {"seq", c.lowest_seq.at(c.behind_origin)}};
    }
    j["causes"].push_back(std::move(cj));
  }
  j["unclassified_errors"] = report.unclassified_errors;
  j["unclassified_warnings"] = report.unclassified_warnings;
  j["unclassified_examples"] = report.unclassified_examples;
  j["resembles"] = nlohmann::json::array();
  for (const ResemblanceSummary& s : report.resemblances) {
    j["resembles"].push_back({{"family", s.family},
                              {"family_title", s.family_title},
                              {"closest", s.closest->id},
                              {"similarity", s.score},
                              {"shared", s.shared},
                              {"lines", s.lines},
                              {"first_location", s.first_location},
                              {"first_example", s.first_example},
                              {"cause", s.closest->cause},
                              {"fix", s.closest->fix}});
  }
  // Logs are not guaranteed UTF-8: replace invalid bytes instead of throwing.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace adaptcomm::diag

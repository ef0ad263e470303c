#include "lib/trace/culprit.h"

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::trace {
namespace {

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","));
}

struct Dump {
  RankPosition position;
  std::string job;
  int64_t dumped_at = 0;
  int world_size = 0;
};

absl::StatusOr<Dump> ReadDump(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("rank") || !doc.contains("entries")) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a flight-recorder dump"));
  }
  Dump d;
  d.job = doc.value("job", "");
  d.dumped_at = doc.value("dumped_at_us", int64_t{0});
  d.world_size = doc.value("world_size", 0);
  RankPosition& p = d.position;
  p.rank = doc.value("rank", -1);
  p.last_completed_seq = doc.value("last_completed_seq", uint64_t{0});
  p.last_enqueued_seq = doc.value("last_enqueued_seq", uint64_t{0});
  p.reason = doc.value("reason", "");
  for (const auto& e : doc["entries"]) {
    uint64_t seq = e.value("seq", uint64_t{0});
    std::string state = e.value("state", "");
    if (seq > p.last_completed_seq && state != "done") {
      p.stuck_seq = seq;
      p.stuck_op = e.value("op", "");
      p.stuck_state = state;
      p.stuck_error = e.value("error", "");
      p.stuck_start_us = e.value("start_us", int64_t{0});
      break;
    }
  }
  return d;
}

std::string Verdict(const CulpritReport& r) {
  if (!r.missing.empty()) {
    std::set<std::string> stuck_in;
    for (const auto& p : r.ranks) {
      if (p.stuck_seq != 0) stuck_in.insert(absl::StrCat(p.stuck_op, " #", p.stuck_seq));
    }
    return absl::StrCat(
        Ranks(r.missing), " left no dump (killed, or hung beyond reach); ",
        stuck_in.empty() ? std::string("the others are idle")
                         : absl::StrCat("the others stopped in ", absl::StrJoin(stuck_in, ", ")));
  }
  // Ranks disagreeing on what op a seq is: mismatched collectives.
  std::map<uint64_t, std::map<std::string, std::vector<int>>> ops_by_seq;
  for (const auto& p : r.ranks) {
    if (p.stuck_seq != 0) ops_by_seq[p.stuck_seq][p.stuck_op].push_back(p.rank);
  }
  for (const auto& [seq, ops] : ops_by_seq) {
    if (ops.size() > 1) {
      std::vector<std::string> parts;
      for (const auto& [op, ranks] : ops) parts.push_back(absl::StrCat(Ranks(ranks), " in ", op));
      return absl::StrCat("mismatched collectives at #", seq, ": ", absl::StrJoin(parts, "; "));
    }
  }
  // The frontier: the op most ranks are stuck in; ranks that never queued it are behind.
  uint64_t frontier = 0;
  std::string frontier_op;
  for (const auto& p : r.ranks) {
    if (p.stuck_seq > frontier) {
      frontier = p.stuck_seq;
      frontier_op = p.stuck_op;
    }
  }
  if (frontier == 0) return "no rank is inside an operation: every rank completed all it queued";
  std::vector<int> behind, waiting;
  for (const auto& p : r.ranks) (p.stuck_seq == frontier ? waiting : behind).push_back(p.rank);
  if (behind.empty()) {
    // Everyone queued it. Ranks that never started it while others did were stalled before it
    // (a stopped process, a thread that never came back to the library).
    std::vector<int> never_started, started;
    for (const auto& p : r.ranks)
      (p.stuck_start_us == 0 ? never_started : started).push_back(p.rank);
    if (!never_started.empty() && !started.empty()) {
      return absl::StrCat(Ranks(never_started), " queued ", frontier_op, " #", frontier,
                          " but never started it (stalled before it); ", Ranks(started),
                          started.size() == 1 ? " was" : " were", " already running it");
    }
    // Everyone got there; the one that got there last (by a clear margin) is still the suspect.
    const RankPosition* first = nullptr;
    const RankPosition* last = nullptr;
    for (const auto& p : r.ranks) {
      if (p.stuck_start_us == 0) continue;
      if (first == nullptr || p.stuck_start_us < first->stuck_start_us) first = &p;
      if (last == nullptr || p.stuck_start_us > last->stuck_start_us) last = &p;
    }
    constexpr int64_t kClearMarginUs = 500000;  // clocks of one host agree far better than this
    if (first != nullptr && last->stuck_start_us - first->stuck_start_us > kClearMarginUs) {
      return absl::StrFormat(
          "all ranks reached %s #%d, but rank %d entered it %.1f s after rank %d: rank %d was "
          "late (stalled or slow), the others timed out waiting",
          frontier_op, frontier, last->rank, (last->stuck_start_us - first->stuck_start_us) / 1e6,
          first->rank, last->rank);
    }
    return absl::StrCat("all ranks are in ", frontier_op, " #", frontier,
                        ": none is behind (a transport or peer failure, see the errors)");
  }
  std::vector<std::string> where;
  for (int b : behind) {
    const RankPosition& p = *std::find_if(r.ranks.begin(), r.ranks.end(),
                                          [b](const RankPosition& q) { return q.rank == b; });
    where.push_back(p.stuck_seq != 0
                        ? absl::StrCat("rank ", b, " is still in ", p.stuck_op, " #", p.stuck_seq)
                        : absl::StrCat("rank ", b, " last completed #", p.last_completed_seq));
  }
  return absl::StrCat(Ranks(behind), behind.size() == 1 ? " never entered " : " never entered ",
                      frontier_op, " #", frontier, " (", absl::StrJoin(where, "; "), "); ",
                      waiting.size() + behind.size() == static_cast<size_t>(r.world_size)
                          ? "all others are waiting in it"
                          : absl::StrCat(Ranks(waiting), " are waiting in it"));
}

}  // namespace

absl::StatusOr<CulpritReport> AnalyzeFlightDumps(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("cannot open directory ", dir));
  std::vector<std::string> files;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (absl::StartsWith(name, "flight.rank") && absl::EndsWith(name, ".json")) {
      files.push_back(absl::StrCat(dir, "/", name));
    }
  }
  closedir(d);
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("no flight.rank*.json dumps in ", dir));
  }
  std::vector<Dump> dumps;
  for (const auto& f : files) {
    absl::StatusOr<Dump> d = ReadDump(f);
    if (!d.ok()) return d.status();
    dumps.push_back(*std::move(d));
  }
  // A directory shared by several runs: analyse the run of the newest dump only.
  const Dump& newest =
      *std::max_element(dumps.begin(), dumps.end(),
                        [](const Dump& a, const Dump& b) { return a.dumped_at < b.dumped_at; });
  CulpritReport report;
  report.job = newest.job;
  for (const Dump& d : dumps) {
    if (d.job != report.job) {
      ++report.stale_dumps;
      continue;
    }
    report.world_size = std::max(report.world_size, d.world_size);
    report.ranks.push_back(d.position);
  }
  std::sort(report.ranks.begin(), report.ranks.end(),
            [](const RankPosition& a, const RankPosition& b) { return a.rank < b.rank; });
  std::set<int> present;
  std::map<uint64_t, std::vector<int>> groups;
  for (const auto& p : report.ranks) {
    present.insert(p.rank);
    groups[p.last_completed_seq].push_back(p.rank);
  }
  for (int r = 0; r < report.world_size; ++r) {
    if (present.count(r) == 0) report.missing.push_back(r);
  }
  report.groups.assign(groups.begin(), groups.end());
  report.verdict = Verdict(report);
  return report;
}

std::string CulpritReport::ToText() const {
  std::string out =
      absl::StrCat("world size ", world_size, ", dumps from ", ranks.size(), " rank(s)\n");
  for (const auto& [seq, rs] : groups) {
    absl::StrAppend(&out, "  last completed #", seq, ": ", Ranks(rs), "\n");
  }
  for (const auto& p : ranks) {
    absl::StrAppend(&out, "  rank ", p.rank, ": ",
                    p.stuck_seq ? absl::StrCat(p.stuck_state, " in ", p.stuck_op, " #", p.stuck_seq)
                                : std::string("idle"),
                    p.stuck_error.empty() ? "" : absl::StrCat(" (", p.stuck_error, ")"), "\n");
  }
  if (!missing.empty()) absl::StrAppend(&out, "  no dump: ", Ranks(missing), "\n");
  absl::StrAppend(&out, "verdict: ", verdict, "\n");
  return out;
}

std::string CulpritReport::ToJson() const {
  nlohmann::json doc;
  doc["world_size"] = world_size;
  doc["job"] = job;
  doc["stale_dumps"] = stale_dumps;
  doc["missing"] = missing;
  doc["verdict"] = verdict;
  nlohmann::json g = nlohmann::json::array();
  for (const auto& [seq, rs] : groups) g.push_back({{"last_completed_seq", seq}, {"ranks", rs}});
  doc["groups"] = g;
  nlohmann::json rs = nlohmann::json::array();
  for (const auto& p : ranks) {
    rs.push_back({{"rank", p.rank},
                  {"last_completed_seq", p.last_completed_seq},
                  {"stuck_seq", p.stuck_seq},
                  {"stuck_op", p.stuck_op},
                  {"stuck_state", p.stuck_state},
                  {"stuck_error", p.stuck_error},
                  {"reason", p.reason}});
  }
  doc["ranks"] = rs;
  return doc.dump(2);
}

}  // namespace adaptcomm::trace

#include "lib/diag/trace_merge.h"

#include <dirent.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace adaptcomm::diag {

absl::StatusOr<std::vector<std::string>> ListRankTraces(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("cannot open trace directory ", dir));
  static const std::regex kName(R"(trace\.rank(\d+)\.json)");
  std::vector<std::pair<int, std::string>> found;
  while (dirent* e = readdir(d)) {
    std::cmatch m;
    if (std::regex_match(e->d_name, m, kName)) {
      found.emplace_back(std::atoi(m[1].str().c_str()), absl::StrCat(dir, "/", e->d_name));
    }
  }
  closedir(d);
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat("no trace.rank<R>.json files in ", dir,
                                            " (enable tracing in the profile or environment)"));
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

absl::StatusOr<nlohmann::json> MergeTraces(const std::vector<std::string>& rank_files) {
  nlohmann::json merged;
  merged["traceEvents"] = nlohmann::json::array();
  merged["displayTimeUnit"] = "ms";
  nlohmann::json offsets = nlohmann::json::object();
  nlohmann::json ranks = nlohmann::json::array();
  int world = 0;
  for (const std::string& file : rank_files) {
    std::ifstream in(file);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", file));
    nlohmann::json t = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (t.is_discarded() || !t.is_object() || !t.contains("traceEvents") ||
        !t["traceEvents"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": not a Chrome trace (traceEvents)"));
    }
    const nlohmann::json other = t.value("otherData", nlohmann::json::object());
    if (!other.contains("rank") || !other["rank"].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": otherData.rank missing"));
    }
    const int rank = other["rank"].get<int>();
    const double offset = other.value("clock_offset_us", 0.0);
    world = std::max(world, other.value("world_size", rank + 1));
    offsets[std::to_string(rank)] = offset;
    ranks.push_back(rank);
    merged["traceEvents"].push_back({{"name", "process_name"},
                                     {"ph", "M"},
                                     {"pid", rank},
                                     {"tid", 0},
                                     {"args", {{"name", absl::StrCat("rank ", rank)}}}});
    merged["traceEvents"].push_back({{"name", "process_sort_index"},
                                     {"ph", "M"},
                                     {"pid", rank},
                                     {"tid", 0},
                                     {"args", {{"sort_index", rank}}}});
    for (nlohmann::json& e : t["traceEvents"]) {
      if (!e.is_object()) continue;
      if (e.contains("ts") && e["ts"].is_number()) e["ts"] = e["ts"].get<double>() - offset;
      if (e.contains("args") && e["args"].is_object() && e["args"].contains("enqueue_ts") &&
          e["args"]["enqueue_ts"].is_number()) {
        e["args"]["enqueue_ts"] = e["args"]["enqueue_ts"].get<double>() - offset;
      }
      e["pid"] = rank;  // the file's rank wins over whatever pid a writer used
      merged["traceEvents"].push_back(std::move(e));
    }
  }
  merged["otherData"] = {{"world_size", world},
                         {"ranks", ranks},
                         {"clock_offsets_us", offsets},
                         {"merged_from", rank_files.size()}};
  return merged;
}

}  // namespace adaptcomm::diag

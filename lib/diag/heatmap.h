// `adaptcomm trace heatmap`: arrival lateness of each rank at each collective (by sequence
// number) from a merged trace, a straggler ranking, and a self-contained SVG/HTML heatmap.
#ifndef ADAPTCOMM_LIB_DIAG_HEATMAP_H_
#define ADAPTCOMM_LIB_DIAG_HEATMAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::diag {

struct RankLateness {
  int rank = 0;
  double mean_us = 0, p50_us = 0, p95_us = 0, max_us = 0;
  int missing = 0;  // collectives this rank has no event for (it never started them)
};

struct LatenessTable {
  std::vector<int> ranks;        // ascending
  std::vector<int64_t> seqs;     // ascending
  std::vector<std::string> ops;  // name of each seq's op ("allreduce")
  // late_us[rank index][seq index]: start minus the earliest start of that seq; -1 if missing.
  std::vector<std::vector<double>> late_us;
  double max_us = 0;
  // Stragglers first: by mean lateness, then p95.
  std::vector<RankLateness> ranking;
};

// From a merged trace (MergeTraces). Collective events are ph "X" with args.seq.
// InvalidArgument if there are none.
absl::StatusOr<LatenessTable> ComputeLateness(const nlohmann::json& merged);

// Colour of a lateness fraction in [0, 1] (0: on time, 1: the latest arrival of the trace), and
// its level 0..255 (what the SVG's data-level attribute carries).
std::string HeatColour(double fraction);
int HeatLevel(double fraction);

// A self-contained SVG: ranks as rows, collectives as columns (more than `max_columns` are
// folded into buckets showing each bucket's maximum), the colour scale, and the ranking.
std::string RenderHeatmapSvg(const LatenessTable& table, size_t max_columns = 600);
// The SVG inside an HTML page with the ranking as a table.
std::string RenderHeatmapHtml(const LatenessTable& table, const std::string& svg);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_HEATMAP_H_

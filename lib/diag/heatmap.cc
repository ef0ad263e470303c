#include "lib/diag/heatmap.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace adaptcomm::diag {
namespace {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}

std::string Ms(double us) { return absl::StrFormat("%.2f ms", us / 1000.0); }

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<LatenessTable> ComputeLateness(const nlohmann::json& merged) {
  if (!merged.contains("traceEvents") || !merged["traceEvents"].is_array()) {
    return absl::InvalidArgumentError("not a trace: no traceEvents");
  }
  // seq -> rank -> earliest start (a rank may record an op once; keep the first if repeated).
  std::map<int64_t, std::map<int, double>> starts;
  std::map<int64_t, std::string> names;
  std::map<int, bool> ranks;
  for (const auto& e : merged["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "X" || !e.contains("args") ||
        !e["args"].is_object() || !e["args"].contains("seq") || !e.contains("ts") ||
        !e["ts"].is_number() || !e.contains("pid") || !e["pid"].is_number_integer()) {
      continue;
    }
    const int rank = e["pid"].get<int>();
    const int64_t seq = e["args"]["seq"].get<int64_t>();
    const double ts = e["ts"].get<double>();
    ranks[rank] = true;
    auto [it, inserted] = starts[seq].emplace(rank, ts);
    if (!inserted) it->second = std::min(it->second, ts);
    names.emplace(seq, e.value("name", "op"));
  }
  if (starts.empty()) {
    return absl::InvalidArgumentError("the trace holds no collective events (ph X with args.seq)");
  }
  LatenessTable t;
  for (const auto& [r, unused] : ranks) t.ranks.push_back(r);
  for (const auto& [s, unused] : starts) {
    t.seqs.push_back(s);
    t.ops.push_back(names[s]);
  }
  t.late_us.assign(t.ranks.size(), std::vector<double>(t.seqs.size(), -1));
  std::vector<std::vector<double>> per_rank(t.ranks.size());
  std::vector<int> missing(t.ranks.size(), 0);
  for (size_t j = 0; j < t.seqs.size(); ++j) {
    const auto& by_rank = starts[t.seqs[j]];
    double first = by_rank.begin()->second;
    for (const auto& [r, ts] : by_rank) first = std::min(first, ts);
    for (size_t i = 0; i < t.ranks.size(); ++i) {
      auto it = by_rank.find(t.ranks[i]);
      if (it == by_rank.end()) {
        ++missing[i];
        continue;
      }
      const double late = it->second - first;
      t.late_us[i][j] = late;
      t.max_us = std::max(t.max_us, late);
      per_rank[i].push_back(late);
    }
  }
  for (size_t i = 0; i < t.ranks.size(); ++i) {
    RankLateness rl;
    rl.rank = t.ranks[i];
    rl.missing = missing[i];
    double sum = 0;
    for (double v : per_rank[i]) sum += v;
    rl.mean_us = per_rank[i].empty() ? 0 : sum / static_cast<double>(per_rank[i].size());
    rl.p50_us = Percentile(per_rank[i], 0.5);
    rl.p95_us = Percentile(per_rank[i], 0.95);
    rl.max_us = per_rank[i].empty() ? 0 : *std::max_element(per_rank[i].begin(), per_rank[i].end());
    t.ranking.push_back(rl);
  }
  // A rank that never started some collectives is the worst straggler of all.
  std::stable_sort(t.ranking.begin(), t.ranking.end(), [](const auto& a, const auto& b) {
    if (a.missing != b.missing) return a.missing > b.missing;
    if (a.mean_us != b.mean_us) return a.mean_us > b.mean_us;
    return a.p95_us > b.p95_us;
  });
  return t;
}

int HeatLevel(double fraction) {
  return static_cast<int>(std::lround(std::clamp(fraction, 0.0, 1.0) * 255));
}

// Pale yellow (on time) through orange to dark red (latest): a sequential scale that stays
// readable in grey and for red-green colour blindness.
std::string HeatColour(double fraction) {
  const double f = HeatLevel(fraction) / 255.0;
  struct Stop {
    double at, r, g, b;
  };
  static constexpr Stop kStops[] = {
      {0.0, 255, 255, 204}, {0.35, 254, 178, 76}, {0.7, 240, 59, 32}, {1.0, 128, 0, 38}};
  size_t k = 0;
  while (k + 2 < std::size(kStops) && f > kStops[k + 1].at) ++k;
  const Stop& a = kStops[k];
  const Stop& b = kStops[k + 1];
  const double u = (f - a.at) / (b.at - a.at);
  auto mix = [&](double x, double y) { return static_cast<int>(std::lround(x + (y - x) * u)); };
  return absl::StrFormat("#%02x%02x%02x", mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b));
}

std::string RenderHeatmapSvg(const LatenessTable& t, size_t max_columns) {
  const size_t n_seq = t.seqs.size();
  const size_t bucket =
      std::max<size_t>(1, (n_seq + max_columns - 1) / std::max<size_t>(1, max_columns));
  const size_t cols = (n_seq + bucket - 1) / bucket;
  const double cell_w =
      std::clamp(900.0 / static_cast<double>(std::max<size_t>(cols, 1)), 2.0, 24.0);
  const double cell_h = std::clamp(600.0 / static_cast<double>(t.ranks.size()), 6.0, 24.0);
  const double left = 70, top = 50;
  const double grid_w = cell_w * static_cast<double>(cols);
  const double grid_h = cell_h * static_cast<double>(t.ranks.size());
  const double side = left + grid_w + 30;
  const size_t listed = std::min<size_t>(t.ranking.size(), 20);
  const double width = side + 360;
  const double height =
      std::max(top + grid_h + 80, top + 40 + 18.0 * static_cast<double>(listed) + 20);

  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
      width, height, width, height);
  absl::StrAppend(&s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  absl::StrAppend(
      &s,
      absl::StrFormat("<text x=\"%.0f\" y=\"22\" font-size=\"15\" font-weight=\"bold\">"
                      "Arrival lateness per collective (ranks x ops, %zu ops%s)</text>\n",
                      left, n_seq, bucket > 1 ? absl::StrFormat(", max of each %zu", bucket) : ""));
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%.0f\" y=\"40\" fill=\"#555\">seq %d .. %d; "
                                      "colour: start minus the first rank's start</text>\n",
                                      left, t.seqs.front(), t.seqs.back()));
  for (size_t i = 0; i < t.ranks.size(); ++i) {
    const double y = top + cell_h * static_cast<double>(i);
    if (cell_h >= 9 || i % 5 == 0) {
      absl::StrAppend(&s, absl::StrFormat("<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" "
                                          "dominant-baseline=\"middle\">rank %d</text>\n",
                                          left - 6, y + cell_h / 2, t.ranks[i]));
    }
    for (size_t c = 0; c < cols; ++c) {
      double v = -1;
      int64_t seq = t.seqs[c * bucket];
      for (size_t j = c * bucket; j < std::min(n_seq, (c + 1) * bucket); ++j) {
        if (t.late_us[i][j] > v) {
          v = t.late_us[i][j];
          seq = t.seqs[j];
        }
      }
      const double x = left + cell_w * static_cast<double>(c);
      if (v < 0) {
        absl::StrAppend(
            &s, absl::StrFormat("<rect class=\"cell\" data-rank=\"%d\" data-seq=\"%d\" "
                                "data-level=\"-1\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                                "height=\"%.1f\" fill=\"#888\"><title>rank %d seq %d: never "
                                "started</title></rect>\n",
                                t.ranks[i], seq, x, y, cell_w, cell_h, t.ranks[i], seq));
        continue;
      }
      const double f = t.max_us > 0 ? v / t.max_us : 0;
      absl::StrAppend(
          &s, absl::StrFormat("<rect class=\"cell\" data-rank=\"%d\" data-seq=\"%d\" "
                              "data-level=\"%d\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                              "height=\"%.1f\" fill=\"%s\"><title>rank %d seq %d: %s late"
                              "</title></rect>\n",
                              t.ranks[i], seq, HeatLevel(f), x, y, cell_w, cell_h, HeatColour(f),
                              t.ranks[i], seq, Ms(v)));
    }
  }
  // Colour scale under the grid.
  const double ly = top + grid_h + 20;
  for (int k = 0; k < 50; ++k) {
    absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.1f\" y=\"%.0f\" width=\"4.2\" height=\"12\" "
                                        "fill=\"%s\"/>\n",
                                        left + 4.0 * k, ly, HeatColour(k / 49.0)));
  }
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%.0f\" y=\"%.0f\">0 ms</text>\n", left, ly + 28));
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%s</text>\n",
                                      left + 200, ly + 28, Ms(t.max_us)));
  // Straggler ranking beside the grid.
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%.0f\" y=\"%.0f\" font-weight=\"bold\">Stragglers"
                                      " (mean / p95 / max lateness)</text>\n",
                                      side, top + 4));
  for (size_t k = 0; k < listed; ++k) {
    const RankLateness& r = t.ranking[k];
    const double f = t.max_us > 0 ? r.mean_us / t.max_us : 0;
    const double y = top + 22 + 18.0 * static_cast<double>(k);
    absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" "
                                        "fill=\"%s\" stroke=\"#999\"/>\n",
                                        side, y - 10, HeatColour(f)));
    absl::StrAppend(
        &s, absl::StrFormat("<text class=\"rank-row\" data-rank=\"%d\" x=\"%.0f\" y=\"%.0f\">"
                            "%zu. rank %d: %s / %s / %s%s</text>\n",
                            r.rank, side + 18, y, k + 1, r.rank, Ms(r.mean_us), Ms(r.p95_us),
                            Ms(r.max_us),
                            r.missing ? absl::StrFormat(" (%d never started)", r.missing) : ""));
  }
  absl::StrAppend(&s, "</svg>\n");
  return s;
}

std::string RenderHeatmapHtml(const LatenessTable& t, const std::string& svg) {
  std::string h =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>adaptcomm straggler "
      "heatmap</title>\n<style>body{font-family:sans-serif;margin:20px}table{border-collapse:"
      "collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}</style></head>"
      "<body>\n<h2>Collective arrival lateness</h2>\n";
  absl::StrAppend(&h, svg,
                  "\n<h3>Straggler ranking</h3>\n<table><tr><th>#</th><th>rank</th>"
                  "<th>mean</th><th>p50</th><th>p95</th><th>max</th><th>never started"
                  "</th></tr>\n");
  for (size_t k = 0; k < t.ranking.size(); ++k) {
    const RankLateness& r = t.ranking[k];
    absl::StrAppend(&h, absl::StrFormat("<tr><td>%zu</td><td>%d</td><td>%s</td><td>%s</td><td>%s"
                                        "</td><td>%s</td><td>%d</td></tr>\n",
                                        k + 1, r.rank, Escape(Ms(r.mean_us)), Escape(Ms(r.p50_us)),
                                        Escape(Ms(r.p95_us)), Escape(Ms(r.max_us)), r.missing));
  }
  absl::StrAppend(&h, "</table>\n</body></html>\n");
  return h;
}

}  // namespace adaptcomm::diag

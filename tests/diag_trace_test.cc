// `adaptcomm trace merge` and `heatmap` on synthetic 4-rank traces in which rank 2 arrives late
// and rank 1's clock runs 5 s ahead of rank 0's.
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/diag/heatmap.h"
#include "lib/diag/trace_merge.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::diag {
namespace {

constexpr int kRanks = 4;
constexpr int kOps = 40;
constexpr int kLateRank = 2;
constexpr double kLateUs = 50000;  // rank 2 starts each op 50 ms after the others
const double kOffsetUs[kRanks] = {0, 5e6, -1234, 777};

std::string MakeTraceDir() {
  std::string dir = ::testing::TempDir() + "/diag_trace_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) return "";
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> jitter(0, 800);  // < 1 ms of noise for everyone
  for (int r = 0; r < kRanks; ++r) {
    nlohmann::json t;
    t["traceEvents"] = nlohmann::json::array();
    for (int s = 0; s < kOps; ++s) {
      const double true_start =
          1.7e15 + s * 100000.0 + jitter(rng) + (r == kLateRank ? kLateUs : 0);
      const double local = true_start + kOffsetUs[r];  // what this rank's clock reads
      t["traceEvents"].push_back({{"name", "allreduce"},
                                  {"cat", "collective"},
                                  {"ph", "X"},
                                  {"ts", local},
                                  {"dur", 900.0},
                                  {"pid", r},
                                  {"tid", 0},
                                  {"args",
                                   {{"seq", s},
                                    {"dtype", "f32"},
                                    {"count", 1024},
                                    {"bytes", 4096},
                                    {"enqueue_ts", local - 10}}}});
    }
    t["otherData"] = {{"rank", r}, {"world_size", kRanks}, {"clock_offset_us", kOffsetUs[r]}};
    std::ofstream(dir + "/trace.rank" + std::to_string(r) + ".json") << t.dump();
  }
  return dir;
}

TEST(TraceMergeTest, MovesEveryRankOntoRankZerosClock) {
  const std::string dir = MakeTraceDir();
  ASSERT_FALSE(dir.empty());
  auto files = ListRankTraces(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 4u);
  EXPECT_NE((*files)[3].find("trace.rank3.json"), std::string::npos);
  auto merged = MergeTraces(*files);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ((*merged)["otherData"]["world_size"], 4);
  EXPECT_EQ((*merged)["otherData"]["clock_offsets_us"]["1"], 5e6);
  int collectives = 0, names = 0;
  for (const auto& e : (*merged)["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ++names;
    if (e["ph"] != "X") continue;
    ++collectives;
    const int rank = e["pid"];
    const double expected_base = 1.7e15 + e["args"]["seq"].get<int>() * 100000.0;
    const double ts = e["ts"];
    // On rank 0's clock every start lies within its jitter (+ rank 2's lateness) of the truth.
    EXPECT_GE(ts, expected_base) << "rank " << rank;
    EXPECT_LT(ts, expected_base + 800 + (rank == kLateRank ? kLateUs : 0)) << "rank " << rank;
    EXPECT_DOUBLE_EQ(e["args"]["enqueue_ts"].get<double>(), ts - 10);
  }
  EXPECT_EQ(collectives, kRanks * kOps);
  EXPECT_EQ(names, kRanks);
}

TEST(TraceMergeTest, ErrorsNameTheProblem) {
  EXPECT_EQ(ListRankTraces("/nonexistent").status().code(), absl::StatusCode::kNotFound);
  const std::string dir = ::testing::TempDir();
  const std::string bad = dir + "/trace.rank9.json";
  std::ofstream(bad) << "{\"traceEvents\": 3}";
  auto merged = MergeTraces({bad});
  ASSERT_FALSE(merged.ok());
  EXPECT_NE(merged.status().message().find("trace.rank9.json"), absl::string_view::npos);
  std::remove(bad.c_str());
}

TEST(HeatmapTest, LateRankRankedFirstAndHottest) {
  const std::string dir = MakeTraceDir();
  auto merged = MergeTraces(*ListRankTraces(dir));
  ASSERT_TRUE(merged.ok());
  auto table = ComputeLateness(*merged);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->ranks.size(), 4u);
  ASSERT_EQ(table->seqs.size(), static_cast<size_t>(kOps));
  ASSERT_EQ(table->ranking.size(), 4u);
  EXPECT_EQ(table->ranking[0].rank, kLateRank);
  EXPECT_GT(table->ranking[0].mean_us, kLateUs - 800);
  EXPECT_LT(table->ranking[0].mean_us, kLateUs + 800);
  EXPECT_LT(table->ranking[1].mean_us, 800) << "rank 1's 5 s clock offset must not make it late";

  const std::string svg = RenderHeatmapSvg(*table);
  // Every column: rank 2's cell has the highest colour level, near the top of the scale.
  std::regex cell(R"re(data-rank="(\d+)" data-seq="(\d+)" data-level="(-?\d+)")re");
  std::vector<std::vector<int>> level(kRanks, std::vector<int>(kOps, -2));
  int cells = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), cell); it != std::sregex_iterator();
       ++it) {
    level[std::stoi((*it)[1])][std::stoi((*it)[2])] = std::stoi((*it)[3]);
    ++cells;
  }
  EXPECT_EQ(cells, kRanks * kOps);
  for (int s = 0; s < kOps; ++s) {
    EXPECT_GE(level[kLateRank][s], 240) << "seq " << s;
    for (int r = 0; r < kRanks; ++r) {
      if (r != kLateRank) {
        EXPECT_LT(level[r][s], 10) << "rank " << r << " seq " << s;
      }
    }
  }
  // The ranking beside the grid lists rank 2 first.
  const size_t first_row = svg.find("class=\"rank-row\"");
  ASSERT_NE(first_row, std::string::npos);
  const std::string expected_row = "class=\"rank-row\" data-rank=\"2\"";
  EXPECT_EQ(svg.substr(first_row, expected_row.size()), expected_row);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  const std::string html = RenderHeatmapHtml(*table, svg);
  EXPECT_NE(html.find("<tr><td>1</td><td>2</td>"), std::string::npos);
}

TEST(HeatmapTest, MissingOpsAndBucketing) {
  nlohmann::json merged;
  merged["traceEvents"] = nlohmann::json::array();
  for (int s = 0; s < 1000; ++s) {
    for (int r = 0; r < 2; ++r) {
      if (r == 1 && s == 999) continue;  // rank 1 never started the last op
      merged["traceEvents"].push_back({{"ph", "X"},
                                       {"name", "allgather"},
                                       {"pid", r},
                                       {"ts", s * 1000.0 + r * 10},
                                       {"args", {{"seq", s}}}});
    }
  }
  auto table = ComputeLateness(merged);
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->ranking[0].rank, 1);
  EXPECT_EQ(table->ranking[0].missing, 1);
  EXPECT_DOUBLE_EQ(table->late_us[1][998], 10);
  EXPECT_DOUBLE_EQ(table->late_us[1][999], -1);
  const std::string svg = RenderHeatmapSvg(*table, 100);
  size_t cells = 0;
  for (size_t p = svg.find("class=\"cell\""); p != std::string::npos;
       p = svg.find("class=\"cell\"", p + 1)) {
    ++cells;
  }
  EXPECT_EQ(cells, 2u * 100u);  // 1000 ops folded into 100 columns of 10
  EXPECT_NE(svg.find("max of each 10"), std::string::npos);
  EXPECT_FALSE(ComputeLateness(nlohmann::json::object()).ok());
}

TEST(HeatmapTest, ColourScaleIsMonotoneFromPaleToDark) {
  EXPECT_EQ(HeatColour(0), "#ffffcc");
  EXPECT_EQ(HeatColour(1), "#800026");
  EXPECT_EQ(HeatLevel(0.5), 128);
  EXPECT_EQ(HeatLevel(2), 255);
}

}  // namespace
}  // namespace adaptcomm::diag

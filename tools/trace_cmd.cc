// `adaptcomm trace VERB`: tools for the per-rank collective traces.
//   merge DIR -o merged.json                      rank files onto rank 0's clock (Perfetto opens
//   it) heatmap merged.json -o out.svg [--html F]     ranks x ops lateness heatmap + straggler
//   ranking
// Each verb is a Setup function and one line in kVerbs below.
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/diag/heatmap.h"
#include "lib/diag/trace_merge.h"
#include "lib/trace/culprit.h"
#include "nlohmann/json.hpp"
#include "tools/subcommands.h"

namespace adaptcomm::tools {
namespace {

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::fprintf(stderr, "trace: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

std::function<int()> SetupMerge(CLI::App& sub) {
  struct Args {
    std::string dir, output = "merged.json";
  };
  auto a = std::make_shared<Args>();
  sub.add_option("dir", a->dir, "Directory holding trace.rank<R>.json files")->required();
  sub.add_option("-o,--output", a->output, "Merged trace file");
  return [a] {
    auto files = diag::ListRankTraces(a->dir);
    if (!files.ok()) {
      std::fprintf(stderr, "trace merge: %s\n", std::string(files.status().message()).c_str());
      return 2;
    }
    auto merged = diag::MergeTraces(*files);
    if (!merged.ok()) {
      std::fprintf(stderr, "trace merge: %s\n", std::string(merged.status().message()).c_str());
      return 2;
    }
    if (!WriteFile(a->output, merged->dump())) return 2;
    std::printf("merged %zu rank file(s), %zu events -> %s\n", files->size(),
                (*merged)["traceEvents"].size(), a->output.c_str());
    return 0;
  };
}

std::function<int()> SetupHeatmap(CLI::App& sub) {
  struct Args {
    std::string input, svg = "heatmap.svg", html;
    size_t columns = 600;
  };
  auto a = std::make_shared<Args>();
  sub.add_option("merged", a->input, "Merged trace (from `adaptcomm trace merge`)")->required();
  sub.add_option("-o,--output", a->svg, "SVG file");
  sub.add_option("--html", a->html, "Also write a self-contained HTML page");
  sub.add_option("--columns", a->columns, "Most op columns before folding into buckets")
      ->check(CLI::PositiveNumber);
  return [a] {
    std::ifstream in(a->input);
    if (!in) {
      std::fprintf(stderr, "trace heatmap: cannot read %s\n", a->input.c_str());
      return 2;
    }
    nlohmann::json merged = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (merged.is_discarded()) {
      std::fprintf(stderr, "trace heatmap: %s is not JSON\n", a->input.c_str());
      return 2;
    }
    auto table = diag::ComputeLateness(merged);
    if (!table.ok()) {
      std::fprintf(stderr, "trace heatmap: %s\n", std::string(table.status().message()).c_str());
      return 2;
    }
    const std::string svg = diag::RenderHeatmapSvg(*table, a->columns);
    if (!WriteFile(a->svg, svg)) return 2;
    if (!a->html.empty() && !WriteFile(a->html, diag::RenderHeatmapHtml(*table, svg))) return 2;
    std::printf("%zu ranks x %zu ops -> %s%s\nstragglers (mean / p95 lateness):\n",
                table->ranks.size(), table->seqs.size(), a->svg.c_str(),
                a->html.empty() ? "" : (" and " + a->html).c_str());
    for (size_t k = 0; k < table->ranking.size() && k < 5; ++k) {
      const auto& r = table->ranking[k];
      std::printf("  %zu. rank %d: %.2f ms / %.2f ms%s\n", k + 1, r.rank, r.mean_us / 1e3,
                  r.p95_us / 1e3,
                  r.missing ? absl::StrFormat(" (%d never started)", r.missing).c_str() : "");
    }
    return 0;
  };
}

std::function<int()> SetupCulprit(CLI::App& sub) {
  struct Args {
    std::string dir;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  sub.add_option("dir", a->dir, "Directory holding flight.rank<R>.json dumps")->required();
  sub.add_flag("--json", a->json, "Print the report as JSON");
  return [a] {
    auto report = trace::AnalyzeFlightDumps(a->dir);
    if (!report.ok()) {
      std::fprintf(stderr, "trace culprit: %s\n", std::string(report.status().message()).c_str());
      return 2;
    }
    std::printf("%s%s", a->json ? report->ToJson().c_str() : report->ToText().c_str(),
                a->json ? "\n" : "");
    return 0;
  };
}

struct TraceVerb {
  const char* name;
  const char* description;
  std::function<std::function<int()>(CLI::App&)> setup;
};

const std::vector<TraceVerb>& Verbs() {
  static const auto* verbs = new std::vector<TraceVerb>{
      {"merge", "Join per-rank traces onto one clock (one file for Perfetto)", SetupMerge},
      {"heatmap", "SVG/HTML heatmap of arrival lateness with a straggler ranking", SetupHeatmap},
      {"culprit", "Read flight-recorder dumps and say which rank is behind", SetupCulprit},
  };
  return *verbs;
}

std::function<int()> SetupTrace(CLI::App& sub) {
  sub.require_subcommand(1);
  auto runners = std::make_shared<std::map<CLI::App*, std::function<int()>>>();
  for (const TraceVerb& v : Verbs()) {
    CLI::App* verb = sub.add_subcommand(v.name, v.description);
    (*runners)[verb] = v.setup(*verb);
  }
  return [runners] {
    for (auto& [verb, run] : *runners) {
      if (verb->parsed()) return run();
    }
    return 2;
  };
}

}  // namespace

ADAPTCOMM_SUBCOMMAND(
    trace, "Merge per-rank traces, draw the straggler heatmap, name the culprit of a hang",
    SetupTrace);

}  // namespace adaptcomm::tools

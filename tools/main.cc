// `adaptcomm`: launch, profile, diagnose, doctor, trace, bench. Each subcommand lives in its own
// *_cmd.cc file; see subcommands.h.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include "tools/subcommands.h"

namespace adaptcomm::tools {
std::vector<SubcommandEntry>& SubcommandTable() {
  static auto* table = new std::vector<SubcommandEntry>();
  return *table;
}
}  // namespace adaptcomm::tools

int main(int argc, char** argv) {
  using adaptcomm::tools::SubcommandTable;
  CLI::App app{
      "adaptcomm: collectives for C++ trainers (launch ranks, explain profiles, diagnose)"};
  app.require_subcommand(1);
  auto& table = SubcommandTable();
  std::sort(table.begin(), table.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, std::function<int()>> runners;
  for (auto& entry : table) {
    CLI::App* sub = app.add_subcommand(entry.name, entry.description);
    runners[sub] = entry.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // app.exit prints help (--help, exit code 0) or the error. CLI11's own codes for errors
    // (105 validation, 106 no subcommand, 109 extra argument...) are not ours: every usage error
    // of every subcommand exits kExitUsage, as the subcommands' --help pages say.
    return app.exit(e) == 0 ? 0 : adaptcomm::tools::kExitUsage;
  }
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) return run();
  }
  return adaptcomm::tools::kExitUsage;
}

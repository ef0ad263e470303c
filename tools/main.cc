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
  CLI11_PARSE(app, argc, argv);
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) return run();
  }
  return 2;
}

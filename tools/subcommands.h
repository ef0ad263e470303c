// The `adaptcomm` command's subcommands register themselves here, one *_cmd.cc each:
//
//   namespace { std::function<int()> SetupLaunch(CLI::App& sub) { ...options...; return run; } }
//   ADAPTCOMM_SUBCOMMAND(launch, "Start N local ranks with torchrun variables", SetupLaunch);
//
// Setup adds the subcommand's options to `sub` and returns the function that runs it and
// produces the process exit code. Reporting subcommands offer --json.
#ifndef ADAPTCOMM_TOOLS_SUBCOMMANDS_H_
#define ADAPTCOMM_TOOLS_SUBCOMMANDS_H_

#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace adaptcomm::tools {

using SubcommandSetup = std::function<std::function<int()>(CLI::App& sub)>;

struct SubcommandEntry {
  std::string name;
  std::string description;
  SubcommandSetup setup;
};

std::vector<SubcommandEntry>& SubcommandTable();

struct SubcommandRegistrar {
  SubcommandRegistrar(const char* name, const char* description, SubcommandSetup setup) {
    SubcommandTable().push_back({name, description, std::move(setup)});
  }
};

}  // namespace adaptcomm::tools

#define ADAPTCOMM_SUBCOMMAND(name, description, setup)                                           \
  static ::adaptcomm::tools::SubcommandRegistrar adaptcomm_subcommand_##name(#name, description, \
                                                                             setup)

#endif  // ADAPTCOMM_TOOLS_SUBCOMMANDS_H_

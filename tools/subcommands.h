// The `adaptcomm` command's subcommands register themselves here, one *_cmd.cc each:
//
//   namespace { std::function<int()> SetupLaunch(CLI::App& sub) { ...options...; return run; } }
//   ADAPTCOMM_SUBCOMMAND(launch, "Start N local ranks with torchrun variables", SetupLaunch);
//
// Setup adds the subcommand's options to `sub` and returns the function that runs it and
// produces the process exit code. Reporting subcommands offer --json.
#ifndef ADAPTCOMM_TOOLS_SUBCOMMANDS_H_
#define ADAPTCOMM_TOOLS_SUBCOMMANDS_H_

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace adaptcomm::tools {

// Exit code of a usage error (unknown flag, bad value, missing argument), for every subcommand.
inline constexpr int kExitUsage = 2;

// Validator of a flag given in seconds: a finite number, positive (or zero where zero_allowed),
// at most a year. The error repeats the value as given; CLI11's NonNegativeNumber would print
// its upper bound DBL_MAX in all 309 digits, and accept values that overflow a clock.
inline CLI::Validator DurationSeconds(bool zero_allowed) {
  constexpr double kMaxSeconds = 365.0 * 24 * 3600;
  const std::string range =
      zero_allowed ? "0 to 31536000 (a year)" : "more than 0 to 31536000 (a year)";
  return CLI::Validator(
      [zero_allowed, range](std::string& text) -> std::string {
        char* end = nullptr;
        const double seconds = std::strtod(text.c_str(), &end);
        const bool number = !text.empty() && end != nullptr && *end == '\0';
        if (number && std::isfinite(seconds) && (zero_allowed ? seconds >= 0 : seconds > 0) &&
            seconds <= kMaxSeconds) {
          return std::string();
        }
        return "'" + text + "' is not a duration in seconds from " + range;
      },
      "SECONDS");
}

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

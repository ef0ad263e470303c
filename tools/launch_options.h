// The options of `adaptcomm launch` and their command line (tools/launcher.h runs the job).
#ifndef ADAPTCOMM_TOOLS_LAUNCH_OPTIONS_H_
#define ADAPTCOMM_TOOLS_LAUNCH_OPTIONS_H_

#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace adaptcomm::tools {

struct LaunchOptions {
  int nproc = 0;
  int master_port = 0;
  double timeout_s = 0;
  double grace_s = 5;
  double dump_wait_s = 3;
  bool no_prefix = false;
  // --elastic (#14): a rank that dies is dropped and the others go on (the library shrinks the
  // communicator: ADAPTCOMM_ELASTIC=shrink), while at least min_nproc are alive. The launcher
  // serves the store (ADAPTCOMM_STORE_EXTERNAL=1: rank 0 connects to it as a client), so that
  // rank 0 may die too. With max_restarts, a dead rank is started again (up to that many times in
  // all) as a replacement (ADAPTCOMM_ELASTIC_JOIN=1) that the others admit at their next step
  // boundary (Communicator::AdmitJoiners).
  bool elastic = false;
  int min_nproc = 1;
  int max_restarts = 0;
  // --bind-to (lib/base/cpu_binding.h): auto, core or none.
  std::string bind_to = "auto";
  std::vector<std::string> command;
};

// Declares launch's options and flags on `sub`, writing into `options` (which must outlive the
// parse), with their help text and footer.
void AddLaunchOptions(CLI::App& sub, LaunchOptions& options);

}  // namespace adaptcomm::tools

#endif  // ADAPTCOMM_TOOLS_LAUNCH_OPTIONS_H_

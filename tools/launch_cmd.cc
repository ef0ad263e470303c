// `adaptcomm launch -n N [options] -- PROGRAM ARGS...`: a local torchrun. Starts N ranks with
// RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT (+ a store token), prefixes
// their output per line, and ends the whole job as soon as one rank fails: a job with a dead rank
// otherwise hangs in its next collective until the collective timeout, minutes later.
//
// Before ending a failed (or timed-out) job it asks the surviving ranks for their flight records
// (SIGUSR2, which the library answers by dumping flight.rank<R>.json) and waits a bounded time for
// them: those records are what `adaptcomm trace culprit` reads, and a rank ended by SIGTERM
// alone writes none.
//
// One thread, one poll() loop: the rank pipes, a self-pipe for signals (SIGCHLD wakes the loop to
// reap) and the deadlines (job timeout, grace before SIGKILL, output drain) bound every wait.
// With --elastic the launcher also serves the job's store (its server's threads, with every
// signal blocked), so that no rank, rank 0 included, is one the job cannot lose.
#include <functional>
#include <memory>

#include "tools/launch_options.h"
#include "tools/launcher.h"
#include "tools/subcommands.h"

namespace adaptcomm::tools {
namespace {

std::function<int()> SetupLaunch(CLI::App& sub) {
  auto options = std::make_shared<LaunchOptions>();
  AddLaunchOptions(sub, *options);
  return [options]() {
    launcher::Launcher launcher(*options);
    return launcher.Run();
  };
}

}  // namespace

ADAPTCOMM_SUBCOMMAND(launch, "Start N local ranks with torchrun variables", SetupLaunch);

}  // namespace adaptcomm::tools

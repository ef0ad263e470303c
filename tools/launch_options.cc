#include "tools/launch_options.h"

#include "tools/subcommands.h"

namespace adaptcomm::tools {

void AddLaunchOptions(CLI::App& sub, LaunchOptions& options) {
  sub.add_option("-n,--nproc", options.nproc, "Number of ranks to start")
      ->required()
      ->check(CLI::Range(1, 4096));
  sub.add_option("--master-port", options.master_port,
                 "MASTER_PORT for the ranks (default: a free port)")
      ->check(CLI::Range(0, 65535));
  sub.add_option("--timeout", options.timeout_s,
                 "End the whole job after this many seconds (exit code 124); 0 = no bound")
      ->check(DurationSeconds(/*zero_allowed=*/true));
  sub.add_option("--grace", options.grace_s,
                 "Seconds between SIGTERM and SIGKILL when the job is stopped")
      ->capture_default_str()
      ->check(DurationSeconds(/*zero_allowed=*/true));
  sub.add_option("--dump-wait", options.dump_wait_s,
                 "When a rank fails or --timeout ends the job: seconds the other ranks get to dump "
                 "their flight records (SIGUSR2) before SIGTERM; 0 = do not ask")
      ->capture_default_str()
      ->check(DurationSeconds(/*zero_allowed=*/true));
  sub.add_flag("--no-prefix", options.no_prefix, "Do not prefix output lines with [rank R]");
  sub.add_flag("--elastic", options.elastic,
               "A rank that dies, rank 0 included, is dropped and the others go on (the ranks get "
               "ADAPTCOMM_ELASTIC=shrink); exit 0 when the job finishes with fewer ranks. The "
               "launcher serves the job's store itself (the ranks get ADAPTCOMM_STORE_EXTERNAL=1: "
               "rank 0 connects to it instead of serving it), so losing rank 0 does not end the "
               "job");
  sub.add_option("--min-nproc", options.min_nproc,
                 "--elastic: fewer ranks alive than this ends the job (torchrun's --nnodes MIN)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub.add_option("--max-restarts", options.max_restarts,
                 "--elastic: restart a dead rank (rank 0 included) as a replacement, up to N "
                 "times in all (torchrun's word); it gets ADAPTCOMM_ELASTIC_JOIN=1 and the others "
                 "admit it at their next Communicator::AdmitJoiners()")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  sub.add_option("--bind-to", options.bind_to,
                 "core: each rank on cores of its own (the host's cores split in N contiguous "
                 "runs, a rank gets every hardware thread of its run); none: the ranks inherit "
                 "the launcher's CPUs; auto: core when there are at least N cores, else none")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "core", "none"}));
  sub.add_option("command", options.command, "PROGRAM ARGS... (after --)")->required();
  sub.footer(
      "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,\n"
      "MASTER_PORT and ADAPTCOMM_STORE_TOKEN (kept if already set), and\n"
      "ADAPTCOMM_FLIGHT_RECORDER_DIR: if not set, a new ${TMPDIR:-/tmp}/adaptcomm-flight-* per\n"
      "job (removed at the end when empty). A rank bound to cores (--bind-to) gets them in\n"
      "ADAPTCOMM_BOUND_CPUS (\"0-3,64-67\"); the threads and processes it starts share them (two\n"
      "ranks left on one core take turns: a small shared-memory op then waits for a context\n"
      "switch). Gloo wants two or more CPUs per rank (its threads take turns on a rank's only\n"
      "one at every op; such a rank says so): use none where auto would give one each.\n"
      "When a rank fails (or --timeout passes), the others\n"
      "that catch SIGUSR2 (the library does) get it and up to --dump-wait seconds (default 3) to\n"
      "dump their flight records; then SIGTERM, then SIGKILL after the grace period. The launcher\n"
      "names the rank that failed first (pid, exit code or signal) and the directory holding the\n"
      "flight records (read them with `adaptcomm trace culprit DIR`), and exits with that rank's\n"
      "code (128+signal for a signal death; 127/126 when the program cannot be executed).\n"
      "SIGINT/SIGTERM are forwarded to the ranks as they are.\n"
      "With --elastic the launcher serves the store on 127.0.0.1:MASTER_PORT and the ranks get\n"
      "ADAPTCOMM_STORE_EXTERNAL=1 (rank 0 is a client like the others: the job survives its\n"
      "loss); ADAPTCOMM_ELASTIC=shrink and ADAPTCOMM_ELASTIC_MIN_WORLD=--min-nproc unless set.");
}

}  // namespace adaptcomm::tools

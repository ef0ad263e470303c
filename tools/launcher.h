// The supervisor behind `adaptcomm launch` (launch_cmd.cc): its ranks and the Launcher that starts,
// watches, restarts and stops them. launcher.cc holds the run loop, signals, stop and flight-record
// requests; launcher_ranks.cc starting, reaping and reading one rank. Internal to tools/.
#ifndef ADAPTCOMM_TOOLS_LAUNCHER_H_
#define ADAPTCOMM_TOOLS_LAUNCHER_H_

#include <poll.h>
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "adaptcomm/store.h"
#include "tools/launch_io.h"
#include "tools/launch_options.h"
#include "tools/launch_proc.h"

namespace adaptcomm::tools::launcher {

using Clock = std::chrono::steady_clock;

inline constexpr size_t kReadChunk = 64 * 1024;
// After the last rank is reaped, how long its descendants may keep the output pipes open.
inline constexpr auto kDrainBound = std::chrono::seconds(2);
// Exit code of a job that ran past --timeout (as timeout(1)).
inline constexpr int kTimeoutExitCode = 124;
// While waiting for flight records, how often the dump files are looked at.
inline constexpr auto kDumpCheckPeriod = std::chrono::milliseconds(20);

// The signals the launcher forwards to its ranks (a rank's own handlers are reset to default).
inline constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

struct Rank {
  int index = 0;
  pid_t pid = -1;
  bool reaped = false;
  int fds[2] = {-1, -1};  // read ends of the rank's stdout and stderr pipes
  std::unique_ptr<LineForwarder> out[2];
  int exec_errno = 0;  // the program could not be executed (errno of execvpe in the child)
  bool dump_requested = false;
  std::optional<FileStamp> dump_before;  // its flight record when the dump was requested
};

// The rank that failed first, as the final summary names it.
struct FirstFailure {
  int rank = -1;
  pid_t pid = -1;
  std::string how;  // "was killed by SIGKILL (exit code 137)"
};

class Launcher {
 public:
  explicit Launcher(const LaunchOptions& options) : options_(options) {}
  ~Launcher() {
    for (Rank& rank : ranks_) {
      for (int& fd : rank.fds) {
        if (fd >= 0) close(fd);
      }
    }
    for (int fd : signal_pipe_) {
      if (fd >= 0) close(fd);
    }
    RestoreSignals();
  }

  int Run();

 private:
  // Run's steps: what the ranks need before the first starts (nullopt, or the exit code), the
  // first start of every rank (false: none started), the loop that reaps, restarts, stops and
  // forwards output until every rank is gone, and the final report (the exit code).
  std::optional<int> Prepare();
  std::optional<int> PlanCpus();
  bool StartRanks();
  void Supervise();
  int Finish();
  // The job timeout, the dump wait and the kill grace, checked on every wake-up.
  void CheckDeadlines(Clock::time_point now);
  // How long poll may sleep: until the nearest deadline (-1: none).
  int PollTimeoutMs(Clock::time_point now) const;
  // One poll of the signal pipe and the ranks' output; false: poll failed, the job is stopped.
  bool PollOnce(int timeout_ms, std::vector<pollfd>& fds,
                std::vector<std::pair<size_t, int>>& owners);
  bool InstallSignals();
  void RestoreSignals();
  // --elastic: serves the job's store on loopback `port` (0: a free one) with `token`.
  bool StartStoreServer(int port, const std::string& token);
  // Starts ranks_[slot] as rank `index`.
  bool StartRank(size_t slot, int index, const std::vector<std::string>& env);
  // The variables rank `index` gets; `replacement`: it joins the running job.
  std::vector<std::pair<std::string, std::string>> RankVariables(int index, bool replacement) const;
  // --max-restarts: starts the replacements OnRankExit asked for (not from inside the reaping
  // loop, which holds references into ranks_).
  void StartReplacements();
  void ReapChildren();
  void OnRankExit(Rank& rank, int status);
  // Stops the job with `signo`; with ask_for_dumps, the ranks that catch SIGUSR2 first get it
  // and up to --dump-wait seconds to write their flight records.
  void BeginStop(int signo, int exit_code, bool ask_for_dumps);
  bool RequestDumps();
  bool DumpsDone() const;
  void SendStopSignal();
  void ReportFlightRecords();
  std::string FlightRecordPath(const Rank& rank) const;
  void SignalAll(int signo);
  void ReadRank(Rank& rank, int stream);
  void HandleSignalPipe();
  bool AllReaped() const;
  bool AllPipesClosed() const;

  const LaunchOptions& options_;
  // The CPUs of each rank index (--bind-to; empty: unbound), decided before the first starts.
  std::vector<std::vector<int>> rank_cpus_;
  std::vector<Rank> ranks_;
  int signal_pipe_[2] = {-1, -1};
  bool signals_installed_ = false;
  struct sigaction old_actions_[4] = {};
  bool old_sigpipe_saved_ = false;
  struct sigaction old_sigpipe_ = {};

  bool stopping_ = false;
  int stop_signal_ = SIGTERM;
  int exit_code_ = 0;
  std::optional<FirstFailure> first_failure_;
  std::vector<std::string> lost_;      // --elastic: ranks that died while the others went on
  std::vector<std::string> restarts_;  // --max-restarts: "rank 2 (pid P) ..., restarted as pid Q"
  std::vector<std::pair<int, std::string>> pending_restarts_;  // (rank, how it died)
  int port_ = 0;
  std::string token_;
  // --elastic: the job's store, served here rather than by rank 0 (outlives every rank).
  std::unique_ptr<TcpStoreServer> store_server_;
  // Where the ranks dump (ADAPTCOMM_FLIGHT_RECORDER_DIR); empty if unknown.
  std::string flight_dir_;
  bool flight_dir_created_ = false;  // a per-job directory made by the launcher
  time_t start_wall_ = 0;
  Clock::time_point start_;
  std::optional<Clock::time_point> job_deadline_;
  std::optional<Clock::time_point> dump_deadline_;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> drain_deadline_;
};

}  // namespace adaptcomm::tools::launcher

#endif  // ADAPTCOMM_TOOLS_LAUNCHER_H_

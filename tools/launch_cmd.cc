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
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "adaptcomm/store.h"
#include "lib/base/cpu_binding.h"
#include "tools/launch_io.h"
#include "tools/launch_options.h"
#include "tools/launch_proc.h"
#include "tools/subcommands.h"

namespace adaptcomm::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReadChunk = 64 * 1024;
// After the last rank is reaped, how long its descendants may keep the output pipes open.
constexpr auto kDrainBound = std::chrono::seconds(2);
// Exit code of a job that ran past --timeout (as timeout(1)).
constexpr int kTimeoutExitCode = 124;
// While waiting for flight records, how often the dump files are looked at.
constexpr auto kDumpCheckPeriod = std::chrono::milliseconds(20);

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

int g_signal_pipe_write = -1;

void OnSignal(int signo) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(signo);
  (void)!write(g_signal_pipe_write, &byte, 1);
  errno = saved_errno;
}

const int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

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

bool Launcher::InstallSignals() {
  if (pipe2(signal_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  g_signal_pipe_write = signal_pipe_[1];
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &action, &old_actions_[0]);
  for (size_t i = 0; i < std::size(kForwardedSignals); ++i) {
    sigaction(kForwardedSignals[i], &action, &old_actions_[i + 1]);
  }
  // A closed stdout of the launcher must not kill it before it has ended the ranks.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  old_sigpipe_saved_ = sigaction(SIGPIPE, &ignore, &old_sigpipe_) == 0;
  signals_installed_ = true;
  return true;
}

bool Launcher::StartStoreServer(int port, const std::string& token) {
  TcpStoreOptions serve;
  serve.host = "127.0.0.1";  // the ranks' MASTER_ADDR
  serve.port = port;
  serve.token = token;
  // The server's threads take no signal: they belong to the loop's self-pipe (and an interrupted
  // store call would be a spurious error there). Threads inherit the mask of their creator.
  sigset_t all_signals, launcher_mask;
  sigfillset(&all_signals);
  pthread_sigmask(SIG_BLOCK, &all_signals, &launcher_mask);
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = StartTcpStoreServer(serve);
  pthread_sigmask(SIG_SETMASK, &launcher_mask, nullptr);
  if (!server.ok()) {
    Message(absl::StrCat("--elastic: cannot serve the job's store on 127.0.0.1:", port, ": ",
                         server.status().message()));
    return false;
  }
  store_server_ = *std::move(server);
  return true;
}

void Launcher::RestoreSignals() {
  if (!signals_installed_) return;
  sigaction(SIGCHLD, &old_actions_[0], nullptr);
  for (size_t i = 0; i < std::size(kForwardedSignals); ++i) {
    sigaction(kForwardedSignals[i], &old_actions_[i + 1], nullptr);
  }
  if (old_sigpipe_saved_) sigaction(SIGPIPE, &old_sigpipe_, nullptr);
  g_signal_pipe_write = -1;
  signals_installed_ = false;
}

bool Launcher::StartRank(size_t slot, int index, const std::vector<std::string>& env) {
  Rank& rank = ranks_[slot];
  rank.index = index;
  // exec_status: the child writes exec's errno into it when exec fails; a successful exec
  // closes it (O_CLOEXEC), so the parent reads end-of-file.
  int out_pipe[2], err_pipe[2], exec_status[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return false;
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return false;
  }
  if (pipe2(exec_status, O_CLOEXEC) != 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return false;
  }
  // Everything the child touches is prepared before fork().
  std::vector<char*> argv;
  for (const std::string& arg : options_.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& entry : env) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const std::vector<int>& cpus = rank_cpus_[static_cast<size_t>(index)];
  cpu_set_t cpu_set;
  CPU_ZERO(&cpu_set);
  for (int cpu : cpus) CPU_SET(cpu, &cpu_set);
  const std::string unbound = absl::StrCat("adaptcomm launch: cannot bind rank ", index,
                                           " to CPUs ", CpuListText(cpus), "; it runs unbound\n");

  // The child inherits the launcher's handlers, which only write to the launcher's signal pipe: a
  // signal reaching the child before exec (or after a failed exec) would be taken for one sent
  // to the launcher. Signals stay blocked across fork until the child has reset them.
  sigset_t all_signals, launcher_mask;
  sigfillset(&all_signals);
  sigprocmask(SIG_BLOCK, &all_signals, &launcher_mask);
  pid_t pid = fork();
  if (pid < 0) {
    sigprocmask(SIG_SETMASK, &launcher_mask, nullptr);
    for (int fd :
         {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], exec_status[0], exec_status[1]}) {
      close(fd);
    }
    return false;
  }
  if (pid == 0) {
    signal(SIGCHLD, SIG_DFL);
    for (int signo : kForwardedSignals) signal(signo, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);  // SIG_IGN would survive exec
    // Own process group: the launcher signals the rank together with whatever it spawned.
    setpgid(0, 0);
    // A launcher killed without a chance to clean up takes its ranks along.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0 && devnull != STDIN_FILENO) {
      dup2(devnull, STDIN_FILENO);
      close(devnull);
    }
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    // Before exec: every thread the program starts inherits it.
    if (!cpus.empty() && sched_setaffinity(0, sizeof(cpu_set), &cpu_set) != 0) {
      (void)!write(STDERR_FILENO, unbound.data(), unbound.size());
    }
    execvpe(argv[0], argv.data(), envp.data());
    const int err = errno;
    (void)!write(exec_status[1], &err, sizeof(err));
    _exit(ExecFailureExitCode(err));
  }
  sigprocmask(SIG_SETMASK, &launcher_mask, nullptr);
  // Also from the parent, so the group exists before any signal is sent to it.
  setpgid(pid, pid);
  rank.pid = pid;
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_status[1]);
  int exec_errno = 0;
  ssize_t got;
  do {
    got = read(exec_status[0], &exec_errno, sizeof(exec_errno));
  } while (got < 0 && errno == EINTR);
  close(exec_status[0]);
  rank.exec_errno = got == static_cast<ssize_t>(sizeof(exec_errno)) ? exec_errno : 0;
  rank.fds[0] = out_pipe[0];
  rank.fds[1] = err_pipe[0];
  for (int fd : rank.fds) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::string prefix = options_.no_prefix ? "" : absl::StrCat("[rank ", index, "] ");
  rank.out[0] = std::make_unique<LineForwarder>(STDOUT_FILENO, prefix);
  rank.out[1] = std::make_unique<LineForwarder>(STDERR_FILENO, prefix);
  return true;
}

void Launcher::SignalAll(int signo) {
  for (Rank& rank : ranks_) {
    if (rank.pid <= 0) continue;
    // The group may outlive its leader (a daemonised helper); a leader that moved to another
    // group is reached directly.
    if (kill(-rank.pid, signo) != 0 && !rank.reaped) kill(rank.pid, signo);
  }
}

void Launcher::BeginStop(int signo, int exit_code, bool ask_for_dumps) {
  stopping_ = true;
  exit_code_ = exit_code;
  stop_signal_ = signo;
  if (ask_for_dumps && options_.dump_wait_s > 0 && RequestDumps()) {
    dump_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(options_.dump_wait_s));
    return;
  }
  SendStopSignal();
}

void Launcher::SendStopSignal() {
  dump_deadline_.reset();
  SignalAll(stop_signal_);
  kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(options_.grace_s));
}

std::string Launcher::FlightRecordPath(const Rank& rank) const {
  return absl::StrCat(flight_dir_, "/flight.rank", rank.index, ".json");
}

// SIGUSR2 only to the processes that catch it (the library installs its dump handler when the
// program has none): for any other process SIGUSR2 would be a kill without its SIGTERM handler.
bool Launcher::RequestDumps() {
  std::set<pid_t> running;
  for (const Rank& rank : ranks_) {
    if (rank.pid > 0 && !rank.reaped) running.insert(rank.pid);
  }
  const std::map<pid_t, std::vector<pid_t>> catching = RankProcessesCatching(running, SIGUSR2);
  std::vector<int> asked;
  for (Rank& rank : ranks_) {
    auto it = catching.find(rank.pid);
    if (rank.reaped || it == catching.end()) continue;
    if (!flight_dir_.empty()) rank.dump_before = StampOf(FlightRecordPath(rank));
    for (pid_t pid : it->second) kill(pid, SIGUSR2);
    rank.dump_requested = true;
    asked.push_back(rank.index);
  }
  if (asked.empty()) return false;
  Message(absl::StrCat("asking rank(s) ", absl::StrJoin(asked, ","),
                       " for their flight records (SIGUSR2; up to ", options_.dump_wait_s,
                       "s) before ", SignalName(stop_signal_)));
  return true;
}

bool Launcher::DumpsDone() const {
  if (flight_dir_.empty()) return false;  // nothing to watch: the wait runs to its bound
  return std::all_of(ranks_.begin(), ranks_.end(), [this](const Rank& rank) {
    if (!rank.dump_requested || rank.reaped) return true;
    const std::optional<FileStamp> now = StampOf(FlightRecordPath(rank));
    return now.has_value() && now != rank.dump_before;
  });
}

void Launcher::OnRankExit(Rank& rank, int status) {
  rank.reaped = true;
  int code = 0;
  std::string how;
  if (WIFEXITED(status)) {
    code = WEXITSTATUS(status);
    how = absl::StrCat("exited with code ", code);
  } else if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    code = 128 + sig;
    how = absl::StrCat("was killed by ", SignalName(sig), " (exit code ", code, ")");
  } else {
    return;
  }
  if (code == 0 || stopping_) return;
  // Elastic: the launcher serves the store, so any rank, rank 0 included, may be restarted or lost.
  if (options_.elastic &&
      static_cast<int>(restarts_.size() + pending_restarts_.size()) < options_.max_restarts) {
    pending_restarts_.emplace_back(
        rank.index, absl::StrCat("rank ", rank.index, " (pid ", rank.pid, ") ", how));
    Message(absl::StrCat("rank ", rank.index, " ", how,
                         "; elastic: restarting it as a "
                         "replacement (restart ",
                         restarts_.size() + pending_restarts_.size(), " of ", options_.max_restarts,
                         ")"));
    return;
  }
  if (options_.elastic) {
    const int alive = static_cast<int>(
        std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return !r.reaped; }));
    if (alive >= options_.min_nproc) {
      lost_.push_back(absl::StrCat("rank ", rank.index, " (pid ", rank.pid, ") ", how));
      Message(absl::StrCat("rank ", rank.index, " ", how, "; elastic: the other ", alive,
                           " rank(s) go on without it (at least ", options_.min_nproc, " needed)"));
      return;
    }
    Message(absl::StrCat("rank ", rank.index, " ", how, "; elastic: only ", alive,
                         " rank(s) left, below --min-nproc ", options_.min_nproc));
  }
  first_failure_ = FirstFailure{rank.index, rank.pid, how};
  Message(absl::StrCat("rank ", rank.index, " ", how, "; stopping the other ranks"));
  BeginStop(SIGTERM, code, /*ask_for_dumps=*/true);
}

std::vector<std::pair<std::string, std::string>> Launcher::RankVariables(int index,
                                                                         bool replacement) const {
  const std::string world = std::to_string(options_.nproc);
  std::vector<std::pair<std::string, std::string>> overrides = {
      {"RANK", std::to_string(index)},
      {"LOCAL_RANK", std::to_string(index)},
      {"GROUP_RANK", "0"},
      {"WORLD_SIZE", world},
      {"LOCAL_WORLD_SIZE", world},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", std::to_string(port_)},
      {"ADAPTCOMM_STORE_TOKEN", token_},
  };
  if (flight_dir_created_) overrides.emplace_back("ADAPTCOMM_FLIGHT_RECORDER_DIR", flight_dir_);
  if (const std::vector<int>& cpus = rank_cpus_[static_cast<size_t>(index)]; !cpus.empty()) {
    overrides.emplace_back("ADAPTCOMM_BOUND_CPUS", CpuListText(cpus));
  }
  if (options_.elastic) {
    // The trainer's own choice (API, or an exported variable) wins.
    if (getenv("ADAPTCOMM_ELASTIC") == nullptr)
      overrides.emplace_back("ADAPTCOMM_ELASTIC", "shrink");
    if (getenv("ADAPTCOMM_ELASTIC_MIN_WORLD") == nullptr) {
      overrides.emplace_back("ADAPTCOMM_ELASTIC_MIN_WORLD", std::to_string(options_.min_nproc));
    }
    // The launcher serves the store: rank 0 connects like every other rank.
    overrides.emplace_back("ADAPTCOMM_STORE_EXTERNAL", "1");
  }
  if (replacement) overrides.emplace_back("ADAPTCOMM_ELASTIC_JOIN", "1");
  return overrides;
}

void Launcher::StartReplacements() {
  std::vector<std::pair<int, std::string>> pending;
  pending.swap(pending_restarts_);
  for (auto& [index, how] : pending) {
    if (stopping_) return;
    ranks_.emplace_back();
    const size_t slot = ranks_.size() - 1;
    if (!StartRank(slot, index, BuildEnvironment(RankVariables(index, /*replacement=*/true))) ||
        ranks_[slot].exec_errno != 0) {
      const int err = ranks_[slot].pid > 0 ? ranks_[slot].exec_errno : errno;
      Message(absl::StrCat("cannot restart rank ", index, ": ", strerror(err)));
      if (ranks_[slot].pid <= 0) ranks_.pop_back();
      first_failure_ =
          FirstFailure{index, -1, absl::StrCat("could not be restarted: ", strerror(err))};
      BeginStop(SIGTERM, 1, /*ask_for_dumps=*/false);
      return;
    }
    restarts_.push_back(absl::StrCat(how, ", restarted as pid ", ranks_[slot].pid));
  }
}

void Launcher::ReapChildren() {
  for (Rank& rank : ranks_) {
    if (rank.pid <= 0 || rank.reaped) continue;
    int status = 0;
    pid_t r;
    do {
      r = waitpid(rank.pid, &status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == rank.pid) {
      OnRankExit(rank, status);
    } else if (r < 0 && errno == ECHILD) {
      rank.reaped = true;  // cannot happen unless someone else reaped it; do not wait forever
    }
  }
}

void Launcher::ReadRank(Rank& rank, int stream) {
  char buffer[kReadChunk];
  int& fd = rank.fds[stream];
  // Bounded per wake-up so one chatty rank cannot starve the others or the signal handling.
  for (int i = 0; i < 16 && fd >= 0; ++i) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      rank.out[stream]->Feed(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    rank.out[stream]->Finish();
    close(fd);
    fd = -1;
  }
}

void Launcher::HandleSignalPipe() {
  unsigned char bytes[64];
  while (true) {
    ssize_t n = read(signal_pipe_[0], bytes, sizeof(bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    for (ssize_t i = 0; i < n; ++i) {
      int signo = bytes[i];
      if (signo == SIGCHLD) continue;  // the loop reaps on every wake-up
      if (!stopping_) {
        Message(absl::StrCat("received ", SignalName(signo), "; forwarding it to the ranks"));
        BeginStop(signo, 128 + signo, /*ask_for_dumps=*/false);
      } else {
        // An interrupt while the job is being stopped means "now": no more dumps or grace.
        Message(absl::StrCat("received ", SignalName(signo),
                             " while stopping the job; killing the ranks"));
        SignalAll(SIGKILL);
        dump_deadline_.reset();
        kill_deadline_.reset();
      }
    }
  }
}

bool Launcher::AllReaped() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.reaped; });
}

bool Launcher::AllPipesClosed() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const Rank& r) { return r.fds[0] < 0 && r.fds[1] < 0; });
}

int Launcher::Run() {
  start_ = Clock::now();
  start_wall_ = time(nullptr);
  if (std::optional<int> failed = Prepare(); failed.has_value()) return *failed;
  if (!StartRanks()) return 1;
  Supervise();
  return Finish();
}

std::optional<int> Launcher::PlanCpus() {
  // A launcher started by a bound rank: its own ranks are told their own CPUs, or none.
  unsetenv("ADAPTCOMM_BOUND_CPUS");
  const absl::StatusOr<CpuBindMode> mode = ParseCpuBindMode(options_.bind_to);
  if (!mode.ok()) {
    Message(std::string(mode.status().message()));
    return 2;
  }
  // A replacement (--max-restarts) takes the CPUs of the rank it replaces.
  const std::vector<std::vector<int>> cores = AllowedCores();
  for (int i = 0; i < options_.nproc; ++i) {
    absl::StatusOr<std::vector<int>> cpus = CpusForLocalRank(cores, *mode, i, options_.nproc);
    if (!cpus.ok()) {
      Message(absl::StrCat("--bind-to ", options_.bind_to, ": ", cpus.status().message()));
      return 2;
    }
    rank_cpus_.push_back(*std::move(cpus));
  }
  return std::nullopt;
}

std::optional<int> Launcher::Prepare() {
  if (std::optional<int> failed = PlanCpus(); failed.has_value()) return failed;
  int port = options_.master_port;
  if (port == 0 && !options_.elastic) {
    port = PickFreePort();
    if (port <= 0) {
      Message(absl::StrCat("cannot pick a free port: ", strerror(errno)));
      return 1;
    }
  }
  std::string token;
  if (const char* given = getenv("ADAPTCOMM_STORE_TOKEN"); given != nullptr) {
    token = given;
  } else {
    std::optional<std::string> fresh = RandomToken();
    if (!fresh) {
      Message("cannot read /dev/urandom for the store token");
      return 1;
    }
    token = *fresh;
  }
  if (options_.elastic) {
    // Serving the store here, the port is bound before any rank starts (port 0: the kernel picks
    // one, so no other process can take it in between).
    if (!StartStoreServer(port, token)) return 1;
    port = store_server_->port();
  }
  if (!InstallSignals()) {
    Message(absl::StrCat("cannot create the signal pipe: ", strerror(errno)));
    return 1;
  }
  if (options_.timeout_s > 0) {
    job_deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(options_.timeout_s));
  }

  // The ranks dump where the caller said, else into a directory of this job's own, so the
  // launcher knows where to look and which records are this job's.
  if (const char* given = getenv("ADAPTCOMM_FLIGHT_RECORDER_DIR"); given != nullptr && *given) {
    flight_dir_ = given;
  } else if (std::optional<std::string> made = MakeJobFlightDir(); made.has_value()) {
    flight_dir_ = *made;
    flight_dir_created_ = true;
  } else {
    Message(absl::StrCat("cannot create a flight-record directory: ", strerror(errno),
                         "; the ranks dump where their profile says"));
  }
  port_ = port;
  token_ = token;
  return std::nullopt;
}

bool Launcher::StartRanks() {
  ranks_.resize(static_cast<size_t>(options_.nproc));
  for (int i = 0; i < options_.nproc; ++i) {
    if (!StartRank(static_cast<size_t>(i), i,
                   BuildEnvironment(RankVariables(i, /*replacement=*/false)))) {
      Message(absl::StrCat("cannot start rank ", i, ": ", strerror(errno)));
      ranks_.resize(static_cast<size_t>(i));
      if (ranks_.empty()) return false;
      BeginStop(SIGTERM, 1, /*ask_for_dumps=*/false);
      break;
    }
    const Rank& rank = ranks_[static_cast<size_t>(i)];
    if (rank.exec_errno != 0) {
      // Every rank runs the same program: the others would fail the same way.
      const int code = ExecFailureExitCode(rank.exec_errno);
      first_failure_ = FirstFailure{
          i, rank.pid,
          absl::StrCat(
              "could not start: ", DescribeExecFailure(options_.command[0], rank.exec_errno),
              " (exit code ", code, ")")};
      ranks_.resize(static_cast<size_t>(i) + 1);
      BeginStop(SIGTERM, code, /*ask_for_dumps=*/false);
      break;
    }
  }
  return true;
}

void Launcher::Supervise() {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, int>> owners;  // (rank, stream) of each pipe in fds
  while (true) {
    ReapChildren();
    StartReplacements();
    Clock::time_point now = Clock::now();
    CheckDeadlines(now);
    if (AllReaped()) {
      if (!drain_deadline_) {
        drain_deadline_ = now + kDrainBound;
        // Whatever a failed job left behind must not keep the pipes (and us) alive.
        if (stopping_) SignalAll(SIGKILL);
      }
      if (AllPipesClosed() || now >= *drain_deadline_) break;
    }
    if (!PollOnce(PollTimeoutMs(now), fds, owners)) break;
  }
}

void Launcher::CheckDeadlines(Clock::time_point now) {
  if (job_deadline_ && now >= *job_deadline_ && !stopping_) {
    Message(absl::StrCat("job ran past --timeout ", options_.timeout_s,
                         "s; stopping all ranks (exit code ", kTimeoutExitCode, ")"));
    BeginStop(SIGTERM, kTimeoutExitCode, /*ask_for_dumps=*/true);
  }
  if (dump_deadline_) {
    if (DumpsDone()) {
      SendStopSignal();
    } else if (now >= *dump_deadline_) {
      std::vector<int> silent;
      for (const Rank& rank : ranks_) {
        if (rank.dump_requested && !rank.reaped) silent.push_back(rank.index);
      }
      Message(absl::StrCat("no new flight record from rank(s) ", absl::StrJoin(silent, ","),
                           " after ", options_.dump_wait_s, "s; sending ",
                           SignalName(stop_signal_)));
      SendStopSignal();
    }
  }
  if (kill_deadline_ && now >= *kill_deadline_) {
    std::vector<int> alive;
    for (const Rank& rank : ranks_) {
      if (!rank.reaped) alive.push_back(rank.index);
    }
    if (!alive.empty()) {
      Message(absl::StrCat("rank(s) ", absl::StrJoin(alive, ","), " still running after ",
                           options_.grace_s, "s grace; sending SIGKILL"));
    }
    SignalAll(SIGKILL);
    kill_deadline_.reset();
  }
}

int Launcher::PollTimeoutMs(Clock::time_point now) const {
  std::optional<Clock::time_point> wake;
  auto consider = [&wake](const std::optional<Clock::time_point>& d) {
    if (d && (!wake || *d < *wake)) wake = d;
  };
  if (!stopping_) consider(job_deadline_);
  consider(kill_deadline_);
  consider(drain_deadline_);
  if (dump_deadline_) consider(std::min(*dump_deadline_, now + kDumpCheckPeriod));
  int timeout_ms = -1;
  if (wake) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(*wake - now).count();
    timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 60 * 60 * 1000));
  }
  return timeout_ms;
}

bool Launcher::PollOnce(int timeout_ms, std::vector<pollfd>& fds,
                        std::vector<std::pair<size_t, int>>& owners) {
  fds.clear();
  owners.clear();
  fds.push_back({signal_pipe_[0], POLLIN, 0});
  for (size_t r = 0; r < ranks_.size(); ++r) {
    for (int s = 0; s < 2; ++s) {
      if (ranks_[r].fds[s] < 0) continue;
      fds.push_back({ranks_[r].fds[s], POLLIN, 0});
      owners.emplace_back(r, s);
    }
  }
  int ready = poll(fds.data(), fds.size(), timeout_ms);
  if (ready < 0) {
    if (errno == EINTR) return true;
    Message(absl::StrCat("poll failed: ", strerror(errno), "; stopping all ranks"));
    if (!stopping_) BeginStop(SIGTERM, 1, /*ask_for_dumps=*/false);
    SignalAll(SIGKILL);
    return false;
  }
  if (fds[0].revents != 0) HandleSignalPipe();
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    ReadRank(ranks_[owners[i - 1].first], owners[i - 1].second);
  }
  return true;
}

int Launcher::Finish() {
  // Leftover partial lines of streams that never reached EOF (descendants holding them).
  for (Rank& rank : ranks_) {
    for (int s = 0; s < 2; ++s) {
      if (rank.fds[s] < 0) continue;
      ReadRank(rank, s);
      if (rank.fds[s] >= 0) rank.out[s]->Finish();
    }
  }
  // Ranks that could not be reaped in the drain window after SIGKILL: reap without bound is
  // impossible to justify, so only a final non-blocking pass.
  ReapChildren();
  std::fflush(stdout);
  if (first_failure_) {
    Message(absl::StrCat("job failed: rank ", first_failure_->rank, " (pid ", first_failure_->pid,
                         ") ", first_failure_->how));
  }
  ReportFlightRecords();
  if (!first_failure_ && exit_code_ == 0 && (!lost_.empty() || !restarts_.empty())) {
    std::vector<std::string> what;
    if (!restarts_.empty()) {
      what.push_back(absl::StrCat(restarts_.size(), " restart(s) of ", options_.max_restarts, ": ",
                                  absl::StrJoin(restarts_, "; ")));
    }
    if (!lost_.empty()) what.push_back(absl::StrCat("lost: ", absl::StrJoin(lost_, "; ")));
    Message(absl::StrCat("job finished with ", options_.nproc - static_cast<int>(lost_.size()),
                         " of ", options_.nproc, " ranks (elastic; ", absl::StrJoin(what, "; "),
                         ")"));
  }
  return exit_code_;
}

void Launcher::ReportFlightRecords() {
  if (flight_dir_.empty()) return;
  // One second of slack: file times come from a coarser clock than time().
  const std::vector<int> dumped = FlightRecordRanks(flight_dir_, start_wall_ - 1);
  if (!dumped.empty()) {
    Message(absl::StrCat("flight records of rank(s) ", absl::StrJoin(dumped, ","), " in ",
                         flight_dir_, " (`adaptcomm trace culprit ", flight_dir_,
                         "` names the rank that is behind)"));
    return;
  }
  const bool asked = std::any_of(ranks_.begin(), ranks_.end(),
                                 [](const Rank& rank) { return rank.dump_requested; });
  if (asked) Message(absl::StrCat("no rank wrote a flight record into ", flight_dir_));
  // An empty directory of our own is litter (most jobs end without a dump).
  if (flight_dir_created_) rmdir(flight_dir_.c_str());
}

std::function<int()> SetupLaunch(CLI::App& sub) {
  auto options = std::make_shared<LaunchOptions>();
  AddLaunchOptions(sub, *options);
  return [options]() {
    Launcher launcher(*options);
    return launcher.Run();
  };
}

}  // namespace

ADAPTCOMM_SUBCOMMAND(launch, "Start N local ranks with torchrun variables", SetupLaunch);

}  // namespace adaptcomm::tools

// `adaptcomm launch`'s Launcher (launcher.h): the run loop, signals, deadlines, stopping the job
// and asking its ranks for flight records. One thread, one poll() loop (launch_cmd.cc says why).
#include "tools/launcher.h"

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

namespace adaptcomm::tools::launcher {
namespace {

int g_signal_pipe_write = -1;

void OnSignal(int signo) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(signo);
  (void)!write(g_signal_pipe_write, &byte, 1);
  errno = saved_errno;
}


}  // namespace

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

}  // namespace adaptcomm::tools::launcher

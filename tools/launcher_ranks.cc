// `adaptcomm launch`'s Launcher (launcher.h): starting one rank (its variables, CPUs and pipes),
// reaping it, restarting it (--max-restarts) and forwarding its output line by line.
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
#include "tools/launcher.h"

namespace adaptcomm::tools::launcher {

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

}  // namespace adaptcomm::tools::launcher

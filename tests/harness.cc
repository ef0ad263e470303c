#include "tests/harness.h"

#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/store.h"
#include "gtest/gtest.h"
#include "lib/base/log.h"

namespace adaptcomm::testing {

std::string RankModeName(RankMode mode) {
  return mode == RankMode::kThreads ? "threads" : "processes";
}

std::string BuildDir() {
  if (const char* dir = std::getenv("ADAPTCOMM_BINARY_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  char self[4096] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path(self, n > 0 ? static_cast<size_t>(n) : 0);
  path = path.substr(0, path.rfind('/'));  // .../build/tests
  return path.substr(0, path.rfind('/'));  // .../build
}

void OnThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

int OpenSockets() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (const dirent* e = readdir(dir)) {
    char target[64] = {};
    const std::string path = absl::StrCat("/proc/self/fd/", e->d_name);
    const ssize_t len = readlink(path.c_str(), target, sizeof(target) - 1);
    if (len > 0 && absl::StartsWith(target, "socket:")) ++n;
  }
  closedir(dir);
  return n;
}

int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

namespace {

CommunicatorOptions BaseOptions(int rank, int world_size) {
  CommunicatorOptions o;
  o.rank = rank;
  o.world_size = world_size;
  o.name = "test";
  o.backend = BackendChoice::kGloo;
  o.timeout = absl::Seconds(60);
  o.init_timeout = absl::Seconds(30);
  return o;
}

void RunAsThreads(int world_size, const std::function<void(const RankEnv&)>& body) {
  std::shared_ptr<Store> store = CreateHashStore();
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      log::ScopedThreadRank rank_for_logs(r);
      RankEnv env{r, world_size, BaseOptions(r, world_size)};
      env.options.store = store;
      body(env);
    });
  }
  for (auto& t : threads) t.join();
}

void RunAsProcesses(int world_size, const std::function<void(const RankEnv&)>& body,
                    absl::Duration bound) {
  std::vector<int> status = RunRankProcesses(world_size, body, bound);
  for (int r = 0; r < world_size; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)
        << "rank " << r << " process failed: "
        << (WIFEXITED(status[r]) ? absl::StrCat("exit code ", WEXITSTATUS(status[r]))
                                 : absl::StrCat("signal ", WTERMSIG(status[r])));
  }
}

}  // namespace

std::vector<int> RunRankProcesses(int world_size, const std::function<void(const RankEnv&)>& body,
                                  absl::Duration bound) {
  const int port = PickFreePort();
  std::vector<pid_t> pids;
  for (int r = 0; r < world_size; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork failed";
      break;
    }
    if (pid == 0) {
      RankEnv env{r, world_size, BaseOptions(r, world_size)};
      env.options.master_addr = "127.0.0.1";
      env.options.master_port = port;
      body(env);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(::testing::Test::HasFailure() ? 1 : 0);
    }
    pids.push_back(pid);
  }
  const absl::Time deadline = absl::Now() + bound;
  std::vector<int> status(pids.size(), -1);
  size_t remaining = pids.size();
  while (remaining > 0 && absl::Now() < deadline) {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (status[r] != -1) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        --remaining;
      }
    }
    if (remaining > 0) absl::SleepFor(absl::Milliseconds(5));
  }
  for (size_t r = 0; r < pids.size(); ++r) {
    if (status[r] != -1) continue;
    kill(pids[r], SIGKILL);
    waitpid(pids[r], &status[r], 0);
    ADD_FAILURE() << "rank " << r << " still running after " << absl::FormatDuration(bound)
                  << "; killed";
  }
  return status;
}

void RunRanks(RankMode mode, int world_size, const std::function<void(const RankEnv&)>& body,
              absl::Duration bound) {
  if (mode == RankMode::kThreads) {
    RunAsThreads(world_size, body);
  } else {
    RunAsProcesses(world_size, body, bound);
  }
}

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<double> ReadNumbers(const std::string& path) {
  std::vector<double> numbers;
  std::ifstream in(path);
  for (double v; in >> v;) numbers.push_back(v);
  return numbers;
}

int RunShell(const std::string& command) {
  const int rc = std::system(command.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace adaptcomm::testing

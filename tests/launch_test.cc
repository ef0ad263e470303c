// `adaptcomm launch`, run as a real process with small shell programs as ranks. Every wait is
// bounded: a launcher that hangs is killed and the test fails.
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/cpu_binding.h"

namespace {

using Clock = std::chrono::steady_clock;
using ::adaptcomm::AllowedCores;
using ::adaptcomm::CpuBindMode;
using ::adaptcomm::CpuListText;
using ::adaptcomm::CpusForLocalRank;
using ::testing::HasSubstr;
using ::testing::Not;

std::string LauncherPath() {
  if (const char* dir = getenv("ADAPTCOMM_BINARY_DIR"); dir != nullptr && *dir != '\0') {
    return std::string(dir) + "/tools/adaptcomm";
  }
  // Run by hand from the build tree: tests/launch_test -> tools/adaptcomm.
  char self[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path(self, n > 0 ? static_cast<size_t>(n) : 0);
  return path.substr(0, path.rfind('/')) + "/../tools/adaptcomm";
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Result {
  int code = -1;  // exit code, 128+signal for a signal death, -1 if it had to be killed
  std::string out;
  std::string err;
  double seconds = 0;
};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The launcher as a child process with captured stdout/stderr.
class LauncherProcess {
 public:
  // env: variables to set (value) or unset (nullopt) in the launcher's environment.
  LauncherProcess(const std::vector<std::string>& args,
                  const std::vector<std::pair<std::string, std::optional<std::string>>>& env = {}) {
    start_ = Clock::now();
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2 failed";
      return;
    }
    std::string binary = LauncherPath();
    std::vector<std::string> argv_storage = {binary, "launch"};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      unsetenv("ADAPTCOMM_STORE_TOKEN");
      for (const auto& [name, value] : env) {
        if (value) {
          setenv(name.c_str(), value->c_str(), 1);
        } else {
          unsetenv(name.c_str());
        }
      }
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(99);
    }
    close(out[1]);
    close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
  }
  ~LauncherProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }

  pid_t pid() const { return pid_; }
  const std::string& out() const { return text_[0]; }
  const std::string& err() const { return text_[1]; }

  // Reads output until `done()` holds or both streams end; false if `seconds` passed first.
  bool ReadUntil(const std::function<bool()>& done, double seconds) {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds));
    while (!done()) {
      std::vector<pollfd> fds;
      std::vector<int> streams;
      for (int s = 0; s < 2; ++s) {
        if (fds_[s] < 0) continue;
        fds.push_back({fds_[s], POLLIN, 0});
        streams.push_back(s);
      }
      if (fds.empty()) return false;
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      if (poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) return false;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        int s = streams[i];
        char buffer[65536];
        ssize_t n = read(fds_[s], buffer, sizeof(buffer));
        if (n > 0) {
          text_[s].append(buffer, static_cast<size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          close(fds_[s]);
          fds_[s] = -1;
        }
      }
    }
    return true;
  }

  // Reads to EOF and reaps, within `seconds` from now; a launcher still running then is killed.
  Result Finish(double seconds) {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds));
    Result result;
    ReadUntil([] { return false; }, seconds);  // false at EOF of both streams or at the bound
    while (!reaped_) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (Clock::now() >= deadline) {
        ADD_FAILURE() << "launcher still running after " << seconds << " s; killing it";
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        reaped_ = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    result.seconds = SecondsSince(start_);
    result.out = text_[0];
    result.err = text_[1];
    return result;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int fds_[2] = {-1, -1};
  std::string text_[2];
  Clock::time_point start_;
};

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef ADAPTCOMM_HAVE_TOOL
    GTEST_SKIP() << "the adaptcomm tool is not built (ADAPTCOMM_BUILD_TOOLS=OFF)";
#endif
    ASSERT_EQ(access(LauncherPath().c_str(), X_OK), 0) << LauncherPath() << " is not built";
  }
};

Result RunLauncher(const std::vector<std::string>& args,
                   const std::vector<std::pair<std::string, std::optional<std::string>>>& env = {},
                   double bound_seconds = 20) {
  LauncherProcess process(args, env);
  return process.Finish(bound_seconds);
}

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/launch_test.XXXXXX";
    char* made = mkdtemp(tmpl);
    EXPECT_NE(made, nullptr);
    if (made != nullptr) path_ = made;
  }
  ~TempDir() {
    if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool ProcessGone(pid_t pid, double seconds) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(seconds));
  while (Clock::now() < deadline) {
    // A zombie still answers kill(0); /proc tells it apart.
    std::string stat_path = "/proc/" + std::to_string(pid) + "/stat";
    FILE* f = fopen(stat_path.c_str(), "r");
    if (f == nullptr) return true;
    char line[512] = {};
    size_t n = fread(line, 1, sizeof(line) - 1, f);
    fclose(f);
    std::string stat(line, n);
    size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST_F(LaunchTest, HelpExitsZero) {
  Result r = RunLauncher({"--help"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--nproc"));
  EXPECT_THAT(r.out, HasSubstr("--master-port"));
  EXPECT_THAT(r.out, HasSubstr("--timeout"));
}

TEST_F(LaunchTest, RejectsBadArguments) {
  EXPECT_NE(RunLauncher({"--", "true"}).code, 0);             // no -n
  EXPECT_NE(RunLauncher({"-n", "0", "--", "true"}).code, 0);  // no ranks
  EXPECT_NE(RunLauncher({"-n", "2"}).code, 0);                // no program
}

TEST_F(LaunchTest, EachRankGetsTorchrunVariables) {
  constexpr int kRanks = 4;
  Result r = RunLauncher(
      {"-n", std::to_string(kRanks), "--", "sh", "-c",
       "echo \"ENV $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
       "$ADAPTCOMM_STORE_TOKEN\""},
      {{"MASTER_ADDR", "10.9.8.7"}, {"RANK", "77"}});
  ASSERT_EQ(r.code, 0) << r.err;
  std::regex pattern(R"(\[rank (\d+)\] ENV (\d+) (\d+) (\d+) (\d+) (\S+) (\d+) ([0-9a-f]+))");
  std::set<int> ranks;
  std::set<std::string> ports, tokens;
  for (const std::string& line : Lines(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << "line: " << line;
    int prefix_rank = std::stoi(m[1]);
    EXPECT_EQ(std::stoi(m[2]), prefix_rank);  // RANK matches the prefix
    EXPECT_EQ(std::stoi(m[3]), kRanks);       // WORLD_SIZE
    EXPECT_EQ(std::stoi(m[4]), prefix_rank);  // LOCAL_RANK
    EXPECT_EQ(std::stoi(m[5]), kRanks);       // LOCAL_WORLD_SIZE
    EXPECT_EQ(m[6], "127.0.0.1");             // the caller's MASTER_ADDR is replaced
    int port = std::stoi(m[7]);
    EXPECT_GT(port, 0);
    EXPECT_LT(port, 65536);
    EXPECT_EQ(m[8].length(), 32u);  // 16 random bytes in hex
    ranks.insert(prefix_rank);
    ports.insert(m[7]);
    tokens.insert(m[8]);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(ports.size(), 1u) << "every rank must see the same MASTER_PORT";
  EXPECT_EQ(tokens.size(), 1u) << "every rank must see the same token";
}

// With a core per rank, each rank runs on cores of its own (the threads and processes it starts
// too) and is told which in ADAPTCOMM_BOUND_CPUS; --bind-to none leaves every rank the launcher's
// CPUs; core with more ranks than cores is refused before anything starts.
TEST_F(LaunchTest, EachRankRunsOnCoresOfItsOwnWhenThereAreEnough) {
  const std::vector<std::vector<int>> cores = AllowedCores();
  if (cores.size() < 2) GTEST_SKIP() << "needs 2 cores, this process may use " << cores.size();
  const std::string report =
      "echo \"$ADAPTCOMM_BOUND_CPUS|$(sh -c 'grep Cpus_allowed_list /proc/self/status' | cut "
      "-f2)\"";
  Result bound = RunLauncher({"-n", "2", "--", "sh", "-c", report});
  ASSERT_EQ(bound.code, 0) << bound.err;
  std::vector<std::string> lines = Lines(bound.out);
  std::sort(lines.begin(), lines.end());
  const std::string rank0 = CpuListText(*CpusForLocalRank(cores, CpuBindMode::kCore, 0, 2));
  const std::string rank1 = CpuListText(*CpusForLocalRank(cores, CpuBindMode::kCore, 1, 2));
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank 0] " + rank0 + "|" + rank0,
                                             "[rank 1] " + rank1 + "|" + rank1}));

  std::vector<int> all;
  for (const std::vector<int>& core : cores) all.insert(all.end(), core.begin(), core.end());
  Result unbound = RunLauncher({"-n", "2", "--bind-to", "none", "--", "sh", "-c", report});
  ASSERT_EQ(unbound.code, 0) << unbound.err;
  for (const std::string& line : Lines(unbound.out)) {
    EXPECT_THAT(line, ::testing::EndsWith("] |" + CpuListText(all)));
  }

  const std::string too_many = std::to_string(cores.size() + 1);
  Result refused = RunLauncher({"-n", too_many, "--bind-to", "core", "--", "true"});
  EXPECT_EQ(refused.code, 2);
  EXPECT_THAT(refused.err, HasSubstr("--bind-to core: " + too_many + " ranks on this host but " +
                                     std::to_string(cores.size()) + " core(s) to run on"));
  EXPECT_TRUE(refused.out.empty()) << "a rank started: " << refused.out;
}

TEST_F(LaunchTest, GivenPortAndTokenAreKept) {
  Result r = RunLauncher({"-n", "2", "--master-port", "29517", "--", "sh", "-c",
                          "echo \"$MASTER_PORT $ADAPTCOMM_STORE_TOKEN\""},
                         {{"ADAPTCOMM_STORE_TOKEN", "sekrit42"}});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines,
            (std::vector<std::string>{"[rank 0] 29517 sekrit42", "[rank 1] 29517 sekrit42"}));
}

TEST_F(LaunchTest, EachJobGetsAFreshToken) {
  std::vector<std::string> args = {"-n", "1", "--", "sh", "-c", "echo $ADAPTCOMM_STORE_TOKEN"};
  Result a = RunLauncher(args);
  Result b = RunLauncher(args);
  ASSERT_EQ(a.code, 0);
  ASSERT_EQ(b.code, 0);
  ASSERT_EQ(a.out.size(), std::string("[rank 0] ").size() + 32 + 1) << a.out;
  EXPECT_NE(a.out, b.out);
}

TEST_F(LaunchTest, StdoutAndStderrArePrefixedSeparately) {
  Result r = RunLauncher(
      {"-n", "3", "--", "sh", "-c", "echo out-$RANK; echo err-$RANK >&2; printf tail-$RANK"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> out = Lines(r.out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out,
            (std::vector<std::string>{"[rank 0] out-0", "[rank 0] tail-0", "[rank 1] out-1",
                                      "[rank 1] tail-1", "[rank 2] out-2", "[rank 2] tail-2"}));
  // The partial last line is flushed with a newline, not glued to another rank's line.
  EXPECT_EQ(r.out.back(), '\n');
  std::vector<std::string> err = Lines(r.err);
  std::sort(err.begin(), err.end());
  EXPECT_EQ(err, (std::vector<std::string>{"[rank 0] err-0", "[rank 1] err-1", "[rank 2] err-2"}));
}

TEST_F(LaunchTest, NoPrefixPassesOutputThrough) {
  Result r = RunLauncher({"-n", "1", "--no-prefix", "--", "sh", "-c", "echo hello; printf tail"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "hello\ntail");
}

TEST_F(LaunchTest, LinesOfRanksNeverInterleave) {
  constexpr int kRanks = 4;
  constexpr int kLines = 200;
  constexpr int kHalf = 1500;
  // Each line is written in two pieces so the launcher sees it split across reads.
  std::string script = "h=$(printf '%" + std::to_string(kHalf) +
                       "s' '' | tr ' ' \"$RANK\"); i=0; while [ $i -lt " + std::to_string(kLines) +
                       " ]; do printf '%s' \"$h\"; printf '%s\\n' \"$h\"; i=$((i+1)); done";
  Result r = RunLauncher({"-n", std::to_string(kRanks), "--", "sh", "-c", script});
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<int, int> count;
  for (const std::string& line : Lines(r.out)) {
    ASSERT_EQ(line.size(), std::string("[rank 0] ").size() + 2 * kHalf) << line.substr(0, 40);
    ASSERT_EQ(line.compare(0, 6, "[rank "), 0);
    char digit = line[6];
    ASSERT_EQ(line.substr(7, 2), "] ");
    ASSERT_EQ(line.find_first_not_of(digit, 9), std::string::npos)
        << "line of rank " << digit << " holds another rank's bytes";
    ++count[digit - '0'];
  }
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_EQ(count[rank], kLines) << "rank " << rank;
}

TEST_F(LaunchTest, AllRanksSucceedMeansZero) {
  Result r = RunLauncher({"-n", "4", "--", "true"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(LaunchTest, FailingRankEndsTheOthersAndGivesItsCode) {
  TempDir dir;
  // Ranks 0 and 2 sleep in a child of their shell: ending them needs the process-group signal.
  std::string script =
      "if [ $RANK = 1 ]; then i=0; while [ $i -lt 200 ] && ! [ -f " + dir.path() + "/pid.0 -a -f " +
      dir.path() + "/pid.2 ]; do sleep 0.02; i=$((i+1)); done; exit 3; fi; sleep 30 & echo $! > " +
      dir.path() + "/pid.$RANK; wait";
  Result r = RunLauncher({"-n", "3", "--", "sh", "-c", script});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_LT(r.seconds, 4.5) << "the sleeping ranks were not ended within the grace bound";
  EXPECT_THAT(r.err, HasSubstr("rank 1 exited with code 3"));
  for (int rank : {0, 2}) {
    FILE* f = fopen((dir.path() + "/pid." + std::to_string(rank)).c_str(), "r");
    ASSERT_NE(f, nullptr) << "rank " << rank << " never started its sleep";
    int pid = 0;
    EXPECT_EQ(fscanf(f, "%d", &pid), 1);
    fclose(f);
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(ProcessGone(pid, 2.0)) << "grandchild sleep of rank " << rank << " survived";
  }
}

// --elastic --max-restarts (#14 item 4): a rank other than 0 that dies is started again with the
// same RANK and WORLD_SIZE and ADAPTCOMM_ELASTIC_JOIN=1, up to N times in all; once they are used
// up, the next death shrinks the job as before; the last line says how the job finished.
TEST_F(LaunchTest, ElasticRestartsADeadRankAsAReplacement) {
  TempDir dir;
  // Rank 2 dies (SIGKILL) unless it is the replacement; the others wait for the replacement.
  const std::string script =
      "if [ $RANK = 2 ] && [ -z \"$ADAPTCOMM_ELASTIC_JOIN\" ]; then kill -9 $$; fi; "
      "if [ $RANK = 2 ]; then echo \"JOINED $RANK $WORLD_SIZE $ADAPTCOMM_ELASTIC_JOIN "
      "$ADAPTCOMM_ELASTIC\"; touch " +
      dir.path() +
      "/joined; exit 0; fi; "
      "i=0; while [ $i -lt 200 ] && ! [ -f " +
      dir.path() +
      "/joined ]; do sleep 0.02; "
      "i=$((i+1)); done; [ -f " +
      dir.path() + "/joined ]";
  Result r = RunLauncher({"--elastic", "--max-restarts", "1", "-n", "4", "--", "sh", "-c", script});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank 2] JOINED 2 4 1 shrink"));
  EXPECT_THAT(r.err, HasSubstr("rank 2 was killed by SIGKILL (exit code 137); elastic: restarting "
                               "it as a replacement (restart 1 of 1)"));
  const std::string last = r.err.substr(r.err.rfind("adaptcomm launch: "));
  EXPECT_THAT(last, HasSubstr("job finished with 4 of 4 ranks (elastic; 1 restart(s) of 1: rank 2 "
                              "(pid "));
  EXPECT_THAT(last, HasSubstr("was killed by SIGKILL (exit code 137), restarted as pid "));
}

TEST_F(LaunchTest, ElasticRestartsRunOutThenTheJobShrinks) {
  // Rank 1 always dies: restarted once, then lost; the others finish.
  const std::string script = "if [ $RANK = 1 ]; then exit 5; fi; sleep 0.5";
  Result r = RunLauncher({"--elastic", "--max-restarts", "1", "-n", "3", "--", "sh", "-c", script});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("restarting it as a replacement (restart 1 of 1)"));
  EXPECT_THAT(r.err, HasSubstr("rank 1 exited with code 5; elastic: the other 2 rank(s) go on"));
  const std::string last = r.err.substr(r.err.rfind("adaptcomm launch: "));
  EXPECT_THAT(last,
              HasSubstr("job finished with 2 of 3 ranks (elastic; 1 restart(s) of 1: rank 1"));
  EXPECT_THAT(last, HasSubstr("; lost: rank 1 (pid "));
}

// --elastic: the launcher serves the store on MASTER_PORT (a rank that is a shell can connect to
// it: no rank serves it) and tells the ranks so (ADAPTCOMM_STORE_EXTERNAL=1); without --elastic
// nothing changes (rank 0 serves it: the port is closed while the ranks are shells).
TEST_F(LaunchTest, ElasticLauncherServesTheStoreAndTellsTheRanks) {
  const std::string script =
      "if (exec 3<>/dev/tcp/127.0.0.1/$MASTER_PORT) 2>/dev/null; then s=open; else s=closed; fi; "
      "echo \"STORE $RANK ${ADAPTCOMM_STORE_EXTERNAL:--} $s\"";
  Result r = RunLauncher({"--elastic", "-n", "2", "--", "bash", "-c", script});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines,
            (std::vector<std::string>{"[rank 0] STORE 0 1 open", "[rank 1] STORE 1 1 open"}));
  r = RunLauncher({"-n", "2", "--", "bash", "-c", script});
  ASSERT_EQ(r.code, 0) << r.err;
  lines = Lines(r.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines,
            (std::vector<std::string>{"[rank 0] STORE 0 - closed", "[rank 1] STORE 1 - closed"}));
}

// With the store in the launcher, rank 0 is a rank like the others: its death leaves the others
// running, and with --max-restarts it is started again as a replacement.
TEST_F(LaunchTest, ElasticGoesOnWithoutRankZero) {
  const std::string script = "if [ $RANK = 0 ]; then exit 4; fi; sleep 0.5";
  Result r = RunLauncher({"--elastic", "-n", "3", "--", "sh", "-c", script});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 0 exited with code 4; elastic: the other 2 rank(s) go on"));
  const std::string last = r.err.substr(r.err.rfind("adaptcomm launch: "));
  EXPECT_THAT(last, HasSubstr("job finished with 2 of 3 ranks (elastic; lost: rank 0 (pid "));
}

TEST_F(LaunchTest, ElasticRestartsRankZeroAsAReplacement) {
  TempDir dir;
  const std::string script =
      "if [ $RANK = 0 ] && [ -z \"$ADAPTCOMM_ELASTIC_JOIN\" ]; then kill -9 $$; fi; "
      "if [ $RANK = 0 ]; then echo \"JOINED $RANK $WORLD_SIZE $ADAPTCOMM_ELASTIC_JOIN "
      "$ADAPTCOMM_STORE_EXTERNAL\"; touch " +
      dir.path() + "/joined; exit 0; fi; i=0; while [ $i -lt 200 ] && ! [ -f " + dir.path() +
      "/joined ]; do sleep 0.02; i=$((i+1)); done; [ -f " + dir.path() + "/joined ]";
  Result r = RunLauncher({"--elastic", "--max-restarts", "1", "-n", "3", "--", "sh", "-c", script});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank 0] JOINED 0 3 1 1"));
  EXPECT_THAT(r.err, HasSubstr("rank 0 was killed by SIGKILL (exit code 137); elastic: restarting "
                               "it as a replacement (restart 1 of 1)"));
  const std::string last = r.err.substr(r.err.rfind("adaptcomm launch: "));
  EXPECT_THAT(last, HasSubstr("job finished with 3 of 3 ranks (elastic; 1 restart(s) of 1: rank 0 "
                              "(pid "));
}

// Below --min-nproc the job ends as before, rank 0 or not.
TEST_F(LaunchTest, ElasticLossOfRankZeroBelowTheMinimumEndsTheJob) {
  const std::string script = "if [ $RANK = 0 ]; then exit 4; fi; sleep 5";
  Result r = RunLauncher({"--elastic", "--min-nproc", "2", "-n", "2", "--", "sh", "-c", script});
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 0 exited with code 4; elastic: only 1 rank(s) left, below "
                               "--min-nproc 2"));
  EXPECT_THAT(r.err, HasSubstr("job failed: rank 0 (pid "));
}

TEST_F(LaunchTest, RankIgnoringSigtermIsKilledAfterGrace) {
  TempDir dir;
  std::string ready = dir.path() + "/ready";
  std::string script = "if [ $RANK = 0 ]; then i=0; while [ $i -lt 250 ] && ! [ -f " + ready +
                       " ]; do sleep 0.02; i=$((i+1)); done; exit 5; fi; trap '' TERM; touch " +
                       ready + "; sleep 30";
  Result r = RunLauncher({"-n", "2", "--grace", "1", "--", "sh", "-c", script});
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_GE(r.seconds, 0.9) << "SIGKILL came before the grace period ended";
  EXPECT_LT(r.seconds, 5.0) << "SIGKILL did not follow the grace period";
  EXPECT_THAT(r.err, HasSubstr("sending SIGKILL"));
}

TEST_F(LaunchTest, SignalDeathGives128PlusSignal) {
  Result killed = RunLauncher(
      {"-n", "2", "--", "sh", "-c", "if [ $RANK = 1 ]; then kill -KILL $$; fi; exec sleep 30"});
  EXPECT_EQ(killed.code, 128 + SIGKILL) << killed.err;
  EXPECT_THAT(killed.err, HasSubstr("rank 1 was killed by SIGKILL"));
  EXPECT_LT(killed.seconds, 4.5);

  Result usr1 = RunLauncher(
      {"-n", "2", "--", "sh", "-c", "if [ $RANK = 0 ]; then kill -USR1 $$; fi; exec sleep 30"});
  EXPECT_EQ(usr1.code, 128 + SIGUSR1) << usr1.err;
  EXPECT_THAT(usr1.err, HasSubstr("rank 0 was killed by SIGUSR1"));
}

TEST_F(LaunchTest, TimeoutEndsTheJobWith124) {
  Result r = RunLauncher({"-n", "2", "--timeout", "1", "--", "sh", "-c", "sleep 30"});
  EXPECT_EQ(r.code, 124) << r.err;
  EXPECT_GE(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 4.0);
  EXPECT_THAT(r.err, HasSubstr("--timeout"));
}

TEST_F(LaunchTest, SigtermIsForwardedToTheRanks) {
  LauncherProcess process({"-n", "2", "--", "sh", "-c",
                           "trap 'echo got-term; exit 0' TERM; echo ready; sleep 30 & wait"});
  ASSERT_TRUE(process.ReadUntil(
      [&] {
        return process.out().find("[rank 0] ready") != std::string::npos &&
               process.out().find("[rank 1] ready") != std::string::npos;
      },
      10))
      << process.out();
  auto sent = Clock::now();
  kill(process.pid(), SIGTERM);
  Result r = process.Finish(10);
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
  EXPECT_LT(SecondsSince(sent), 3.0);
  // The ranks' own handlers ran: the signal reached them, not just a SIGKILL.
  EXPECT_THAT(r.out, HasSubstr("[rank 0] got-term"));
  EXPECT_THAT(r.out, HasSubstr("[rank 1] got-term"));
}

TEST_F(LaunchTest, SigintIsForwardedToTheRanks) {
  LauncherProcess process({"-n", "2", "--", "sh", "-c", "echo ready; exec sleep 30"});
  ASSERT_TRUE(process.ReadUntil(
      [&] {
        return process.out().find("[rank 0] ready") != std::string::npos &&
               process.out().find("[rank 1] ready") != std::string::npos;
      },
      10));
  kill(process.pid(), SIGINT);
  Result r = process.Finish(10);
  EXPECT_EQ(r.code, 128 + SIGINT) << r.err;
  EXPECT_LT(r.seconds, 8.0);
  EXPECT_THAT(r.err, Not(HasSubstr("sending SIGKILL")));
}

TEST_F(LaunchTest, MissingProgramIs127) {
  Result r = RunLauncher({"-n", "2", "--", "/nonexistent/adaptcomm-no-such-program"});
  EXPECT_EQ(r.code, 127);
  EXPECT_THAT(r.err, HasSubstr("cannot execute"));
}

// Issue #11 item 12: a failed exec left the child with the launcher's signal handlers, so the
// launcher's own SIGTERM to that child came back as "received SIGTERM again".
TEST_F(LaunchTest, ProgramThatCannotBeExecutedIsNamedAs126) {
  TempDir dir;
  const std::string plain_file = dir.path() + "/not-executable";
  FILE* f = fopen(plain_file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("#!/bin/sh\necho ran\n", f);
  fclose(f);
  ASSERT_EQ(chmod(plain_file.c_str(), 0644), 0);
  const std::pair<std::string, std::string> cases[] = {{dir.path(), "Is a directory"},
                                                       {plain_file, "Permission denied"}};
  for (const auto& [program, why] : cases) {
    SCOPED_TRACE(program);
    Result r = RunLauncher({"-n", "4", "--", program});
    EXPECT_EQ(r.code, 126) << r.err;
    EXPECT_THAT(r.err, HasSubstr("job failed: rank 0"));
    EXPECT_THAT(r.err, HasSubstr("cannot execute '" + program + "': " + why + " (exit code 126)"));
    EXPECT_THAT(r.err, Not(HasSubstr("received"))) << "no signal was sent to the launcher";
    EXPECT_EQ(r.out, "");
  }
}

#ifdef ADAPTCOMM_HAVE_TRAINER
std::string TrainerPath() {
  std::string launcher = LauncherPath();
  return launcher.substr(0, launcher.rfind("/tools/")) + "/examples/adaptcomm_trainer";
}

std::string ReadText(const std::string& path) {
  std::string text;
  if (FILE* f = fopen(path.c_str(), "r"); f != nullptr) {
    char buffer[4096];
    for (size_t n; (n = fread(buffer, 1, sizeof(buffer), f)) > 0;) text.append(buffer, n);
    fclose(f);
  }
  return text;
}

// stdout of a shell command and its exit code.
std::pair<std::string, int> RunShell(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return {out, -1};
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), p)) > 0;) out.append(buffer, n);
  int status = pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// 3 trainer ranks (adaptcomm over gloo, training until killed), each writing its pid to DIR.
std::vector<std::string> TrainerJob(const std::string& dir, std::vector<std::string> options) {
  options.insert(options.end(), {"--", "sh", "-c",
                                 "echo $$ > " + dir + "/pid.$RANK; exec " + TrainerPath() +
                                     " --samples 3000 --steps 100000000 --log-every 100000000"});
  return options;
}

bool AllRanksTraining(const LauncherProcess& process) {
  for (int rank = 0; rank < 3; ++rank) {
    std::string created = "communicator 'default' rank " + std::to_string(rank) + " of 3";
    if (process.err().find(created) == std::string::npos) return false;
  }
  return true;
}

// The per-job flight-record directory the launcher names at the end.
std::string NamedFlightDir(const std::string& err) {
  std::smatch m;
  std::regex named(R"(flight records of rank\(s\) [0-9,]+ in (\S+) )");
  return std::regex_search(err, m, named) ? m[1].str() : "";
}

// Issue #11 item 8: a rank dies while the others wait for it in a collective. The launcher used
// to SIGTERM the survivors at once and they left no flight record for `trace culprit`.
TEST_F(LaunchTest, RankDeathLeavesTheSurvivorsFlightRecords) {
  TempDir dir;
  LauncherProcess process(
      TrainerJob(dir.path(), {"-n", "3"}),
      {{"TMPDIR", dir.path()}, {"ADAPTCOMM_FLIGHT_RECORDER_DIR", std::nullopt}});
  ASSERT_TRUE(process.ReadUntil([&] { return AllRanksTraining(process); }, 30)) << process.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // well into the training loop
  const pid_t victim = std::stoi(ReadText(dir.path() + "/pid.2"));
  // Stopped first, so ranks 0 and 1 are blocked in an allreduce waiting for it when it dies.
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto killed = Clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  Result r = process.Finish(30);
  const double seconds_after_kill = SecondsSince(killed);
  std::printf("launcher ended %.3f s after rank 2 was killed\n", seconds_after_kill);
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.err;
  EXPECT_LT(seconds_after_kill, 3.0) << "the dumps took longer than they should";
  EXPECT_THAT(r.err, HasSubstr("job failed: rank 2 (pid " + std::to_string(victim) +
                               ") was killed by SIGKILL (exit code 137)"));
  const std::string flight_dir = NamedFlightDir(r.err);
  ASSERT_THAT(flight_dir, HasSubstr(dir.path() + "/adaptcomm-flight-")) << r.err;
  for (int rank : {0, 1}) {
    std::string record = ReadText(flight_dir + "/flight.rank" + std::to_string(rank) + ".json");
    EXPECT_THAT(record, HasSubstr("allreduce")) << "no flight record of rank " << rank;
  }
  auto [culprit, code] = RunShell(LauncherPath() + " trace culprit " + flight_dir);
  EXPECT_EQ(code, 0) << culprit;
  EXPECT_THAT(culprit, HasSubstr("dumps from 2 rank(s)"));
  EXPECT_THAT(culprit, HasSubstr("no dump: rank 2"));
}

// Ranks that notice nothing (a hung job ended by --timeout) dump only because the launcher asks:
// every record says it was requested by SIGUSR2, and the given directory is used as is.
TEST_F(LaunchTest, TimeoutAsksEveryRankForItsFlightRecord) {
  TempDir dir;
  Result r = RunLauncher(TrainerJob(dir.path(), {"-n", "3", "--timeout", "5"}),
                         {{"ADAPTCOMM_FLIGHT_RECORDER_DIR", dir.path()}}, 30);
  EXPECT_EQ(r.code, 124) << r.err;
  EXPECT_LT(r.seconds, 8.0);
  EXPECT_THAT(r.err, HasSubstr("asking rank(s) 0,1,2 for their flight records"));
  EXPECT_THAT(r.err, HasSubstr("flight records of rank(s) 0,1,2 in " + dir.path()));
  for (int rank : {0, 1, 2}) {
    std::string record = ReadText(dir.path() + "/flight.rank" + std::to_string(rank) + ".json");
    EXPECT_THAT(record, HasSubstr("dump requested (SIGUSR2)")) << "rank " << rank;
  }
}
#endif  // ADAPTCOMM_HAVE_TRAINER

}  // namespace

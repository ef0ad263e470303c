// `adaptcomm bench`, run as the built command: help, a tiny 2-rank run whose JSON carries every
// field with consistent numbers, argument errors (exit 2, naming the bad token) and a planted
// wrong result (exit 1). Every run is bounded by timeout(1).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/harness.h"
#include "tests/sanitizer_build.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int code = -1;
  std::string out, err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `adaptcomm <args>` with stdout and stderr captured, killed after 120 s; shell_prefix runs
// before it in the same shell.
Result RunCli(const std::string& args, const std::string& shell_prefix = "") {
  const std::string bin = adaptcomm::testing::BuildDir() + "/tools/adaptcomm";
  const std::string dir = ::testing::TempDir();
  // Per process: ctest runs the tests of this file in parallel processes.
  const std::string stem = absl::StrCat(dir, "/tools_bench_", getpid());
  const std::string out = stem + "_out.txt", err = stem + "_err.txt";
  const std::string cmd =
      absl::StrCat(shell_prefix, "ADAPTCOMM_LOG_LEVEL=warning timeout -k 5 120 ", bin, " ", args,
                   " > ", out, " 2> ", err);
  const int rc = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

TEST(BenchCommand, HelpNamesTheOptions) {
  Result r = RunCli("bench --help");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* opt : {"--ranks", "--ops", "--sizes", "--iters", "--warmup", "--dtype",
                          "--backend", "--timeout", "--json"}) {
    EXPECT_THAT(r.out, HasSubstr(opt));
  }
  Result top = RunCli("--help");
  EXPECT_THAT(top.out, HasSubstr("bench"));
}

TEST(BenchCommand, TinyTwoRankRunReportsEveryOpAsJson) {
  Result r = RunCli("bench --ranks 2 --sizes 4KiB --iters 3 --warmup 1 --backend gloo --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["ranks"], 2);
  EXPECT_EQ(j["mode"], "threads");
  EXPECT_EQ(j["backend"], "gloo");
  EXPECT_EQ(j["dtype"], "f32");
  EXPECT_EQ(j["iters"], 3);
  EXPECT_EQ(j["verified"], true);
  ASSERT_TRUE(j["results"].is_array());
  ASSERT_EQ(j["results"].size(), 4u);
  // nccl-tests' busbw factors for 2 ranks.
  const std::map<std::string, double> factor = {
      {"allreduce", 1.0}, {"allgather", 0.5}, {"broadcast", 1.0}, {"reduce_scatter", 0.5}};
  std::set<std::string> seen;
  for (const auto& row : j["results"]) {
    const std::string op = row["op"];
    ASSERT_EQ(factor.count(op), 1u) << op;
    seen.insert(op);
    EXPECT_EQ(row["bytes"], 4096) << op;
    EXPECT_EQ(row["count"], 1024) << op;
    EXPECT_EQ(row["verified"], true) << op;
    const double median = row["median_us"], p10 = row["p10_us"], p90 = row["p90_us"];
    EXPECT_GT(p10, 0) << op;
    EXPECT_LE(p10, median) << op;
    EXPECT_LE(median, p90) << op;
    EXPECT_LE(row["min_us"].get<double>(), p10) << op;
    EXPECT_GE(row["max_us"].get<double>(), p90) << op;
    const double algbw = row["algbw_gbps"], busbw = row["busbw_gbps"];
    EXPECT_GT(algbw, 0) << op;
    EXPECT_NEAR(algbw, 4096 / (median * 1e-6) / 1e9, algbw * 1e-9) << op;
    EXPECT_NEAR(busbw, algbw * factor.at(op), algbw * 1e-9) << op;
  }
  EXPECT_EQ(seen.size(), 4u);
}

// Reduced precision with 3 ranks (block sizes that do not divide the size evenly): the element
// checks pass, and the size is rounded down to whole blocks.
TEST(BenchCommand, HalfPrecisionOnThreeRanksVerifies) {
  for (const char* dtype : {"bf16", "f16"}) {
    Result r =
        RunCli(absl::StrCat("bench --ranks 3 --sizes 1KiB --iters 1 --warmup 0 --backend gloo "
                            "--ops allreduce,reduce_scatter,allgather --json --dtype ",
                            dtype));
    ASSERT_EQ(r.code, 0) << dtype << "\n" << r.out << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j["dtype"], dtype);
    ASSERT_EQ(j["results"].size(), 3u);
    EXPECT_EQ(j["results"][0]["bytes"], 1024);  // allreduce: the whole buffer
    EXPECT_EQ(j["results"][1]["bytes"], 1020);  // 170 elements per rank x 3 x 2 bytes
    EXPECT_EQ(j["results"][2]["count"], 510);
  }
}

TEST(BenchCommand, BadArgumentsExitTwoNamingTheToken) {
  Result size = RunCli("bench --ranks 2 --sizes 4KiB,12QB");
  EXPECT_EQ(size.code, 2);
  EXPECT_THAT(size.err, HasSubstr("'12QB'"));
  Result zero = RunCli("bench --ranks 2 --sizes 0");
  EXPECT_EQ(zero.code, 2);
  EXPECT_THAT(zero.err, HasSubstr("'0'"));
  Result op = RunCli("bench --ranks 2 --ops allreduce,alltoal");
  EXPECT_EQ(op.code, 2);
  EXPECT_THAT(op.err, HasSubstr("'alltoal'"));
  Result dtype = RunCli("bench --ranks 2 --dtype f64");
  EXPECT_EQ(dtype.code, 2);
  EXPECT_THAT(dtype.err, HasSubstr("'f64'"));
  // Neither --ranks nor a launcher: told how to run it.
  Result alone = RunCli("bench --sizes 4KiB");
  EXPECT_EQ(alone.code, 2);
  EXPECT_THAT(alone.err, HasSubstr("--ranks N"));
}

// A wrong element on one rank fails the command on every rank, naming the rank and element.
TEST(BenchCommand, WrongResultFailsTheCommand) {
  Result r = RunCli(
      "bench --ranks 2 --sizes 4KiB --iters 1 --ops reduce_scatter --backend gloo "
      "--inject-corruption 1 --json");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("wrong result: rank 1: 1 wrong element(s) (first: element 256"));
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["ok"], false);
  EXPECT_THAT(j["error"].get<std::string>(), HasSubstr("wrong result"));
}

// Under the launcher each process is one rank; rank 0 reports.
TEST(BenchCommand, RunsUnderTheLauncher) {
  const std::string bin = adaptcomm::testing::BuildDir() + "/tools/adaptcomm";
  Result r = RunCli(absl::StrCat("launch -n 2 --timeout 100 -- ", bin,
                                 " bench --sizes 4KiB --iters 2 --ops allreduce --backend gloo"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 rank(s) (launched), backend gloo"));
  EXPECT_THAT(r.out, HasSubstr("allreduce"));
  EXPECT_THAT(r.out, HasSubstr("4 KiB"));
}

// --backend nccl measures NCCL or fails naming why: no silent Gloo numbers.
TEST(BenchCommand, NcclWithoutAGpuFailsInsteadOfFallingBack) {
  if (access("/dev/nvidia0", F_OK) == 0) GTEST_SKIP() << "a GPU is present";
  Result r = RunCli("bench --ranks 1 --sizes 4KiB --iters 1 --backend nccl");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("NCCL")) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("allreduce"))) << r.out;
}

// A size no host can hold is a bad argument (exit 2) naming the size and the memory available,
// refused before any buffer is allocated (it ended in std::bad_alloc and SIGABRT), with ranks as
// threads and under the launcher alike.
TEST(BenchCommand, SizeThatDoesNotFitInMemoryIsABadArgument) {
  Result threads = RunCli("bench --ranks 2 --sizes 4KiB,1024GiB --iters 1 --backend gloo --json");
  EXPECT_EQ(threads.code, 2) << threads.out << threads.err;
  EXPECT_THAT(threads.err, HasSubstr("--sizes: 1024 GiB does not fit in memory: 2 rank(s)"));
  EXPECT_THAT(threads.err, HasSubstr("available (MemAvailable in /proc/meminfo)"));
  EXPECT_THAT(threads.out, HasSubstr("\"ok\": false"));
  const std::string bin = adaptcomm::testing::BuildDir() + "/tools/adaptcomm";
  Result launched = RunCli(absl::StrCat("launch -n 2 --timeout 100 -- ", bin,
                                        " bench --sizes 1024GiB --iters 1 --backend gloo"));
  EXPECT_EQ(launched.code, 2) << launched.out << launched.err;
  EXPECT_THAT(launched.err, HasSubstr("1024 GiB does not fit in memory"));
  EXPECT_THAT(launched.err, Not(HasSubstr("bad_alloc")));
}

// Past the check (here: an address-space limit it does not know), a failed allocation is still
// a bad size, not an abort.
TEST(BenchCommand, FailedAllocationIsABadArgumentNotACrash) {
  if (adaptcomm::testing::kUnderSanitizer) {
    // The sanitizers reserve terabytes of address space at start: no ulimit -v lets them start.
    GTEST_SKIP() << "an address-space limit cannot be combined with ASan/TSan";
  }
  Result r =
      RunCli("bench --ranks 1 --sizes 1GiB --iters 1 --warmup 0 --ops broadcast --backend gloo",
             /*shell_prefix=*/"ulimit -v 800000 && ");  // 781 MiB: the process starts, 1 GiB fails
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--sizes: cannot allocate the buffers of broadcast 1 GiB "
                               "(std::bad_alloc)"));
}

// `bench --ranks N` with its ranks as threads, running in the background with debug logs in a
// file; the loopback store's port comes from its "serving on" line.
class BackgroundBench {
 public:
  explicit BackgroundBench(std::optional<std::string> token) {
    static int instances = 0;  // each its own file: a stale log would name a dead port
    log_ =
        absl::StrCat(::testing::TempDir(), "/tools_bench_bg_", getpid(), "_", ++instances, ".log");
    std::remove(log_.c_str());
    const std::string bin = adaptcomm::testing::BuildDir() + "/tools/adaptcomm";
    pid_ = fork();
    if (pid_ == 0) {
      if (token) {
        setenv("ADAPTCOMM_STORE_TOKEN", token->c_str(), 1);
      } else {
        unsetenv("ADAPTCOMM_STORE_TOKEN");
      }
      setenv("ADAPTCOMM_LOG_LEVEL", "debug", 1);
      unsetenv("ADAPTCOMM_LOG_FILE");
      const int err = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int null = open("/dev/null", O_WRONLY);
      dup2(err, STDERR_FILENO);
      dup2(null, STDOUT_FILENO);
      execl(bin.c_str(), bin.c_str(), "bench", "--ranks", "2", "--sizes", "4", "--iters", "1000000",
            "--warmup", "0", "--ops", "allreduce", "--backend", "gloo", nullptr);
      _exit(99);
    }
  }
  ~BackgroundBench() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::remove(log_.c_str());
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The store's port once both ranks have created their communicators; 0 after 30 s without.
  int WaitForRanks() const {
    static const std::regex serving(R"(TCP store serving on 127\.0\.0\.1:(\d+))");
    for (int i = 0; i < 3000; ++i) {
      const std::string log = Log();
      std::smatch m;
      if (absl::StrContains(log, "communicator 'bench' rank 0 of 2") &&
          absl::StrContains(log, "communicator 'bench' rank 1 of 2") &&
          std::regex_search(log, m, serving)) {
        return std::stoi(m[1]);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return 0;
  }

 private:
  pid_t pid_ = -1;
  std::string log_;
};

absl::Status ConnectWithToken(int port, const std::string& token) {
  adaptcomm::TcpStoreOptions o;
  o.port = port;
  o.token = token;
  o.connect_timeout = absl::Seconds(5);
  o.io_timeout = absl::Seconds(5);
  auto store = adaptcomm::ConnectTcpStore(o);
  if (!store.ok()) return store.status();
  if (absl::Status s = (*store)->Set("intruder", "x"); !s.ok()) return s;
  return (*store)->Get("intruder", absl::Seconds(5)).status();
}

// The threads' loopback store requires ADAPTCOMM_STORE_TOKEN: a client with a wrong or no token
// is refused by the server; the right token is served.
TEST(BenchCommand, ThreadRanksStoreRequiresTheJobToken) {
  BackgroundBench bench(std::string("bench-secret-7"));
  const int port = bench.WaitForRanks();
  ASSERT_GT(port, 0) << bench.Log();
  EXPECT_TRUE(absl::IsPermissionDenied(ConnectWithToken(port, "wrong")));
  EXPECT_TRUE(absl::IsPermissionDenied(ConnectWithToken(port, "")));
  EXPECT_TRUE(ConnectWithToken(port, "bench-secret-7").ok());
}

// Without a job token, the loopback store gets a fresh one: only the bench's threads reach it.
// Its lines carry no rank's tag: the process runs both ranks, and it used to print the rank
// created last.
TEST(BenchCommand, ThreadRanksStoreHasATokenAndNoRankTag) {
  BackgroundBench bench(std::nullopt);
  const int port = bench.WaitForRanks();
  ASSERT_GT(port, 0) << bench.Log();
  EXPECT_TRUE(absl::IsPermissionDenied(ConnectWithToken(port, "")));
  std::string refusal;
  for (int i = 0; i < 500 && refusal.empty(); ++i) {
    std::istringstream lines(bench.Log());
    for (std::string line; std::getline(lines, line);) {
      if (absl::StrContains(line, "TCP store: refused connection")) refusal = line;
    }
    if (refusal.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_THAT(refusal, ::testing::StartsWith("[adaptcomm r? W ")) << bench.Log();
}

// (Here because it runs the built command too.) `diagnose --ranks` takes its bandwidth threshold
// from the profile tier unless --min-busbw is given, and says which.
TEST(DiagnoseCommand, RanksThresholdComesFromProfileOrFlag) {
  const std::string bin = adaptcomm::testing::BuildDir() + "/tools/adaptcomm";
  Result tier = RunCli(absl::StrCat("launch -n 2 --timeout 100 -- ", bin,
                                    " diagnose --ranks --multi-host no --model 235B"));
  EXPECT_THAT(tier.out, HasSubstr("threshold 1.00 GB/s from profile tier large (profiles.yaml:85)"))
      << tier.out << tier.err;
  Result flag = RunCli(absl::StrCat("launch -n 2 --timeout 100 -- ", bin,
                                    " diagnose --ranks --multi-host no --model 235B --min-busbw "
                                    "0.001"));
  EXPECT_THAT(flag.out, HasSubstr("threshold 0.00 GB/s from --min-busbw")) << flag.out << flag.err;
}

}  // namespace

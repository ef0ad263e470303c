// `adaptcomm bench`, run as the built command: help, a tiny 2-rank run whose JSON carries every
// field with consistent numbers, argument errors (exit 2, naming the bad token) and a planted
// wrong result (exit 1). Every run is bounded by timeout(1).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/harness.h"

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

// `adaptcomm <args>` with stdout and stderr captured, killed after 120 s.
Result RunCli(const std::string& args) {
  const std::string bin = adaptcomm::testing::BuildDir() + "/tools/adaptcomm";
  const std::string dir = ::testing::TempDir();
  // Per process: ctest runs the tests of this file in parallel processes.
  const std::string stem = absl::StrCat(dir, "/tools_bench_", getpid());
  const std::string out = stem + "_out.txt", err = stem + "_err.txt";
  const std::string cmd = absl::StrCat("ADAPTCOMM_LOG_LEVEL=warning timeout -k 5 120 ", bin, " ",
                                       args, " > ", out, " 2> ", err);
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

// (Here because it runs the built command too.) `diagnose --ranks` takes its bandwidth threshold
// from the profile tier unless --min-busbw is given, and says which.
TEST(DiagnoseCommand, RanksThresholdComesFromProfileOrFlag) {
  const std::string bin = adaptcomm::testing::BuildDir() + "/tools/adaptcomm";
  Result tier = RunCli(absl::StrCat("launch -n 2 --timeout 100 -- ", bin,
                                    " diagnose --ranks --multi-host no --model 235B"));
  EXPECT_THAT(tier.out, HasSubstr("threshold 1.00 GB/s from profile tier large (profiles.yaml:84)"))
      << tier.out << tier.err;
  Result flag = RunCli(absl::StrCat("launch -n 2 --timeout 100 -- ", bin,
                                    " diagnose --ranks --multi-host no --model 235B --min-busbw "
                                    "0.001"));
  EXPECT_THAT(flag.out, HasSubstr("threshold 0.00 GB/s from --min-busbw")) << flag.out << flag.err;
}

}  // namespace

// The `adaptcomm` command's usage errors, run as the built command: every subcommand exits 2 on a
// usage error (not CLI11's own codes 105, 106, 109...) and 0 on --help; duration flags refuse
// negative and absurd values naming the flag and the value as given.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace {

using ::testing::HasSubstr;

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

// `adaptcomm <args>` with stdout and stderr captured, killed after 60 s.
Result RunCli(const std::string& args) {
  const std::string bin = adaptcomm::testing::BuildDir() + "/tools/adaptcomm";
  const std::string stem = absl::StrCat(::testing::TempDir(), "/tools_cli_", getpid());
  const std::string out = stem + "_out.txt", err = stem + "_err.txt";
  const std::string cmd =
      absl::StrCat("timeout -k 5 60 ", bin, " ", args, " > ", out, " 2> ", err, " < /dev/null");
  const int rc = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

TEST(CliUsage, EverySubcommandExitsTwoOnAnUnknownFlagAndZeroOnHelp) {
  for (const char* sub : {"bench", "diagnose", "doctor", "launch", "profile", "trace"}) {
    Result bad = RunCli(absl::StrCat(sub, " --no-such-flag"));
    EXPECT_EQ(bad.code, 2) << sub << ": " << bad.err;
    Result help = RunCli(absl::StrCat(sub, " --help"));
    EXPECT_EQ(help.code, 0) << sub << ": " << help.err;
    EXPECT_THAT(help.out, HasSubstr("--help")) << sub;
  }
  EXPECT_EQ(RunCli("").code, 2);  // no subcommand
  EXPECT_EQ(RunCli("no-such-subcommand").code, 2);
  EXPECT_EQ(RunCli("--help").code, 0);
}

TEST(CliUsage, OutOfRangeValuesExitTwo) {
  Result ranks = RunCli("bench --ranks 0");
  EXPECT_EQ(ranks.code, 2) << ranks.err;
  EXPECT_THAT(ranks.err, HasSubstr("--ranks"));
  Result missing = RunCli("launch -- true");  // no -n
  EXPECT_EQ(missing.code, 2) << missing.err;
}

// A negative or absurd duration is refused naming the flag and the value, in a short message
// (CLI11's range check printed DBL_MAX in 309 digits; 1e300 s overflowed the job deadline and
// ended the job at once with 124).
TEST(CliUsage, DurationFlagsRefuseNegativeAndAbsurdValues) {
  for (const char* value : {"-1", "1e300", "nan", "5x"}) {
    Result launch = RunCli(absl::StrCat("launch -n 1 --timeout ", value, " -- true"));
    EXPECT_EQ(launch.code, 2) << value << ": " << launch.err;
    EXPECT_THAT(launch.err, HasSubstr(absl::StrCat("--timeout: '", value, "'"))) << launch.err;
    EXPECT_LT(launch.err.size(), 300u) << launch.err;
    for (const char* flag : {"--grace", "--dump-wait"}) {
      Result other = RunCli(absl::StrCat("launch -n 1 ", flag, " ", value, " -- true"));
      EXPECT_EQ(other.code, 2) << flag << " " << value << ": " << other.err;
      EXPECT_THAT(other.err, HasSubstr(absl::StrCat(flag, ": '", value, "'"))) << other.err;
      EXPECT_LT(other.err.size(), 300u) << other.err;
    }
    Result bench = RunCli(absl::StrCat("bench --ranks 1 --timeout ", value));
    EXPECT_EQ(bench.code, 2) << value << ": " << bench.err;
    EXPECT_THAT(bench.err, HasSubstr(absl::StrCat("--timeout: '", value, "'"))) << bench.err;
  }
  EXPECT_EQ(RunCli("bench --ranks 1 --timeout 0").code, 2);  // zero: no bound is no op bound
  EXPECT_EQ(RunCli("launch -n 1 --timeout 0 -- true").code, 0);
  EXPECT_EQ(RunCli("launch -n 1 --timeout 30 -- true").code, 0);
}

}  // namespace

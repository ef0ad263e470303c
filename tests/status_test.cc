// `adaptcomm status` against the 4-rank demo under `adaptcomm launch`: every rank reported while
// the job runs; one rank stopped (SIGSTOP) mid-run is named within 2 s as stopped and as the rank
// the others wait on; resumed (SIGCONT), the job finishes unharmed; a missing or wrong token is
// refused and reveals nothing.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/harness.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Output {
  int code = -1;
  std::string text;
};

Output Capture(const std::string& command) {
  Output out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.text.append(buf, n);
  const int rc = pclose(p);
  out.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

// Ends the launcher (and so its ranks) however the test ends.
class Job {
 public:
  explicit Job(pid_t pid) : pid_(pid) {}
  ~Job() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 200 && waitpid(pid_, nullptr, WNOHANG) != pid_; ++i) usleep(50 * 1000);
  }
  // The launcher's exit code, waiting at most `bound`; -1 if it is still running.
  int Wait(absl::Duration bound) {
    for (const absl::Time until = absl::Now() + bound; absl::Now() < until;) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = 0;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return -1;
  }

 private:
  pid_t pid_;
};

TEST(Status, NamesAStoppedRankWithinTwoSecondsAndTheJobGoesOn) {
  const std::string bin = adaptcomm::testing::BuildDir();
  char dir_template[] = "/tmp/status_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const int port = adaptcomm::testing::PickFreePort();
  const std::string token = absl::StrCat("t", getpid(), "x", absl::ToUnixNanos(absl::Now()));
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("ADAPTCOMM_STORE_TOKEN", token.c_str(), 1);
    const std::string command = absl::StrCat(
        bin, "/tools/adaptcomm launch -n 4 --timeout 120 --master-port ", port, " -- ", bin,
        "/examples/adaptcomm_trainer --steps 400 --pace-ms 20 > ", dir, "/demo_out.txt 2>&1");
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  Job job(pid);
  const std::string status =
      absl::StrCat(bin, "/tools/adaptcomm status --store 127.0.0.1:", port, " --timeout 3");
  const std::string with_token = absl::StrCat(status, " --token ", token);

  // Every rank publishes and is running (some ops done).
  nlohmann::json doc;
  bool running = false;
  for (const absl::Time until = absl::Now() + absl::Seconds(60); !running && absl::Now() < until;) {
    const Output out = Capture(with_token + " --json");
    doc = nlohmann::json::parse(out.text, nullptr, false);
    running = out.code == 0 && !doc.is_discarded() && doc["ranks"].size() == 4;
    for (size_t r = 0; running && r < 4; ++r) {
      running = doc["ranks"][r]["state"] == "ok" && doc["ranks"][r]["last_completed"] > 30;
    }
    if (!running) absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(running) << doc.dump() << "; see " << dir << "/demo_out.txt";
  const pid_t victim = doc["ranks"][2]["pid"].get<pid_t>();

  // Without the token, or with a wrong one: refused, and nothing of the job is printed.
  for (const std::string& command : {status, status + " --token wrong"}) {
    const Output refused = Capture("env -u ADAPTCOMM_STORE_TOKEN " + command);
    EXPECT_EQ(refused.code, 1) << refused.text;
    EXPECT_THAT(refused.text, HasSubstr("refused"));
    EXPECT_THAT(refused.text, Not(HasSubstr("rank 2")));
    EXPECT_THAT(refused.text, Not(HasSubstr(absl::StrCat(victim))));
  }

  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  const absl::Time stopped = absl::Now();
  bool named = false;
  Output out;
  while (!named && absl::Now() - stopped < absl::Seconds(2)) {
    out = Capture(with_token);
    const bool stale = out.text.find("rank 2  stopped") != std::string::npos;
    const bool blamed = out.text.find("waits on 2") != std::string::npos;
    named = out.code == 3 && stale && blamed;
  }
  const absl::Duration took = absl::Now() - stopped;
  kill(victim, SIGCONT);
  EXPECT_TRUE(named) << "after " << took << ":\n" << out.text;
  EXPECT_LE(took, absl::Seconds(2));

  // Resumed, the job finishes unharmed.
  EXPECT_EQ(job.Wait(absl::Seconds(90)), 0) << "see " << dir << "/demo_out.txt";
  std::ifstream in(dir + "/demo_out.txt");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("step 400 loss"));
  EXPECT_THAT(text.str(), Not(HasSubstr("redone")));
}

TEST(Status, HelpAndUsage) {
  const std::string cli = adaptcomm::testing::BuildDir() + "/tools/adaptcomm status";
  const Output help = Capture(cli + " --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.text, HasSubstr("--token"));
  EXPECT_THAT(help.text, HasSubstr("--json"));
  const Output none = Capture("env -u MASTER_PORT -u ADAPTCOMM_MASTER_PORT " + cli);
  EXPECT_EQ(none.code, 2) << none.text;
  EXPECT_THAT(none.text, HasSubstr("--store HOST:PORT"));
}

}  // namespace

// The demo trainer on two hosts (network namespaces joined by a bridge, one rank each, Gloo
// between them): the link of rank 1's host goes down for 15 s mid-run, past the 8 s op timeout,
// then comes back. The failed step is redone on both ranks and the final weights are
// byte-identical to those of a fault-free run with the same settings. Needs root; a long fault
// run (label soak), skipped with the reason where namespaces cannot be made.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/harness.h"
#include "tests/netns.h"

namespace adaptcomm {
namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 300;

class DemoOnTwoHosts {
 public:
  DemoOnTwoHosts(testing::Netns& net, std::string name) : net_(net), name_(std::move(name)) {
    const std::string dir = ::testing::TempDir();
    profile_ = absl::StrCat(dir, "/demo_cut_profile.yaml");
    std::ofstream(profile_) << "schema: 1\n"
                            << "defaults:\n"
                            << "  timeouts:\n"
                            // Below the op timeout, as the profile requires; a fresh
                            // bridge has once dropped rank 1's first connects for 5 s.
                            << "    store_connect: 7s\n"
                            << "    collective: 8s\n"
                            << "    heartbeat: 300s\n"
                            << "  retry:\n"
                            << "    initial_backoff: 100ms\n"
                            << "    max_backoff: 1s\n"
                            << "  elastic:\n"
                            // TCP's retransmission backoff after a 15 s cut can add 10 s more.
                            << "    loss_window: 60s\n"
                            << "  backend:\n"
                            << "    choice: gloo\n"
                            << "tiers:\n"
                            << "  - name: test\n"
                            << "    params: any\n";
    weights_ = absl::StrCat(dir, "/demo_cut_", name_, ".weights");
    std::remove(weights_.c_str());
  }

  // Starts both ranks, each in its namespace.
  void Start(int port) {
    const std::string bin = testing::BuildDir();
    for (int r = 0; r < kWorld; ++r) {
      log_[r] = absl::StrCat(::testing::TempDir(), "/demo_cut_", name_, ".rank", r, ".log");
      const std::string cmd =
          absl::StrCat("exec ip netns exec ", net_.Ns(r), " env RANK=", r, " WORLD_SIZE=", kWorld,
                       " LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=", net_.Ip(0),
                       " MASTER_PORT=", port, " ADAPTCOMM_PROFILE=", profile_, " stdbuf -oL ", bin,
                       "/examples/adaptcomm_trainer --steps ", kSteps, " --log-every 1 --out ",
                       weights_, " > ", log_[r], " 2>&1");
      pid_[r] = fork();
      if (pid_[r] == 0) {
        execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
        _exit(127);
      }
    }
  }
  // Whether rank 0 logged `text` within `bound`.
  bool AwaitLog(const std::string& text, absl::Duration bound) {
    for (const absl::Time until = absl::Now() + bound; absl::Now() < until;) {
      if (testing::ReadTextFile(log_[0]).find(text) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }
  // Waits for both ranks (killing them past `bound`); true if both exited 0.
  bool Finish(absl::Duration bound) {
    bool ok = true;
    const absl::Time until = absl::Now() + bound;
    for (int r = 0; r < kWorld; ++r) {
      int st = 0;
      pid_t done = 0;
      while ((done = waitpid(pid_[r], &st, WNOHANG)) == 0 && absl::Now() < until) {
        absl::SleepFor(absl::Milliseconds(50));
      }
      if (done == 0) {
        kill(pid_[r], SIGKILL);
        waitpid(pid_[r], &st, 0);
      }
      if (done == 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        ADD_FAILURE() << name_ << " rank " << r << " failed:\n" << testing::ReadTextFile(log_[r]);
        ok = false;
      }
    }
    return ok;
  }
  std::string weights() const { return testing::ReadTextFile(weights_); }
  std::string log(int r) const { return testing::ReadTextFile(log_[r]); }

 private:
  testing::Netns& net_;
  std::string name_, profile_, weights_;
  std::string log_[kWorld];
  pid_t pid_[kWorld] = {};
};

TEST(DemoLinkCut, FifteenSecondCutRedoesTheStepWithIdenticalWeights) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  testing::Netns net(kWorld);
  if (!net.Up()) GTEST_SKIP() << "cannot create network namespaces, veth or a bridge here";

  DemoOnTwoHosts clean(net, "clean");
  clean.Start(testing::PickFreePort());
  ASSERT_TRUE(clean.Finish(absl::Seconds(120)));

  DemoOnTwoHosts cut(net, "cut");
  cut.Start(testing::PickFreePort());
  ASSERT_TRUE(cut.AwaitLog("step 20 loss", absl::Seconds(60))) << cut.log(0);
  ASSERT_EQ(testing::Sh(absl::StrCat("ip link set ", net.Veth(1), " down")), 0);
  absl::SleepFor(absl::Seconds(15));
  ASSERT_EQ(testing::Sh(absl::StrCat("ip link set ", net.Veth(1), " up")), 0);
  ASSERT_TRUE(cut.Finish(absl::Seconds(180)));

  const std::string want = clean.weights();
  ASSERT_GT(want.size(), 1000u);
  EXPECT_TRUE(want == cut.weights()) << "weights differ after the cut";
  const std::string log0 = cut.log(0);
  EXPECT_NE(log0.find("backend gloo"), std::string::npos) << log0;
  EXPECT_NE(log0.find("step(s) redone"), std::string::npos) << log0;
  EXPECT_NE(log0.find(absl::StrCat("step ", kSteps, " loss")), std::string::npos) << log0;
}

}  // namespace
}  // namespace adaptcomm

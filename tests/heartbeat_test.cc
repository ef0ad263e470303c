// The heartbeat that guards the watchdogs, and the on-demand dump by signal.
#include "lib/core/resilience/heartbeat.h"

#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "adaptcomm/communicator.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace adaptcomm::internal {
namespace {

bool WaitFor(const std::function<bool()>& done, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(Heartbeat, SilentWatchdogIsReportedOnceAndBeatingOneIsNot) {
  std::atomic<int> silent_stalls{0}, beating_stalls{0};
  HeartbeatMonitor& m = HeartbeatMonitor::Instance();
  int silent = m.Register(
      {"silent", absl::Milliseconds(300), [&](const std::string&) { silent_stalls++; }, nullptr});
  int beating = m.Register(
      {"beating", absl::Milliseconds(300), [&](const std::string&) { beating_stalls++; }, nullptr});
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Milliseconds(1200)) {
    m.Beat(beating);
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(silent_stalls.load(), 1);  // once, not once per poll
  EXPECT_EQ(beating_stalls.load(), 0);
  m.Unregister(silent);
  m.Unregister(beating);
}

TEST(Heartbeat, Sigusr2DumpsTheFlightRecordOfEveryCommunicator) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/sigusr2_", getpid());
  testing::RunRanks(testing::RankMode::kThreads, 2, [&](const testing::RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.flight_recorder_dir = dir;
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    float x = 1;
    ASSERT_TRUE((*comm)->Allreduce(HostView(&x, 1)).Wait().ok());
    ASSERT_TRUE((*comm)->Barrier().Wait().ok());
    if (env.rank == 0) raise(SIGUSR2);
    const std::string mine = absl::StrCat(dir, "/flight.rank", env.rank, ".json");
    EXPECT_TRUE(WaitFor(
        [&] {
          struct stat st;
          return stat(mine.c_str(), &st) == 0;
        },
        absl::Seconds(3)))
        << mine;
    std::ifstream in(mine);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("SIGUSR2"), std::string::npos);
    EXPECT_NE(text.find("\"op\": \"allreduce\""), std::string::npos);
    ASSERT_TRUE((*comm)->Barrier().Wait().ok());
  });
}

}  // namespace
}  // namespace adaptcomm::internal

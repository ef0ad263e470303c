// lib/base/cpu_binding.h: how local ranks are spread over a host's cores, and that a binding
// holds for the thread that asked (and what it starts).
#include "lib/base/cpu_binding.h"

#include <sched.h>

#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace adaptcomm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Cores = std::vector<std::vector<int>>;

// Two packages of four cores, two hardware threads each, numbered as Linux numbers them on such a
// machine: the second thread of core c is c + 8.
Cores TwoPackagesOfFourCores() {
  Cores cores;
  for (int c = 0; c < 8; ++c) cores.push_back({c, c + 8});
  return cores;
}

std::vector<int> Cpus(const Cores& cores, CpuBindMode mode, int rank, int world) {
  absl::StatusOr<std::vector<int>> cpus = CpusForLocalRank(cores, mode, rank, world);
  EXPECT_TRUE(cpus.ok()) << cpus.status();
  return cpus.ok() ? *cpus : std::vector<int>{-1};
}

TEST(CpuBinding, RanksGetContiguousRunsOfWholeCores) {
  const Cores cores = TwoPackagesOfFourCores();
  // Two ranks: a package each, with both threads of each core.
  EXPECT_THAT(Cpus(cores, CpuBindMode::kCore, 0, 2), ElementsAre(0, 1, 2, 3, 8, 9, 10, 11));
  EXPECT_THAT(Cpus(cores, CpuBindMode::kAuto, 1, 2), ElementsAre(4, 5, 6, 7, 12, 13, 14, 15));
  // Three ranks on eight cores: 3, 3 and 2, no core shared.
  std::set<int> seen;
  std::vector<size_t> sizes;
  for (int r = 0; r < 3; ++r) {
    const std::vector<int> cpus = Cpus(cores, CpuBindMode::kCore, r, 3);
    sizes.push_back(cpus.size());
    for (int cpu : cpus) EXPECT_TRUE(seen.insert(cpu).second) << "CPU " << cpu << " shared";
  }
  EXPECT_THAT(sizes, ElementsAre(6u, 6u, 4u));
  EXPECT_EQ(seen.size(), 16u);
  // As many ranks as cores: one core (two threads) each.
  EXPECT_THAT(Cpus(cores, CpuBindMode::kCore, 5, 8), ElementsAre(5, 13));
}

TEST(CpuBinding, MoreRanksThanCoresAreLeftUnboundByAutoAndRefusedByCore) {
  const Cores two = {{0}, {1}};
  EXPECT_TRUE(Cpus(two, CpuBindMode::kAuto, 2, 3).empty());
  EXPECT_TRUE(Cpus(two, CpuBindMode::kNone, 0, 2).empty());
  absl::StatusOr<std::vector<int>> refused = CpusForLocalRank(two, CpuBindMode::kCore, 0, 3);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_EQ(refused.status().message(),
            "3 ranks on this host but 2 core(s) to run on (CPUs 0-1): use fewer ranks, or none to "
            "leave them unbound");
}

TEST(CpuBinding, ModesAndCpuListsReadAndWriteAsLinuxAndTheLaunchFlagDo) {
  EXPECT_EQ(*ParseCpuBindMode("auto"), CpuBindMode::kAuto);
  EXPECT_EQ(*ParseCpuBindMode("core"), CpuBindMode::kCore);
  EXPECT_EQ(*ParseCpuBindMode("none"), CpuBindMode::kNone);
  absl::StatusOr<CpuBindMode> bad = ParseCpuBindMode("socket");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'socket' is not one of"));
  EXPECT_EQ(CpuListText({11, 0, 2, 1, 3, 8, 10}), "0-3,8,10-11");
  EXPECT_EQ(CpuListText({5}), "5");
  EXPECT_EQ(CpuListText({}), "");
}

TEST(CpuBinding, AllowedCoresHoldEveryAllowedCpuOnce) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::set<int> listed;
  for (const std::vector<int>& core : AllowedCores()) {
    EXPECT_FALSE(core.empty());
    for (int cpu : core) EXPECT_TRUE(listed.insert(cpu).second) << "CPU " << cpu << " twice";
  }
  EXPECT_EQ(static_cast<int>(listed.size()), CPU_COUNT(&set));
  for (int cpu : listed) EXPECT_TRUE(CPU_ISSET(cpu, &set)) << cpu;
  EXPECT_EQ(AllowedCpuCount(), CPU_COUNT(&set));
}

// On a thread of its own, so the test process keeps its CPUs.
TEST(CpuBinding, BoundThreadRunsOnlyOnItsCpusAndSoDoThreadsItStarts) {
  const std::vector<std::vector<int>> cores = AllowedCores();
  ASSERT_FALSE(cores.empty());
  const int cpu = cores.back().front();
  std::vector<int> own, child;
  int own_count = 0;
  std::thread([&] {
    ASSERT_TRUE(BindCallingThread({cpu}).ok());
    own_count = AllowedCpuCount();
    auto read = [](std::vector<int>* out) {
      cpu_set_t set;
      CPU_ZERO(&set);
      ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) out->push_back(c);
      }
    };
    read(&own);
    std::thread([&] { read(&child); }).join();
  }).join();
  EXPECT_THAT(own, ElementsAre(cpu));
  EXPECT_THAT(child, ElementsAre(cpu));
  EXPECT_EQ(own_count, 1);
  absl::Status bad = BindCallingThread({CPU_SETSIZE + 1});
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
}

}  // namespace
}  // namespace adaptcomm

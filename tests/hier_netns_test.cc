// The hierarchical backend across real "hosts": two network namespaces with two rank processes
// each (ranks 0 and 2 in the first, 1 and 3 in the second, so global order interleaves hosts).
// The composition root tells the hosts apart by their network namespace, Gloo runs on loopback
// inside each namespace and over the bridge between the leaders; results are checked element by
// element. Then the second namespace's link is cut: every rank fails within the op bound, the
// leaders naming the level between hosts. Needs root; skipped with the reason otherwise.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/core/selection/backend_selection.h"
#include "tests/netns.h"

namespace adaptcomm {
namespace {

using testing::Netns;
using testing::Sh;

constexpr int kWorld = 4;
constexpr absl::Duration kOpTimeout = absl::Seconds(2);

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

bool WaitForFile(const std::string& path, absl::Duration bound) {
  for (const absl::Time until = absl::Now() + bound; !Exists(path);) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

float Input(int rank, size_t i) {
  return static_cast<float>(rank * 100 + static_cast<int>(i % 97));
}

// Exit codes of a rank process (the parent reports them by name).
enum Exit : int {
  kOk = 0,
  kSetns = 10,
  kCreate = 11,
  kOpFailed = 12,
  kWrongValue = 13,
  kWrongHosts = 14,
  kCutNotSeen = 15,
  kSlowFailure = 16,
  kWrongLevel = 17,
};

// One rank: create, check every collective, then fail cleanly once the link is cut.
int RankMain(const Netns& net, int rank, const std::string& dir) {
  const int host = rank % 2;
  const int fd = open(absl::StrCat("/var/run/netns/", net.Ns(host)).c_str(), O_RDONLY);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) return kSetns;
  absl::StatusOr<std::shared_ptr<Store>> store = CreateFileStore(dir + "/store");
  if (!store.ok()) return kCreate;
  CommunicatorOptions o;
  o.rank = rank;
  o.world_size = kWorld;
  o.timeout = kOpTimeout;
  internal::Rendezvous rv;
  rv.root_store = *store;
  rv.store = CreatePrefixStore("comm", *store);
  rv.transport_host = net.Ip(host);
  absl::StatusOr<internal::selection::SelectedBackend> sel =
      internal::selection::CreateHierarchicalWith(o, rv, absl::Now() + absl::Seconds(30),
                                                  internal::selection::SelectionDeps{});
  if (!sel.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, sel.status().ToString().c_str());
    return kCreate;
  }
  std::fprintf(stderr, "rank %d: %s\n", rank, sel->reason.c_str());
  if (!absl::StrContains(sel->reason, "4 ranks on 2 hosts") ||
      !absl::StrContains(sel->reason, absl::StrCat("on host ", host, ")"))) {
    return kWrongHosts;
  }
  Backend& b = *sel->backend;
  uint64_t seq = 0;
  auto run = [&](OpDesc op) {
    op.seq = ++seq;
    op.timeout = kOpTimeout * 5;
    absl::Status s = b.Run(op);
    if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return s.ok();
  };
  constexpr size_t kCount = 100000;
  std::vector<float> data(kCount), all(kCount * kWorld);
  OpDesc op;
  for (size_t i = 0; i < kCount; ++i) data[i] = Input(rank, i);
  op.kind = OpKind::kAllreduce;
  op.input = op.output = HostView(data.data(), kCount);
  if (!run(op)) return kOpFailed;
  for (size_t i = 0; i < kCount; ++i) {
    float want = 0;
    for (int q = 0; q < kWorld; ++q) want += Input(q, i);
    if (data[i] != want) return kWrongValue;
  }
  for (size_t i = 0; i < kCount; ++i) data[i] = Input(rank, i);
  op.kind = OpKind::kAllgather;
  op.input = HostView(data.data(), kCount);
  op.output = HostView(all.data(), all.size());
  if (!run(op)) return kOpFailed;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] != Input(static_cast<int>(i / kCount), i % kCount)) return kWrongValue;
  }
  for (size_t i = 0; i < all.size(); ++i) all[i] = Input(rank, i);
  op.kind = OpKind::kReduceScatter;
  op.input = HostView(all.data(), all.size());
  op.output = HostView(data.data(), kCount);
  if (!run(op)) return kOpFailed;
  for (size_t i = 0; i < kCount; ++i) {
    float want = 0;
    for (int q = 0; q < kWorld; ++q) want += Input(q, static_cast<size_t>(rank) * kCount + i);
    if (data[i] != want) return kWrongValue;
  }
  for (size_t i = 0; i < kCount; ++i) data[i] = Input(rank, i);
  op.kind = OpKind::kBroadcast;
  op.root = 3;  // a non-leader on the second host
  op.input = op.output = HostView(data.data(), kCount);
  if (!run(op)) return kOpFailed;
  for (size_t i = 0; i < kCount; ++i) {
    if (data[i] != Input(3, i)) return kWrongValue;
  }
  op = OpDesc{};
  op.kind = OpKind::kBarrier;
  if (!run(op)) return kOpFailed;

  std::ofstream(absl::StrCat(dir, "/ready.", rank)) << "1";
  if (!WaitForFile(dir + "/cut", absl::Seconds(60))) return kCutNotSeen;
  op.kind = OpKind::kAllreduce;
  op.input = op.output = HostView(data.data(), kCount);
  op.seq = ++seq;
  op.timeout = kOpTimeout;
  const absl::Time start = absl::Now();
  const absl::Status s = b.Run(op);
  const absl::Duration took = absl::Now() - start;
  std::fprintf(stderr, "rank %d after the cut (%s): %s\n", rank, absl::FormatDuration(took).c_str(),
               s.ToString().c_str());
  if (s.ok()) return kCutNotSeen;
  if (took > kOpTimeout + absl::Seconds(3)) return kSlowFailure;
  const bool leader = rank < 2;
  const std::string level = leader ? "between hosts (leader of host " : "within host ";
  if (!absl::StrContains(s.message(), absl::StrCat("allreduce #", seq, ": ", level))) {
    return kWrongLevel;
  }
  return kOk;
}

TEST(HierNetns, TwoHostsOfTwoRanksComputeExactlyAndALinkCutNamesTheLevel) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  Netns net(2);
  if (!net.Up()) GTEST_SKIP() << "cannot create network namespaces, veth or a bridge here";
  const std::string dir = absl::StrCat(::testing::TempDir(), "/hier_netns_", getpid());
  ASSERT_EQ(Sh(absl::StrCat("rm -rf ", dir, " && mkdir -p ", dir)), 0);
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(RankMain(net, r, dir));
    pids.push_back(pid);
  }
  bool ready = true;
  for (int r = 0; r < kWorld; ++r) {
    ready = ready && WaitForFile(absl::StrCat(dir, "/ready.", r), absl::Seconds(60));
  }
  EXPECT_TRUE(ready) << "not every rank finished the collectives";
  // The second host (ranks 1 and 3) loses its link for good.
  EXPECT_EQ(Sh(absl::StrCat("ip link set ", net.Veth(1), " down")), 0);
  std::ofstream(dir + "/cut") << "1";
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int r = 0; r < kWorld; ++r) {
    int st = 0;
    pid_t done = 0;
    while ((done = waitpid(pids[static_cast<size_t>(r)], &st, WNOHANG)) == 0 &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (done == 0) {
      kill(pids[static_cast<size_t>(r)], SIGKILL);
      waitpid(pids[static_cast<size_t>(r)], &st, 0);
      ADD_FAILURE() << "rank " << r << " did not finish";
      continue;
    }
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == kOk)
        << "rank " << r << " exit " << WEXITSTATUS(st)
        << " (10 setns, 11 create, 12 op failed, 13 wrong value, 14 wrong hosts, 15 cut not "
           "seen, 16 slow failure, 17 wrong level)";
  }
  Sh(absl::StrCat("rm -rf ", dir));
}

}  // namespace
}  // namespace adaptcomm

// The hierarchical backend as the composition root builds it (CreateHierarchicalWith): hosts
// agreed through the store, Gloo inside each host and among the leaders, or an intra-host backend
// from the caller's factory (the seam the shared-memory backend plugs into). Ranks are threads;
// hosts are faked through the host identity, except where the real one is used.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/core/selection/backend_selection.h"
#include "lib/gloo/gloo_backend.h"
#include "lib/hier/host_identity.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using internal::selection::CreateHierarchicalWith;
using internal::selection::HierarchicalDeps;
using internal::selection::IntraHostGroup;
using internal::selection::SelectedBackend;
using internal::selection::SelectionDeps;
using testing::RankEnv;
using testing::RankMode;
using testing::RunRanks;

absl::StatusOr<SelectedBackend> Create(const RankEnv& env, const HierarchicalDeps& hier) {
  CommunicatorOptions o = env.options;
  o.timeout = absl::Seconds(30);
  internal::Rendezvous rv;
  rv.root_store = env.options.store;
  rv.store = CreatePrefixStore("comm", env.options.store);
  rv.transport_host = "127.0.0.1";
  return CreateHierarchicalWith(o, rv, absl::Now() + absl::Seconds(30), SelectionDeps{}, hier);
}

// Allreduce (sum) of rank-dependent values and an allgather, checked element by element.
void ExpectCollectivesWork(Backend& b) {
  const int n = b.size(), r = b.rank();
  std::vector<int32_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = r * 1000 + static_cast<int32_t>(i);
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.input = op.output = HostView(data.data(), data.size());
  op.seq = 1;
  op.timeout = absl::Seconds(30);
  ASSERT_TRUE(b.Run(op).ok()) << b.health();
  for (size_t i = 0; i < data.size(); ++i) {
    const int32_t want = 1000 * n * (n - 1) / 2 + n * static_cast<int32_t>(i);
    ASSERT_EQ(data[i], want) << "allreduce element " << i << " on rank " << r;
  }
  std::vector<int32_t> mine = {r, -r}, all(2 * static_cast<size_t>(n));
  op.kind = OpKind::kAllgather;
  op.input = HostView(mine.data(), mine.size());
  op.output = HostView(all.data(), all.size());
  op.seq = 2;
  ASSERT_TRUE(b.Run(op).ok()) << b.health();
  for (int g = 0; g < n; ++g) {
    EXPECT_EQ(all[2 * static_cast<size_t>(g)], g) << "allgather block " << g << " on rank " << r;
    EXPECT_EQ(all[2 * static_cast<size_t>(g) + 1], -g) << "allgather block " << g;
  }
}

TEST(HierSelectionTest, GroupsRanksByHostIdentity) {
  // Ranks 0 and 2 on host "a", 1 and 3 on host "b": hosts are numbered by their lowest rank.
  RunRanks(RankMode::kThreads, 4, [](const RankEnv& env) {
    HierarchicalDeps hier;
    hier.host_identity = env.rank % 2 == 0 ? "boot-a/a/net:[1]" : "boot-b/b/net:[2]";
    absl::StatusOr<SelectedBackend> s = Create(env, hier);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_STREQ(s->backend->name(), "hier");
    EXPECT_TRUE(absl::StrContains(s->reason, "4 ranks on 2 hosts (at most 2 per host"))
        << s->reason;
    EXPECT_TRUE(absl::StrContains(
        s->reason, absl::StrCat("local rank ", env.rank / 2, " of 2 on host ", env.rank % 2)))
        << s->reason;
    EXPECT_TRUE(
        absl::StrContains(s->reason, "gloo within each host, gloo among the 2 host leaders"))
        << s->reason;
    ExpectCollectivesWork(*s->backend);
  });
}

TEST(HierSelectionTest, IntraHostFactoryBuildsTheInnerBackend) {
  std::atomic<int> calls{0};
  RunRanks(RankMode::kThreads, 3, [&](const RankEnv& env) {
    HierarchicalDeps hier;
    hier.host_identity = env.rank < 2 ? "x" : "y";  // 2 + 1
    hier.intra = [&](const IntraHostGroup& g) -> absl::StatusOr<std::unique_ptr<Backend>> {
      ++calls;
      EXPECT_EQ(g.host, env.rank < 2 ? 0 : 1);
      EXPECT_EQ(g.local_rank, env.rank < 2 ? env.rank : 0);
      EXPECT_EQ(g.local_size, env.rank < 2 ? 2 : 1);
      GlooBackendOptions o;
      o.rank = g.local_rank;
      o.size = g.local_size;
      o.store = g.store;
      o.hostname = "127.0.0.1";
      o.init_timeout = std::max(g.deadline - absl::Now(), absl::Milliseconds(1));
      return CreateGlooBackend(o);
    };
    absl::StatusOr<SelectedBackend> s = Create(env, hier);
    ASSERT_TRUE(s.ok()) << s.status();
    ExpectCollectivesWork(*s->backend);
  });
  EXPECT_EQ(calls.load(), 3);
}

TEST(HierSelectionTest, IntraFactoryErrorIsReturned) {
  RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    HierarchicalDeps hier;
    hier.host_identity = "same";
    hier.intra = [](const IntraHostGroup&) -> absl::StatusOr<std::unique_ptr<Backend>> {
      return absl::ResourceExhaustedError("no /dev/shm space for 64 MiB (limit 32 MiB)");
    };
    absl::StatusOr<SelectedBackend> s = Create(env, hier);
    EXPECT_TRUE(absl::IsResourceExhausted(s.status())) << s.status();
  });
}

TEST(HierSelectionTest, ThreadsOfOneProcessShareTheRealHost) {
  const std::string id = LocalHostIdentity();
  EXPECT_TRUE(absl::StrContains(id, "net:[")) << id;
  RunRanks(RankMode::kThreads, 2, [](const RankEnv& env) {
    absl::StatusOr<SelectedBackend> s = Create(env, HierarchicalDeps{});
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(absl::StrContains(s->reason, "2 ranks on 1 host ")) << s->reason;
    ExpectCollectivesWork(*s->backend);
  });
}

TEST(HostIdentityTest, AssignsHostsInOrderOfTheirLowestRank) {
  const HostAssignment a = AssignHosts({"b", "a", "b", "c", "a"}, 4);
  EXPECT_EQ(a.host_of, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(a.hosts, 3);
  EXPECT_EQ(a.local_rank, 1);
  EXPECT_EQ(a.local_size, 2);
  EXPECT_EQ(a.max_local, 2);
}

}  // namespace
}  // namespace adaptcomm

namespace adaptcomm {
namespace {

// backend=auto without NCCL decides by where the ranks run: one host -> shm, several hosts with
// several ranks on one -> hierarchical (shm inside each host), one rank per host -> Gloo; and the
// backend it picks computes exactly.
absl::StatusOr<SelectedBackend> SelectAuto(const RankEnv& env, const std::string& host,
                                           bool intra_host_shm = true, bool hierarchical = true) {
  CommunicatorOptions o = env.options;
  o.timeout = absl::Seconds(30);
  o.backend = BackendChoice::kAuto;
  internal::Rendezvous rv;
  rv.root_store = env.options.store;
  rv.store = CreatePrefixStore("comm", env.options.store);
  rv.transport_host = "127.0.0.1";
  SelectionDeps deps;
  deps.use_given_apis = true;  // no NCCL, no CUDA
  deps.host_identity = host;
  deps.intra_host_shm = intra_host_shm;
  deps.hierarchical = hierarchical;
  return internal::selection::SelectBackendWith(o, rv, absl::Now() + absl::Seconds(30), deps);
}

TEST(AutoSelectionTest, OneHostShmSeveralHostsHierarchicalOneRankPerHostGloo) {
  struct Case {
    std::vector<std::string> hosts;
    const char* backend;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {{"h/a", "h/a", "h/a", "h/a"}, "shm", "shm: all 4 ranks on one host"},
      {{"h/a", "h/b", "h/a", "h/b"}, "hier", "shm within each host, gloo among the 2 host leaders"},
      {{"h/a", "h/a", "h/a", "h/b"}, "hier", "4 ranks on 2 hosts (at most 3 per host"},
      {{"h/a", "h/b", "h/c", "h/d"}, "gloo", "one rank per host (4 hosts)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.backend);
    RunRanks(RankMode::kThreads, 4, [&](const RankEnv& env) {
      absl::StatusOr<SelectedBackend> s = SelectAuto(env, c.hosts[static_cast<size_t>(env.rank)]);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_STREQ(s->backend->name(), c.backend) << s->reason;
      EXPECT_TRUE(absl::StrContains(s->reason, c.reason)) << s->reason;
      EXPECT_TRUE(absl::StrContains(s->reason, "because NCCL is not usable")) << s->reason;
      ExpectCollectivesWork(*s->backend);
    });
  }
}

// The profile forbids what auto would pick: backend.intra_host=gloo keeps shared memory out (one
// host: Gloo; several: hierarchical with Gloo inside each host), backend.hierarchical=off gives
// flat Gloo across hosts. Each reason names the key.
TEST(AutoSelectionTest, ProfileKeysForbidSharedMemoryOrTheHierarchy) {
  struct Case {
    std::vector<std::string> hosts;
    bool intra_host_shm;
    bool hierarchical;
    const char* backend;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {{"h/a", "h/a", "h/a", "h/a"}, false, true, "gloo", "backend.intra_host is gloo"},
      {{"h/a", "h/b", "h/a", "h/b"}, false, true, "hier", "gloo within each host"},
      {{"h/a", "h/b", "h/a", "h/b"}, true, false, "gloo", "backend.hierarchical is off (2 hosts"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reason);
    RunRanks(RankMode::kThreads, 4, [&](const RankEnv& env) {
      absl::StatusOr<SelectedBackend> s =
          SelectAuto(env, c.hosts[static_cast<size_t>(env.rank)], c.intra_host_shm, c.hierarchical);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_STREQ(s->backend->name(), c.backend) << s->reason;
      EXPECT_TRUE(absl::StrContains(s->reason, c.reason)) << s->reason;
      ExpectCollectivesWork(*s->backend);
    });
  }
}

}  // namespace
}  // namespace adaptcomm

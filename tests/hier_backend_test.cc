// The hierarchical backend driven directly, ranks as threads: hosts are faked by giving each rank
// its host index, with Gloo inside every "host" and Gloo between the leaders (each group over the
// harness store under its own prefix). The conformance suite (tests/backend_conformance.h) runs
// on every topology; here also what is the hierarchical backend's own: refusals, an inconsistent
// topology, inner failures, absent ranks and aborts.
#include "lib/hier/hier_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "adaptcomm/store.h"
#include "lib/gloo/gloo_backend.h"
#include "tests/backend_conformance.h"
#include "tests/harness.h"
#if __has_include("lib/shm/shm_backend.h")
#include "lib/shm/shm_backend.h"
#define ADAPTCOMM_TEST_HAVE_SHM 1
#endif

namespace adaptcomm {
namespace {

using ::adaptcomm::testing::BackendConformanceTest;
using ::adaptcomm::testing::RankEnv;
using ::adaptcomm::testing::RankMode;
using ::adaptcomm::testing::RunRanks;

constexpr absl::Duration kOpTimeout = absl::Seconds(30);

// ---- topology and connection ----

struct Place {
  int host = 0;
  int local = 0;
  int locals = 0;
  int hosts = 0;
};

Place PlaceOf(const std::vector<int>& host_of, int rank) {
  Place p;
  for (size_t g = 0; g < host_of.size(); ++g) {
    p.hosts = std::max(p.hosts, host_of[g] + 1);
    if (host_of[g] != host_of[static_cast<size_t>(rank)]) continue;
    if (static_cast<int>(g) < rank) ++p.local;
    ++p.locals;
  }
  p.host = host_of[static_cast<size_t>(rank)];
  return p;
}

std::unique_ptr<Backend> Gloo(std::shared_ptr<Store> store, int rank, int size) {
  GlooBackendOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::move(store);
  o.hostname = "127.0.0.1";
  o.init_timeout = absl::Seconds(30);
  o.default_timeout = kOpTimeout;
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateGlooBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : nullptr;
}

// Forwards everything to `inner`, except what a test changes.
class Wrapped : public Backend {
 public:
  explicit Wrapped(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  absl::Status Supports(const OpDesc& op) const override { return inner_->Supports(op); }
  absl::Status Run(const OpDesc& op) override { return inner_->Run(op); }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }
  absl::Status health() const override { return inner_->health(); }

 protected:
  std::unique_ptr<Backend> inner_;
};

// An intra-host backend without send/recv: the hierarchical backend's leader <-> local moves
// then take their collective fallbacks.
class NoSendRecv final : public Wrapped {
 public:
  using Wrapped::Wrapped;
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.send_recv = false;
    return c;
  }
};

// Fails its `fail_at`-th Run with Unavailable("injected ..."), as a transport error would.
class FailsAt final : public Wrapped {
 public:
  FailsAt(std::unique_ptr<Backend> inner, int fail_at)
      : Wrapped(std::move(inner)), left_(fail_at) {}
  absl::Status Run(const OpDesc& op) override {
    if (--left_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("injected failure of inner ", OpKindName(op.kind), " seq ", op.seq));
    }
    return inner_->Run(op);
  }

 private:
  int left_;
};

struct Wrappers {
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>, int rank)> intra;
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>, int rank)> inter;
};

// The shared-memory backend inside each host, where it is built (null where it is not).
std::unique_ptr<Backend> Shm(std::shared_ptr<Store> store, int rank, int size) {
#ifdef ADAPTCOMM_TEST_HAVE_SHM
  ShmBackendOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::move(store);
  o.init_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateShmBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : nullptr;
#else
  (void)store, (void)rank, (void)size;
  return nullptr;
#endif
}

std::unique_ptr<Backend> ConnectHier(const RankEnv& env, const std::vector<int>& host_of,
                                     const std::string& prefix, const Wrappers& wrap = {},
                                     bool intra_shm = false) {
  const Place p = PlaceOf(host_of, env.rank);
  HierBackendOptions o;
  o.topology.rank = env.rank;
  o.topology.world_size = env.world_size;
  o.topology.host_of = host_of;
  o.topology.local_rank = p.local;
  auto intra_store = CreatePrefixStore(absl::StrCat(prefix, "/intra/", p.host), env.options.store);
  o.intra = intra_shm ? Shm(intra_store, p.local, p.locals) : Gloo(intra_store, p.local, p.locals);
  if (o.intra == nullptr) return nullptr;
  if (wrap.intra) o.intra = wrap.intra(std::move(o.intra), env.rank);
  if (p.local == 0 && p.hosts > 1) {
    o.inter =
        Gloo(CreatePrefixStore(absl::StrCat(prefix, "/inter"), env.options.store), p.host, p.hosts);
    if (o.inter == nullptr) return nullptr;
    if (wrap.inter) o.inter = wrap.inter(std::move(o.inter), env.rank);
  }
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateHierarchicalBackend(std::move(o));
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : nullptr;
}

// ---- conformance: every op x dtype x reduce op, bad input, refusal once aborted ----

struct Topology {
  std::string name;
  std::vector<int> host_of;
  bool intra_without_send_recv = false;
  bool full_dtypes = false;
  bool intra_shm = false;
};

// The conformance suite (tests/backend_conformance.h) on `topo`. Send/recv runs in rings within
// each host and among the leaders: the pairs a hierarchical backend without pair links carries.
testing::ConformanceTarget HierTarget(const Topology& topo) {
  testing::ConformanceTarget t;
  t.name = topo.name;
  t.world = static_cast<int>(topo.host_of.size());
  t.prepare = [topo]() -> testing::RankBackendFactory {
    Wrappers wrap;
    if (topo.intra_without_send_recv) {
      wrap.intra = [](std::unique_ptr<Backend> b, int) {
        return std::unique_ptr<Backend>(new NoSendRecv(std::move(b)));
      };
    }
    return [topo, wrap](int rank, int world, std::shared_ptr<Store> store) {
      RankEnv env{rank, world, {}};
      env.options.store = std::move(store);
      return ConnectHier(env, topo.host_of, topo.name, wrap, topo.intra_shm);
    };
  };
  if (!topo.full_dtypes) t.dtypes = {DType::kF32, DType::kBF16, DType::kI32};
  t.large_bytes = size_t{256} << 10;
  t.large_dtypes = {DType::kF32};
  std::vector<int> leaders;
  for (int h = 0; h <= *std::max_element(topo.host_of.begin(), topo.host_of.end()); ++h) {
    std::vector<int> ring;
    for (size_t g = 0; g < topo.host_of.size(); ++g) {
      if (topo.host_of[g] == h) ring.push_back(static_cast<int>(g));
    }
    leaders.push_back(ring.front());
    t.rings.push_back(std::move(ring));
  }
  t.rings.push_back(std::move(leaders));
  return t;
}

std::vector<testing::ConformanceTarget> HierTargets() {
  std::vector<Topology> topologies = {Topology{"two_by_two", {0, 0, 1, 1}, false, true},
                                      Topology{"interleaved", {0, 1, 0, 1}},
                                      Topology{"uneven_three_plus_one", {0, 0, 0, 1}},
                                      Topology{"uneven_interleaved", {0, 0, 1, 0}},
                                      Topology{"one_rank_per_host_permuted", {2, 0, 1}},
                                      Topology{"single_host", {0, 0, 0}},
                                      Topology{"no_intra_send_recv", {0, 1, 1, 0}, true}};
#ifdef ADAPTCOMM_TEST_HAVE_SHM
  topologies.push_back(Topology{"shm_within_hosts", {0, 0, 1, 1}, false, true, true});
  topologies.push_back(Topology{"shm_within_uneven_interleaved", {0, 1, 0, 0}, false, false, true});
#endif
  std::vector<testing::ConformanceTarget> targets;
  for (const Topology& topo : topologies) targets.push_back(HierTarget(topo));
  return targets;
}

INSTANTIATE_TEST_SUITE_P(Hier, BackendConformanceTest, ::testing::ValuesIn(HierTargets()),
                         testing::ConformanceTargetName);

// ---- refusals ----

TEST(HierBackendTest, RefusesWhatItCannotCarry) {
  const std::vector<int> host_of = {0, 0, 1, 1};
  RunRanks(RankMode::kThreads, 4, [&](const RankEnv& env) {
    std::unique_ptr<Backend> b = ConnectHier(env, host_of, "refuse");
    ASSERT_NE(b, nullptr);
    std::vector<int32_t> data(8);
    OpDesc send;
    send.kind = OpKind::kSend;
    send.input = HostView(data.data(), data.size());
    send.seq = 1;
    if (env.rank == 1) {
      // Without pair links (ConnectHier makes none) a non-leader cannot reach another host.
      send.peer = 2;
      absl::Status s = b->Supports(send);
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "only between host leaders")) << s;
      EXPECT_TRUE(absl::IsInvalidArgument(b->Run(send)));
    }
    if (env.rank == 0) {
      send.peer = 2;  // leader to leader: fine
      EXPECT_TRUE(b->Supports(send).ok());
      send.peer = 1;
      send.tag = kHierInternalTagBase + 3;
      absl::Status s = b->Supports(send);
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "reserved")) << s;
    }
    OpDesc avg;
    avg.kind = OpKind::kAllreduce;
    avg.reduce = ReduceOp::kAvg;
    avg.input = avg.output = HostView(data.data(), data.size());
    avg.seq = 2;
    absl::Status s = b->Supports(avg);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "i32")) << s;
    OpDesc cuda = avg;
    cuda.reduce = ReduceOp::kSum;
    cuda.output.device = Device::Cuda(0);
    EXPECT_TRUE(absl::IsInvalidArgument(b->Supports(cuda)));
    // Refusals do not break the backend.
    EXPECT_TRUE(b->health().ok()) << b->health();
    EXPECT_FALSE(b->capabilities().send_recv);  // some pairs cannot talk without pair links
    // Every rank is connected before any closes: Gloo's connect fails on a peer that already left.
    OpDesc barrier;
    barrier.kind = OpKind::kBarrier;
    barrier.seq = 3;
    EXPECT_TRUE(b->Run(barrier).ok()) << b->health();
  });
}

TEST(HierBackendTest, CreateRejectsInconsistentTopology) {
  auto store = CreateHashStore();
  int made = 0;
  auto make = [&](std::vector<int> host_of, int rank, int local, int intra_rank, int intra_size,
                  bool inter) {
    HierBackendOptions o;
    o.topology = {rank, static_cast<int>(host_of.size()), std::move(host_of), local};
    o.intra = Gloo(CreatePrefixStore(absl::StrCat("bad", ++made), store), intra_rank, intra_size);
    if (inter) o.inter = Gloo(CreatePrefixStore(absl::StrCat("bad-inter", ++made), store), 0, 1);
    return CreateHierarchicalBackend(std::move(o)).status();
  };
  // Host 1 has no rank: host indices must be dense.
  EXPECT_TRUE(absl::IsInvalidArgument(make({0, 2}, 0, 0, 0, 1, false)));
  // Local rank that host_of contradicts.
  EXPECT_TRUE(absl::IsInvalidArgument(make({0, 0}, 1, 0, 0, 1, false)));
  // Intra backend of the wrong size.
  absl::Status s = make({0, 0, 1}, 0, 0, 0, 1, false);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "expected 0 of 2")) << s;
  // A leader of a multi-host job without an inter-host backend.
  s = make({0, 1}, 0, 0, 0, 1, false);
  EXPECT_TRUE(absl::StrContains(s.message(), "needs an inter-host backend")) << s;
}

// ---- failures ----

// A rank's final status and when it came back.
struct Outcome {
  absl::Status status;
  absl::Time returned;
};

TEST(HierBackendTest, InnerFailureNamesTheLevelAndEveryRankReturnsPromptly) {
  const std::vector<int> host_of = {0, 0, 1, 1};
  std::vector<Outcome> outcomes(4);
  Wrappers wrap;
  // The leader of host 1 (global rank 2) fails its first inter-host op.
  wrap.inter = [](std::unique_ptr<Backend> b, int rank) {
    return rank == 2 ? std::unique_ptr<Backend>(new FailsAt(std::move(b), 1)) : std::move(b);
  };
  RunRanks(RankMode::kThreads, 4, [&](const RankEnv& env) {
    std::unique_ptr<Backend> b = ConnectHier(env, host_of, "inner-failure", wrap);
    ASSERT_NE(b, nullptr);
    std::vector<float> data(1000, 1.0f);
    OpDesc op;
    op.kind = OpKind::kAllreduce;
    op.input = op.output = HostView(data.data(), data.size());
    op.seq = 7;
    op.timeout = absl::Seconds(60);
    outcomes[static_cast<size_t>(env.rank)] = {b->Run(op), absl::Now()};
    // Broken now: later ops fail fast, naming the cause.
    op.seq = 8;
    absl::Status again = b->Run(op);
    EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
    EXPECT_TRUE(absl::StrContains(again.message(), "allreduce seq 8 not run")) << again;
    EXPECT_FALSE(b->health().ok());
  });
  const absl::Status& s2 = outcomes[2].status;
  EXPECT_TRUE(absl::IsUnavailable(s2)) << s2;
  EXPECT_TRUE(absl::StrContains(
      s2.message(),
      "allreduce #7: between hosts (leader of host 1, global rank 2), allreduce among leaders: "
      "injected failure"))
      << s2;
  absl::Time last = outcomes[2].returned;
  for (int r : {0, 1, 3}) {
    const absl::Status& s = outcomes[static_cast<size_t>(r)].status;
    EXPECT_FALSE(s.ok()) << "rank " << r;
    EXPECT_TRUE(absl::StrContains(s.message(), "allreduce #7: ")) << s;
    last = std::max(last, outcomes[static_cast<size_t>(r)].returned);
  }
  // Nobody waits for its 60 s timeout: rank 2 aborted its inner backends.
  EXPECT_LT(last - outcomes[2].returned, absl::Seconds(10));
  // Rank 3 was waiting for its leader's broadcast.
  EXPECT_TRUE(absl::StrContains(outcomes[3].status.message(), "within host 1 (global rank 3"))
      << outcomes[3].status;
}

TEST(HierBackendTest, AbsentRankTimesOutWithinTheOpBound) {
  const std::vector<int> host_of = {0, 0, 1, 1};
  std::vector<Outcome> outcomes(4);
  const absl::Duration timeout = absl::Seconds(2);
  std::atomic<int> finished{0};
  RunRanks(RankMode::kThreads, 4, [&](const RankEnv& env) {
    std::unique_ptr<Backend> b = ConnectHier(env, host_of, "absent");
    ASSERT_NE(b, nullptr);
    if (env.rank == 3) {
      // Connected but never joins the op: the others must give up on their own bound.
      while (finished.load() < 3) absl::SleepFor(absl::Milliseconds(10));
      return;
    }
    std::vector<float> data(1000, 1.0f);
    OpDesc op;
    op.kind = OpKind::kAllreduce;
    op.input = op.output = HostView(data.data(), data.size());
    op.seq = 3;
    op.timeout = timeout;
    const absl::Time t0 = absl::Now();
    outcomes[static_cast<size_t>(env.rank)] = {b->Run(op), absl::Now()};
    ++finished;
    EXPECT_LT(absl::Now() - t0, timeout + absl::Seconds(3)) << "rank " << env.rank;
  });
  for (int r : {0, 1, 2}) {
    const absl::Status& s = outcomes[static_cast<size_t>(r)].status;
    EXPECT_FALSE(s.ok()) << "rank " << r;
    EXPECT_TRUE(absl::StrContains(s.message(), "allreduce #3: ")) << s;
  }
  // Rank 2 was reducing with rank 3 inside host 1 and ran out of time there.
  EXPECT_TRUE(absl::IsDeadlineExceeded(outcomes[2].status)) << outcomes[2].status;
  EXPECT_TRUE(absl::StrContains(outcomes[2].status.message(),
                                "within host 1 (global rank 2, local rank 0 of 2), reduce to "
                                "the leader"))
      << outcomes[2].status;
}

// Abort() of a blocked rank: its op ends at once with Aborted, and the rank waiting on it inside
// its host fails promptly too (its inner backend's connection closes). A rank waiting on someone
// else entirely (rank 1, on rank 3 that never joins) is not told: it fails at its own bound, as
// with any backend (the communicator's failure coordination is what ends the others early).
// Aborted while blocked, not at the start of an inner op: a Gloo reduce/broadcast that begins
// while its backend is being aborted can miss the abort and wait out its timeout (a Gloo backend
// race, reproduced without this backend).
TEST(HierBackendTest, AbortEndsTheBlockedOpAndItsHostPeersPromptly) {
  const std::vector<int> host_of = {0, 1, 0, 1};
  const absl::Duration timeout = absl::Seconds(4);
  absl::Mutex mu;
  Backend* rank0 = nullptr;
  std::vector<Outcome> outcomes(4);
  std::atomic<int> started{0}, finished{0};
  absl::Time aborted_at;
  std::thread aborter([&] {
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (started.load() < 3 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(300));  // every rank is blocked by now
    absl::MutexLock lock(&mu);
    aborted_at = absl::Now();
    if (rank0 != nullptr) rank0->Abort(absl::CancelledError("test abort"));
  });
  RunRanks(RankMode::kThreads, 4, [&](const RankEnv& env) {
    std::unique_ptr<Backend> b = ConnectHier(env, host_of, "abort");
    ASSERT_NE(b, nullptr);
    if (env.rank == 3) {
      // Connected, never joins: rank 1 (its leader) stays blocked in the reduce within host 1.
      while (finished.load() < 3) absl::SleepFor(absl::Milliseconds(10));
      return;
    }
    if (env.rank == 0) {
      absl::MutexLock lock(&mu);
      rank0 = b.get();
    }
    std::vector<float> data(1000, 1.0f);
    OpDesc op;
    op.kind = OpKind::kAllreduce;
    op.input = op.output = HostView(data.data(), data.size());
    op.seq = 5;
    op.timeout = timeout;
    ++started;
    outcomes[static_cast<size_t>(env.rank)] = {b->Run(op), absl::Now()};
    ++finished;
    if (env.rank == 0) {
      // The aborter may still hold the pointer.
      absl::MutexLock lock(&mu);
      rank0 = nullptr;
    }
  });
  aborter.join();
  const Outcome& r0 = outcomes[0];
  EXPECT_TRUE(absl::IsAborted(r0.status)) << r0.status;
  EXPECT_TRUE(absl::StrContains(r0.status.message(), "test abort")) << r0.status;
  EXPECT_TRUE(absl::StrContains(r0.status.message(), "interrupted in allreduce #5: between hosts"))
      << r0.status;
  EXPECT_LT(r0.returned - aborted_at, absl::Seconds(2)) << r0.status;
  const Outcome& r2 = outcomes[2];
  EXPECT_FALSE(r2.status.ok());
  EXPECT_TRUE(absl::StrContains(r2.status.message(), "allreduce #5: within host 0 (global rank 2"))
      << r2.status;
  EXPECT_LT(r2.returned - aborted_at, absl::Seconds(2)) << r2.status;
  const Outcome& r1 = outcomes[1];
  EXPECT_TRUE(absl::IsDeadlineExceeded(r1.status)) << r1.status;
  EXPECT_TRUE(absl::StrContains(r1.status.message(), "within host 1 (global rank 1")) << r1.status;
  EXPECT_LT(r1.returned - aborted_at, timeout + absl::Seconds(2)) << r1.status;
}

}  // namespace
}  // namespace adaptcomm

// The hierarchical backend driven directly, ranks as threads: hosts are faked by giving each rank
// its host index, with Gloo inside every "host" and Gloo between the leaders (each group over the
// harness store under its own prefix).
//
// Values are small integers, so every sum and product is exact in every dtype whatever order the
// levels reduce in (|sum| <= 40, |product| <= 16 over 4 ranks: exact in bf16's 8-bit mantissa), and
// avg is the exact sum divided once in the element type - the reference does the same.
#include "lib/hier/hier_backend.h"

#include <gtest/gtest.h>

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
#include "tests/dtype_values.h"
#include "tests/harness.h"
#if __has_include("lib/shm/shm_backend.h")
#include "lib/shm/shm_backend.h"
#define ADAPTCOMM_TEST_HAVE_SHM 1
#endif

namespace adaptcomm {
namespace {

using ::adaptcomm::testing::Combine;
using ::adaptcomm::testing::LoadAs;
using ::adaptcomm::testing::RankEnv;
using ::adaptcomm::testing::RankMode;
using ::adaptcomm::testing::RoundTo;
using ::adaptcomm::testing::RunRanks;
using ::adaptcomm::testing::StoreAs;

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

// ---- values and reference ----

double Value(DType t, ReduceOp op, int r, size_t i) {
  const bool is_unsigned = t == DType::kU8;
  if (op == ReduceOp::kProd) {
    const auto v = static_cast<double>((static_cast<size_t>(r) + i) % 5);
    return is_unsigned ? std::fmod(v, 3.0) : v - 2.0;
  }
  const auto v = static_cast<double>((static_cast<size_t>(r) * 7 + i * 3) % 11);
  return is_unsigned ? v : v - 5.0;
}

double Reduced(DType t, ReduceOp op, int n, size_t i) {
  double acc = Value(t, op, 0, i);
  for (int r = 1; r < n; ++r) acc = Combine(op, acc, Value(t, op, r, i));
  if (op != ReduceOp::kAvg) return acc;
  if (t == DType::kF64) return acc / n;
  return RoundTo(t, static_cast<double>(static_cast<float>(acc) / static_cast<float>(n)));
}

struct Buf {
  Buf(DType t, size_t count) : dtype(t), bytes(count * DTypeSize(t) + 1) {}
  TensorView View(size_t count, size_t offset = 0) {
    return TensorView{bytes.data() + offset * DTypeSize(dtype), count, dtype, Device::Cpu(),
                      nullptr};
  }
  void Set(size_t i, double v) { StoreAs(dtype, v, bytes.data() + i * DTypeSize(dtype)); }
  double Get(size_t i) const { return LoadAs(dtype, bytes.data() + i * DTypeSize(dtype)); }
  DType dtype;
  std::vector<uint8_t> bytes;
};

// Compares `count` elements from `first` with want(i); reports the first mismatch only.
void Check(const std::string& what, const Buf& got, size_t first, size_t count,
           const std::function<double(size_t)>& want) {
  for (size_t i = 0; i < count; ++i) {
    const double g = got.Get(first + i);
    const double w = want(i);
    if (g != w) {
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", expected " << w;
      return;
    }
  }
}

// ---- cases ----

struct Case {
  OpKind kind;
  DType dtype;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;  // per-rank block (allgather input, reduce_scatter output, alltoall block)
  bool in_place = false;
};

// Ranks exchange within their host (a ring over the local ranks) and the leaders among
// themselves (a ring over the hosts): the pairs the hierarchical backend carries.
void RunSendRecv(Backend& b, const std::vector<int>& host_of, const Case& c, uint64_t seq,
                 const std::string& what) {
  const int r = b.rank();
  const Place p = PlaceOf(host_of, r);
  const DType t = c.dtype;
  auto ranks_of_host = [&](int h) {
    std::vector<int> out;
    for (size_t g = 0; g < host_of.size(); ++g) {
      if (host_of[g] == h) out.push_back(static_cast<int>(g));
    }
    return out;
  };
  auto ring = [&](const std::vector<int>& members, int index, const char* name) {
    const int m = static_cast<int>(members.size());
    if (m < 2) return;
    Buf in(t, c.count), out(t, c.count);
    for (size_t i = 0; i < c.count; ++i) in.Set(i, Value(t, c.op, r, i));
    OpDesc send, recv;
    send.kind = OpKind::kSend;
    send.peer = members[static_cast<size_t>((index + 1) % m)];
    send.input = in.View(c.count);
    recv.kind = OpKind::kRecv;
    recv.peer = members[static_cast<size_t>((index + m - 1) % m)];
    recv.output = out.View(c.count);
    for (OpDesc* d : {&send, &recv}) {
      d->seq = seq;
      d->tag = static_cast<uint32_t>(seq);
      d->timeout = kOpTimeout;
    }
    if (index % 2 == 0) {
      ASSERT_TRUE(b.Run(send).ok()) << what << " " << name;
      ASSERT_TRUE(b.Run(recv).ok()) << what << " " << name;
    } else {
      ASSERT_TRUE(b.Run(recv).ok()) << what << " " << name;
      ASSERT_TRUE(b.Run(send).ok()) << what << " " << name;
    }
    Check(absl::StrCat(what, " ", name), out, 0, c.count,
          [&](size_t i) { return Value(t, c.op, recv.peer, i); });
  };
  ring(ranks_of_host(p.host), p.local, "within the host");
  if (p.local == 0) {
    std::vector<int> leaders;
    for (int h = 0; h < p.hosts; ++h) leaders.push_back(ranks_of_host(h)[0]);
    ring(leaders, p.host, "between leaders");
  }
}

void RunCase(Backend& b, const std::vector<int>& host_of, const Case& c, uint64_t seq) {
  const int n = b.size();
  const int r = b.rank();
  const DType t = c.dtype;
  const auto un = static_cast<size_t>(n);
  const std::string what =
      absl::StrCat(OpKindName(c.kind), " ", DTypeName(t), " ", ReduceOpName(c.op), " count ",
                   c.count, c.in_place ? " in place" : "", " on rank ", r, " of hosts {",
                   absl::StrJoin(host_of, ","), "}");
  OpDesc op;
  op.kind = c.kind;
  op.reduce = c.op;
  op.seq = seq;
  op.timeout = kOpTimeout;
  op.root = static_cast<int>(seq % un);
  auto value = [&](int rank, size_t i) { return Value(t, c.op, rank, i); };
  switch (c.kind) {
    case OpKind::kAllreduce:
    case OpKind::kBroadcast:
    case OpKind::kReduce: {
      Buf buf(t, c.count);
      for (size_t i = 0; i < c.count; ++i) buf.Set(i, value(r, i));
      op.input = op.output = buf.View(c.count);
      ASSERT_TRUE(b.Run(op).ok()) << what << ": " << b.health();
      if (c.kind == OpKind::kBroadcast) {
        Check(what, buf, 0, c.count, [&](size_t i) { return value(op.root, i); });
      } else if (c.kind == OpKind::kReduce && r != op.root) {
        Check(what + " (non-root keeps its input)", buf, 0, c.count,
              [&](size_t i) { return value(r, i); });
      } else {
        Check(what, buf, 0, c.count, [&](size_t i) { return Reduced(t, c.op, n, i); });
      }
      return;
    }
    case OpKind::kAllgather: {
      Buf out(t, c.count * un), in(t, c.count);
      Buf& src = c.in_place ? out : in;
      const size_t at = c.in_place ? static_cast<size_t>(r) * c.count : 0;
      for (size_t i = 0; i < c.count; ++i) src.Set(at + i, value(r, i));
      op.input = src.View(c.count, at);
      op.output = out.View(c.count * un);
      ASSERT_TRUE(b.Run(op).ok()) << what << ": " << b.health();
      Check(what, out, 0, c.count * un,
            [&](size_t i) { return value(static_cast<int>(i / c.count), i % c.count); });
      return;
    }
    case OpKind::kReduceScatter: {
      Buf in(t, c.count * un), out(t, c.count);
      for (size_t i = 0; i < c.count * un; ++i) in.Set(i, value(r, i));
      op.input = in.View(c.count * un);
      Buf& dst = c.in_place ? in : out;
      const size_t at = c.in_place ? static_cast<size_t>(r) * c.count : 0;
      op.output = dst.View(c.count, at);
      ASSERT_TRUE(b.Run(op).ok()) << what << ": " << b.health();
      Check(what, dst, at, c.count,
            [&](size_t i) { return Reduced(t, c.op, n, static_cast<size_t>(r) * c.count + i); });
      return;
    }
    case OpKind::kAlltoall: {
      // Block j of rank r's input holds Value(r, j*count + i) and goes to rank j.
      Buf in(t, c.count * un), out(t, c.count * un);
      for (size_t i = 0; i < c.count * un; ++i) in.Set(i, value(r, i));
      op.input = in.View(c.count * un);
      Buf& dst = c.in_place ? in : out;
      op.output = dst.View(c.count * un);
      ASSERT_TRUE(b.Run(op).ok()) << what << ": " << b.health();
      Check(what, dst, 0, c.count * un, [&](size_t i) {
        return value(static_cast<int>(i / c.count), static_cast<size_t>(r) * c.count + i % c.count);
      });
      return;
    }
    case OpKind::kSend:
    case OpKind::kRecv:
      return RunSendRecv(b, host_of, c, seq, what);
    case OpKind::kBarrier:
      ASSERT_TRUE(b.Run(op).ok()) << what << ": " << b.health();
      return;
  }
}

std::vector<Case> AllCases(bool full_dtypes) {
  std::vector<Case> cases;
  const std::vector<DType> dtypes =
      full_dtypes ? std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes))
                  : std::vector<DType>{DType::kF32, DType::kBF16, DType::kI32};
  for (DType t : dtypes) {
    for (OpKind k : {OpKind::kAllreduce, OpKind::kReduce, OpKind::kReduceScatter}) {
      for (ReduceOp op : kAllReduceOps) {
        if (op == ReduceOp::kAvg && !IsFloatingPoint(t)) continue;
        for (size_t count : {size_t{1}, size_t{7}, size_t{1000}})
          cases.push_back({k, t, op, count});
      }
    }
    for (OpKind k : {OpKind::kBroadcast, OpKind::kAllgather, OpKind::kAlltoall, OpKind::kSend}) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
        cases.push_back({k, t, ReduceOp::kSum, count});
      }
    }
  }
  // 256 KiB per rank block once per op kind; in-place variants.
  for (OpKind k : {OpKind::kAllreduce, OpKind::kBroadcast, OpKind::kReduce, OpKind::kAllgather,
                   OpKind::kReduceScatter, OpKind::kAlltoall}) {
    cases.push_back({k, DType::kF32, ReduceOp::kSum, size_t{64} << 10});
  }
  cases.push_back({OpKind::kAllreduce, DType::kBF16, ReduceOp::kAvg, size_t{128} << 10});
  for (size_t count : {size_t{7}, size_t{1000}}) {
    cases.push_back({OpKind::kAllgather, DType::kF32, ReduceOp::kSum, count, true});
    cases.push_back({OpKind::kReduceScatter, DType::kF32, ReduceOp::kSum, count, true});
    cases.push_back({OpKind::kReduceScatter, DType::kBF16, ReduceOp::kAvg, count, true});
    cases.push_back({OpKind::kAlltoall, DType::kI32, ReduceOp::kSum, count, true});
  }
  cases.push_back({OpKind::kBarrier, DType::kF32});
  return cases;
}

struct Topology {
  std::string name;
  std::vector<int> host_of;
  bool intra_without_send_recv = false;
  bool full_dtypes = false;
  bool intra_shm = false;
};

// Names the parameter in test output (and keeps ctest's names free of raw bytes).
void PrintTo(const Topology& t, std::ostream* os) {
  *os << t.name << " {" << absl::StrJoin(t.host_of, ",") << "}";
}

class HierCollectivesTest : public ::testing::TestWithParam<Topology> {};

TEST_P(HierCollectivesTest, EveryOpDtypeAndReduceOpMatchesReference) {
  const Topology& topo = GetParam();
  const int n = static_cast<int>(topo.host_of.size());
  Wrappers wrap;
  if (topo.intra_without_send_recv) {
    wrap.intra = [](std::unique_ptr<Backend> b, int) {
      return std::unique_ptr<Backend>(new NoSendRecv(std::move(b)));
    };
  }
#ifndef ADAPTCOMM_TEST_HAVE_SHM
  if (topo.intra_shm) GTEST_SKIP() << "this build has no shared-memory backend";
#endif
  const std::vector<Case> cases = AllCases(topo.full_dtypes);
  RunRanks(RankMode::kThreads, n, [&](const RankEnv& env) {
    std::unique_ptr<Backend> b = ConnectHier(env, topo.host_of, topo.name, wrap, topo.intra_shm);
    ASSERT_NE(b, nullptr);
    EXPECT_STREQ(b->name(), "hier");
    EXPECT_FALSE(b->capabilities().device_memory);
    uint64_t seq = 0;
    for (const Case& c : cases) {
      RunCase(*b, topo.host_of, c, ++seq);
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_TRUE(b->health().ok()) << b->health();
  });
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, HierCollectivesTest,
    ::testing::Values(Topology{"two_by_two", {0, 0, 1, 1}, false, true},
                      Topology{"interleaved", {0, 1, 0, 1}},
                      Topology{"uneven_three_plus_one", {0, 0, 0, 1}},
                      Topology{"uneven_interleaved", {0, 0, 1, 0}},
                      Topology{"one_rank_per_host_permuted", {2, 0, 1}},
                      Topology{"single_host", {0, 0, 0}},
                      Topology{"no_intra_send_recv", {0, 1, 1, 0}, true},
                      Topology{"shm_within_hosts", {0, 0, 1, 1}, false, true, true},
                      Topology{"shm_within_uneven_interleaved", {0, 1, 0, 0}, false, false, true}),
    [](const auto& info) { return info.param.name; });

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

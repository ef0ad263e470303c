// The conformance suite every Backend passes, driven through the Backend interface alone (no
// Communicator): every op x dtype x reduce op x size checked element by element against a
// reference computed here, in-place variants, bad input refused with InvalidArgument without
// breaking the backend, and an aborted backend refusing every op with FailedPrecondition.
//
// A backend's test file includes this header (one file per test binary: it defines the tests)
// and instantiates the suite with the ways to make its ranks:
//
//   INSTANTIATE_TEST_SUITE_P(Gloo, BackendConformanceTest,
//                            ::testing::Values(ConformanceTarget{.name = "threads3", .world = 3,
//                                                               .prepare = ...}),
//                            ConformanceTargetName);
//
// Values are small integers, so every sum and product is exact in every dtype whatever order a
// backend reduces in (|sum| <= 40 and |product| <= 16 over 4 ranks: exact in bf16's 8-bit
// mantissa and in i8). avg may differ from the reference in the last place of the dtype (a
// backend may scale by 1/n instead of dividing), so it alone is compared with a tolerance.
#ifndef ADAPTCOMM_TESTS_BACKEND_CONFORMANCE_H_
#define ADAPTCOMM_TESTS_BACKEND_CONFORMANCE_H_

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/ext/backend.h"
#include "adaptcomm/store.h"
#include "gtest/gtest.h"
#include "tests/dtype_values.h"
#include "tests/harness.h"

namespace adaptcomm::testing {

// Makes rank `rank` of `world` on this thread or process; ranks rendezvous through `store`.
using RankBackendFactory =
    std::function<std::unique_ptr<Backend>(int rank, int world, std::shared_ptr<Store> store)>;

// One backend under test: a parameter of the suite.
struct ConformanceTarget {
  std::string name{};  // the test's name within its instantiation: "threads3"
  int world = 2;
  RankMode mode = RankMode::kThreads;
  Device device = Device::Cpu();  // where the suite's buffers say they live (the fakes: cuda:0)
  // Called once per test before the ranks start (in the test's process): returns what each rank
  // calls to make its backend, so that state the ranks share (a fake device world) is made once.
  std::function<RankBackendFactory()> prepare{};
  std::vector<DType> dtypes{std::begin(kAllDTypes), std::end(kAllDTypes)};
  // Element counts (per rank block) run for every op x dtype x reduce op.
  std::vector<size_t> counts{1, 7, 1000};
  // Bytes of a large block run once per op for each of `large_dtypes` (sum); 0: none.
  size_t large_bytes = size_t{1} << 20;
  std::vector<DType> large_dtypes{std::begin(kAllDTypes), std::end(kAllDTypes)};
  // The rings that send/recv runs over, each a list of ranks that pass their block to the next;
  // empty: one ring of every rank. Every rank takes the rings it is in, in this order.
  std::vector<std::vector<int>> rings{};
};

inline void PrintTo(const ConformanceTarget& t, std::ostream* os) { *os << t.name; }

inline std::string ConformanceTargetName(const ::testing::TestParamInfo<ConformanceTarget>& info) {
  return info.param.name;
}

class BackendConformanceTest : public ::testing::TestWithParam<ConformanceTarget> {
 protected:
  // Runs body(backend) on every rank of the target, each with its own backend.
  void OnEveryRank(const std::function<void(Backend&)>& body) {
    const ConformanceTarget& t = GetParam();
    ASSERT_TRUE(t.prepare) << t.name << ": no prepare";
    const RankBackendFactory make = t.prepare();
    std::string dir;
    if (t.mode == RankMode::kProcesses) {
      char tmpl[] = "/tmp/backend_conformance.XXXXXX";
      const char* made = mkdtemp(tmpl);
      ASSERT_NE(made, nullptr);
      dir = made;
    }
    RunRanks(
        t.mode, t.world,
        [&](const RankEnv& env) {
          std::shared_ptr<Store> store = env.options.store;
          if (store == nullptr) {  // processes: rendezvous through files
            absl::StatusOr<std::shared_ptr<Store>> files = CreateFileStore(dir);
            ASSERT_TRUE(files.ok()) << files.status();
            store = *files;
          }
          std::unique_ptr<Backend> b = make(env.rank, t.world, store);
          ASSERT_NE(b, nullptr) << "rank " << env.rank << " has no backend";
          // Every rank made its backend before any runs the body: an Abort() must not cut a
          // peer's connecting.
          std::vector<std::string> made;
          for (int r = 0; r < t.world; ++r) made.push_back(absl::StrCat("conformance_made_", r));
          ASSERT_TRUE(store->Set(made[static_cast<size_t>(env.rank)], "1").ok());
          const absl::Status all = store->Wait(made, absl::Seconds(60));
          ASSERT_TRUE(all.ok()) << all;
          ASSERT_EQ(b->rank(), env.rank);
          ASSERT_EQ(b->size(), t.world);
          body(*b);
        },
        absl::Seconds(240));
  }
};

namespace conformance {

constexpr absl::Duration kOpTimeout = absl::Seconds(30);

// Rank r's value at element i.
inline double Value(DType t, ReduceOp op, int r, size_t i) {
  const bool is_unsigned = t == DType::kU8;
  if (op == ReduceOp::kProd) {
    const auto v = static_cast<double>((static_cast<size_t>(r) + i) % 5);
    return is_unsigned ? std::fmod(v, 3.0) : v - 2.0;  // {0..2} or {-2..2}: |product| <= 16
  }
  const auto v = static_cast<double>((static_cast<size_t>(r) * 7 + i * 3) % 11);
  return is_unsigned ? v : v - 5.0;  // {0..10} or {-5..5}: |sum| <= 40
}

// The reduction of element i over n ranks; avg divides the exact sum once, in the dtype.
inline double Reduced(DType t, ReduceOp op, int n, size_t i) {
  double acc = Value(t, op, 0, i);
  for (int r = 1; r < n; ++r) acc = Combine(op, acc, Value(t, op, r, i));
  if (op != ReduceOp::kAvg) return acc;
  if (t == DType::kF64) return acc / n;
  return RoundTo(t, static_cast<double>(static_cast<float>(acc) / static_cast<float>(n)));
}

// A buffer of `count` elements (never empty), as views on the target's device.
struct Buf {
  Buf(DType t, size_t count, Device device)
      : dtype(t), device(device), bytes(count * DTypeSize(t) + 1) {}
  TensorView View(size_t count, size_t offset = 0) {
    return TensorView{bytes.data() + offset * DTypeSize(dtype), count, dtype, device, nullptr};
  }
  void Set(size_t i, double v) { StoreAs(dtype, v, bytes.data() + i * DTypeSize(dtype)); }
  double Get(size_t i) const { return LoadAs(dtype, bytes.data() + i * DTypeSize(dtype)); }
  DType dtype;
  Device device;
  std::vector<uint8_t> bytes;
};

// Compares `count` elements from `first` with want(i), exactly (avg: to the dtype's last
// places); reports the first mismatch only.
inline void Check(const std::string& what, const Buf& got, size_t first, size_t count, ReduceOp op,
                  const std::function<double(size_t)>& want) {
  const bool half = got.dtype == DType::kF16 || got.dtype == DType::kBF16;
  const double tolerance = op != ReduceOp::kAvg ? 0 : half ? 1e-2 : 1e-6;
  for (size_t i = 0; i < count; ++i) {
    const double g = got.Get(first + i);
    const double w = want(i);
    if (std::abs(g - w) > tolerance * std::abs(w)) {
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", expected " << w;
      return;
    }
  }
}

struct Case {
  OpKind kind;
  DType dtype;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;  // per-rank block (allgather input, reduce_scatter output, alltoall block)
  bool in_place = false;
};

inline std::vector<Case> CasesFor(const ConformanceTarget& t) {
  std::vector<Case> cases;
  for (DType d : t.dtypes) {
    std::vector<size_t> counts = t.counts;
    const bool has_large =
        std::find(t.large_dtypes.begin(), t.large_dtypes.end(), d) != t.large_dtypes.end();
    const size_t large = has_large ? t.large_bytes / DTypeSize(d) : 0;
    for (OpKind k : {OpKind::kAllreduce, OpKind::kReduce, OpKind::kReduceScatter}) {
      for (ReduceOp op : kAllReduceOps) {
        if (op == ReduceOp::kAvg && !IsFloatingPoint(d)) continue;
        for (size_t count : counts) cases.push_back({k, d, op, count});
        if (large > 0 && op == ReduceOp::kSum) cases.push_back({k, d, op, large});
      }
    }
    if (large > 0) counts.push_back(large);
    for (OpKind k : {OpKind::kBroadcast, OpKind::kAllgather, OpKind::kAlltoall, OpKind::kSend}) {
      for (size_t count : counts) cases.push_back({k, d, ReduceOp::kSum, count});
    }
  }
  for (size_t count : {size_t{7}, size_t{1000}}) {
    cases.push_back({OpKind::kAllgather, DType::kF32, ReduceOp::kSum, count, true});
    cases.push_back({OpKind::kReduceScatter, DType::kF32, ReduceOp::kSum, count, true});
    cases.push_back({OpKind::kReduceScatter, DType::kBF16, ReduceOp::kAvg, count, true});
    cases.push_back({OpKind::kAlltoall, DType::kI32, ReduceOp::kSum, count, true});
  }
  cases.push_back({OpKind::kReduceScatter, DType::kF32, ReduceOp::kSum, 2});  // blocks of two
  cases.push_back({OpKind::kBarrier, DType::kF32});
  return cases;
}

// Every rank passes its block to the next of each ring it is in: even positions send first, odd
// ones receive first, so that blocking sends cannot form a cycle.
inline void RunRings(Backend& b, const ConformanceTarget& t, const Case& c, uint64_t seq,
                     const std::string& what) {
  std::vector<std::vector<int>> rings = t.rings;
  if (rings.empty()) {
    rings.emplace_back();
    for (int r = 0; r < t.world; ++r) rings.back().push_back(r);
  }
  const int me = b.rank();
  for (const std::vector<int>& ring : rings) {
    const int m = static_cast<int>(ring.size());
    const int at = static_cast<int>(std::find(ring.begin(), ring.end(), me) - ring.begin());
    if (m < 2 || at == m) continue;
    Buf in(c.dtype, c.count, t.device), out(c.dtype, c.count, t.device);
    for (size_t i = 0; i < c.count; ++i) in.Set(i, Value(c.dtype, c.op, me, i));
    OpDesc send, recv;
    send.kind = OpKind::kSend;
    send.peer = ring[static_cast<size_t>((at + 1) % m)];
    send.input = in.View(c.count);
    recv.kind = OpKind::kRecv;
    recv.peer = ring[static_cast<size_t>((at + m - 1) % m)];
    recv.output = out.View(c.count);
    for (OpDesc* d : {&send, &recv}) {
      d->seq = seq;
      d->tag = static_cast<uint32_t>(seq);
      d->timeout = kOpTimeout;
    }
    for (const OpDesc* d :
         at % 2 == 0 ? std::vector<OpDesc*>{&send, &recv} : std::vector<OpDesc*>{&recv, &send}) {
      ASSERT_TRUE(b.Run(*d).ok()) << what << " " << OpKindName(d->kind) << ": " << b.health();
    }
    Check(what, out, 0, c.count, c.op,
          [&](size_t i) { return Value(c.dtype, c.op, recv.peer, i); });
  }
}

// Runs one case on this rank and checks what it holds afterwards.
inline void RunCase(Backend& b, const ConformanceTarget& t, const Case& c, uint64_t seq) {
  const int n = b.size(), r = b.rank();
  const auto un = static_cast<size_t>(n), ur = static_cast<size_t>(r);
  const DType d = c.dtype;
  const std::string what =
      absl::StrCat(OpKindName(c.kind), " ", DTypeName(d), " ", ReduceOpName(c.op), " count ",
                   c.count, c.in_place ? " in place" : "", " on rank ", r, " of ", n);
  OpDesc op;
  op.kind = c.kind;
  op.reduce = c.op;
  op.seq = seq;
  op.timeout = kOpTimeout;
  op.root = static_cast<int>(seq % un);
  auto value = [&](int rank, size_t i) { return Value(d, c.op, rank, i); };
  auto run = [&] { ASSERT_TRUE(b.Run(op).ok()) << what << ": " << b.health(); };
  switch (c.kind) {
    case OpKind::kAllreduce:
    case OpKind::kBroadcast:
    case OpKind::kReduce: {
      Buf buf(d, c.count, t.device);
      for (size_t i = 0; i < c.count; ++i) buf.Set(i, value(r, i));
      op.input = op.output = buf.View(c.count);
      run();
      if (c.kind == OpKind::kBroadcast) {
        Check(what, buf, 0, c.count, c.op, [&](size_t i) { return value(op.root, i); });
      } else if (c.kind == OpKind::kAllreduce || r == op.root) {
        Check(what, buf, 0, c.count, c.op, [&](size_t i) { return Reduced(d, c.op, n, i); });
      }
      return;
    }
    case OpKind::kAllgather: {
      Buf out(d, c.count * un, t.device), in(d, c.count, t.device);
      Buf& src = c.in_place ? out : in;
      const size_t at = c.in_place ? ur * c.count : 0;
      for (size_t i = 0; i < c.count; ++i) src.Set(at + i, value(r, i));
      op.input = src.View(c.count, at);
      op.output = out.View(c.count * un);
      run();
      Check(what, out, 0, c.count * un, c.op,
            [&](size_t i) { return value(static_cast<int>(i / c.count), i % c.count); });
      return;
    }
    case OpKind::kReduceScatter: {
      Buf in(d, c.count * un, t.device), out(d, c.count, t.device);
      for (size_t i = 0; i < c.count * un; ++i) in.Set(i, value(r, i));
      op.input = in.View(c.count * un);
      Buf& dst = c.in_place ? in : out;
      const size_t at = c.in_place ? ur * c.count : 0;
      op.output = dst.View(c.count, at);
      run();
      Check(what, dst, at, c.count, c.op,
            [&](size_t i) { return Reduced(d, c.op, n, ur * c.count + i); });
      return;
    }
    case OpKind::kAlltoall: {
      // Block j of rank r's input holds Value(r, j * count + i) and goes to rank j.
      Buf in(d, c.count * un, t.device), out(d, c.count * un, t.device);
      for (size_t i = 0; i < c.count * un; ++i) in.Set(i, value(r, i));
      op.input = in.View(c.count * un);
      Buf& dst = c.in_place ? in : out;
      op.output = dst.View(c.count * un);
      run();
      Check(what, dst, 0, c.count * un, c.op, [&](size_t i) {
        return value(static_cast<int>(i / c.count), ur * c.count + i % c.count);
      });
      return;
    }
    case OpKind::kSend:
    case OpKind::kRecv:
      return RunRings(b, t, c, seq, what);
    case OpKind::kBarrier:
      return run();
  }
}

inline OpDesc SmallAllreduce(std::vector<float>& data, Device device, uint64_t seq) {
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.input = op.output = TensorView{data.data(), data.size(), DType::kF32, device, nullptr};
  op.seq = seq;
  op.timeout = kOpTimeout;
  return op;
}

}  // namespace conformance

TEST_P(BackendConformanceTest, EveryOpDTypeReduceOpAndSizeMatchesTheReference) {
  const ConformanceTarget& t = GetParam();
  const std::vector<conformance::Case> cases = conformance::CasesFor(t);
  OnEveryRank([&](Backend& b) {
    uint64_t seq = 0;
    for (const conformance::Case& c : cases) {
      conformance::RunCase(b, t, c, ++seq);
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_TRUE(b.health().ok()) << b.health();
  });
}

// Each rank alone: what a backend refuses it refuses in Supports() and in Run() with
// InvalidArgument, before any traffic, and stays usable (the collective afterwards).
TEST_P(BackendConformanceTest, BadInputIsInvalidArgumentAndLeavesTheBackendUsable) {
  const ConformanceTarget& t = GetParam();
  OnEveryRank([&](Backend& b) {
    std::vector<int32_t> ints(4, 1);
    std::vector<float> floats(4, 1.0f);
    std::vector<OpDesc> bad;
    OpDesc op;  // an integer average would truncate
    op.kind = OpKind::kAllreduce;
    op.reduce = ReduceOp::kAvg;
    op.input = op.output = TensorView{ints.data(), ints.size(), DType::kI32, t.device, nullptr};
    bad.push_back(op);
    op = conformance::SmallAllreduce(floats, t.device, 1);  // memory of the other kind
    op.output.device = op.input.device = t.device.is_cuda() ? Device::Cpu() : Device::Cuda(0);
    bad.push_back(op);
    op = conformance::SmallAllreduce(floats, t.device, 1);
    op.kind = static_cast<OpKind>(200);  // no op of the interface
    bad.push_back(op);
    op = conformance::SmallAllreduce(floats, t.device, 1);
    op.kind = OpKind::kSend;
    op.peer = b.rank();  // to itself
    bad.push_back(op);
    op.peer = b.size();  // to no rank
    bad.push_back(op);
    for (const OpDesc& d : bad) {
      const std::string what = absl::StrCat(static_cast<int>(d.kind), " peer ", d.peer, " on ",
                                            d.output.device.is_cuda() ? "cuda" : "cpu");
      const absl::Status supported = b.Supports(d);
      EXPECT_TRUE(absl::IsInvalidArgument(supported)) << what << ": " << supported;
      const absl::Status ran = b.Run(d);
      EXPECT_TRUE(absl::IsInvalidArgument(ran)) << what << ": " << ran;
    }
    EXPECT_TRUE(b.health().ok()) << b.health();
    std::vector<float> data(5, static_cast<float>(b.rank() + 1));
    ASSERT_TRUE(b.Run(conformance::SmallAllreduce(data, t.device, 2)).ok()) << b.health();
    const int n = b.size();
    for (float x : data) EXPECT_EQ(x, static_cast<float>(n * (n + 1) / 2));
  });
}

// After Abort() the backend is broken for good: health() is the abort, every op and group is
// refused with FailedPrecondition naming the op and the reason, and a second Abort() changes
// nothing.
TEST_P(BackendConformanceTest, AbortedBackendRefusesEveryOpByName) {
  const ConformanceTarget& t = GetParam();
  OnEveryRank([&](Backend& b) {
    b.Abort(absl::CancelledError("conformance abort"));
    const absl::Status health = b.health();
    EXPECT_TRUE(absl::IsAborted(health)) << health;
    EXPECT_TRUE(absl::StrContains(health.message(), "conformance abort")) << health;
    std::vector<float> data(4, 1.0f);
    const OpDesc op = conformance::SmallAllreduce(data, t.device, 7);
    const absl::Status s = b.Run(op);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "backend is broken; allreduce seq 7 not run")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "conformance abort")) << s;
    if (GroupRunner* groups = b.groups(); groups != nullptr) {
      const absl::Status g = groups->RunGroup({op, op});
      EXPECT_TRUE(absl::IsFailedPrecondition(g)) << g;
    }
    b.Abort(absl::UnavailableError("a second abort"));
    EXPECT_EQ(b.health(), health);
  });
}

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_BACKEND_CONFORMANCE_H_

// The shm backend on its own (no communicator): the conformance suite at sizes that cross the
// flat/chunked threshold and the slot size, on threads and processes; wire casts; a killed, a
// stopped and an aborted rank; segments that leak nothing; layout skew and size limits refused at
// creation.
#include "lib/shm/shm_backend.h"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/casts.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/adaptcomm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/cast_kernels.h"
#include "lib/config/tuned_table.h"
#include "lib/trace/culprit.h"
#include "tests/backend_conformance.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using testing::BackendConformanceTest;
using testing::ConformanceTarget;
using ::testing::HasSubstr;
using testing::RankMode;

std::string TempDir() {
  char tmpl[] = "/tmp/shm_backend_test.XXXXXX";
  const char* dir = mkdtemp(tmpl);
  return dir != nullptr ? dir : "";
}

// Options with a 64 KiB slot (32 KiB per step), so a few thousand elements already run chunked.
ShmBackendOptions SmallOptions(int rank, int world, std::shared_ptr<Store> store) {
  ShmBackendOptions o;
  o.rank = rank;
  o.size = world;
  o.store = std::move(store);
  o.init_timeout = absl::Seconds(20);
  o.slot_bytes = 64 << 10;
  o.p2p_bytes = 16 << 10;
  o.flat_max_bytes = 1 << 10;
  o.chunk_bytes = 8 << 10;
  return o;
}

using Body = std::function<void(int rank, int world, const std::string& store_dir)>;

// Runs body on `world` ranks (threads or forked processes) sharing a file store directory.
void RunShm(RankMode mode, int world, const Body& body) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  if (mode == RankMode::kThreads) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(r, world, dir); });
    for (auto& t : threads) t.join();
    return;
  }
  testing::RunRanks(
      mode, world, [&](const testing::RankEnv& env) { body(env.rank, world, dir); },
      absl::Seconds(120));
}

std::unique_ptr<Backend> Create(const ShmBackendOptions& o) {
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateShmBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

std::shared_ptr<Store> FileStore(const std::string& dir) {
  absl::StatusOr<std::shared_ptr<Store>> s = CreateFileStore(dir);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : CreateHashStore();
}

// OpDesc grows fields (the engine adds some): build it by member, not by aggregate.
OpDesc Op(OpKind kind, TensorView in = {}, TensorView out = {}, ReduceOp op = ReduceOp::kSum) {
  OpDesc d;
  d.kind = kind;
  d.input = in;
  d.output = out;
  d.reduce = op;
  return d;
}

// The conformance suite (tests/backend_conformance.h) with the small slot: 0 and 1 element, odd
// sizes, and sizes past the 32 KiB step (chunked, pipelined through both halves, uneven slices).
testing::RankBackendFactory ShmRanks() {
  return [](int rank, int world, std::shared_ptr<Store> store) {
    return Create(SmallOptions(rank, world, std::move(store)));
  };
}

ConformanceTarget ShmTarget(std::string name, RankMode mode, int world) {
  return ConformanceTarget{.name = std::move(name),
                           .world = world,
                           .mode = mode,
                           .prepare = ShmRanks,
                           .counts = {0, 1, 7, 1031, 40013},
                           .large_bytes = 0};
}

INSTANTIATE_TEST_SUITE_P(Shm, BackendConformanceTest,
                         ::testing::Values(ShmTarget("threads2", RankMode::kThreads, 2),
                                           ShmTarget("threads3", RankMode::kThreads, 3),
                                           ShmTarget("processes2", RankMode::kProcesses, 2),
                                           ShmTarget("processes4", RankMode::kProcesses, 4)),
                         testing::ConformanceTargetName);

// OpDesc::wire: f32 data sent as bf16/f16 through the slots. Every element must carry the bits of
// precision.h's accumulate_fp32 semantics, computed here with the scalar reference casts.
float WireInput(int rank, size_t i) {
  if (i % 1000 == 7 && rank == 0) return std::nanf("");
  if (i % 1000 == 11) return 70000.0f;  // past fp16's range: overflows the f16 wire only
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 101) - 50) * 0.37f +
         static_cast<float>(rank) * 1e-3f;
}

uint32_t Bits(float f) { return absl::bit_cast<uint32_t>(f); }
float FromBits(uint32_t u) { return absl::bit_cast<float>(u); }

void WireMatrix(int rank, int world, const std::string& dir) {
  namespace p = precision;
  std::unique_ptr<Backend> b = Create(SmallOptions(rank, world, FileStore(dir)));
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->capabilities().wire_cast);
  for (DType wire : {DType::kBF16, DType::kF16}) {
    const bool bf16 = wire == DType::kBF16;
    auto round = [&](float f) {
      return bf16 ? p::F32BitsToBF16(Bits(f)) : p::F32BitsToF16(Bits(f));
    };
    auto widen = [&](uint16_t h) {
      return FromBits(bf16 ? p::BF16ToF32Bits(h) : p::F16ToF32Bits(h));
    };
    // 4099 and 20000 elements span several 8 KiB chunks of the small options.
    for (size_t n : {size_t{1}, size_t{37}, size_t{4099}, size_t{20000}}) {
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = WireInput(rank, i);
      OpDesc d = Op(OpKind::kAllreduce, HostView(x.data(), n), HostView(x.data(), n));
      d.wire = wire;
      d.wire_scale = 0.5f;
      WireStats stats;
      d.wire_stats = &stats;
      ASSERT_TRUE(b->Run(d).ok()) << DTypeName(wire) << " n=" << n;
      size_t overflow = 0, nonfinite_in = 0, result_nonfinite = 0, mismatches = 0;
      for (size_t i = 0; i < n; ++i) {
        const float mine = WireInput(rank, i);
        nonfinite_in += !std::isfinite(mine);
        overflow += std::isfinite(mine) && !std::isfinite(widen(round(mine)));
        float acc = widen(round(WireInput(0, i)));
        for (int r = 1; r < world; ++r) acc += widen(round(WireInput(r, i)));
        const uint16_t sum = round(acc);
        result_nonfinite += !std::isfinite(widen(sum));
        const float want = widen(sum) * 0.5f;
        const bool same = std::isnan(want) ? std::isnan(x[i]) : Bits(x[i]) == Bits(want);
        if (!same && mismatches++ < 5) {
          ADD_FAILURE() << DTypeName(wire) << " n=" << n << " element " << i << ": got " << x[i]
                        << ", want " << want;
        }
      }
      EXPECT_EQ(mismatches, 0u);
      EXPECT_EQ(stats.cast_overflow, overflow) << DTypeName(wire) << " n=" << n;
      EXPECT_EQ(stats.nonfinite_inputs, nonfinite_in) << DTypeName(wire) << " n=" << n;
      EXPECT_EQ(stats.result_nonfinite, result_nonfinite) << DTypeName(wire) << " n=" << n;
    }
  }
  EXPECT_TRUE(b->health().ok());
}

TEST(ShmBackend, WireCastAllreduceMatchesTheFp32AccumulatingReferenceBitForBit) {
  RunShm(RankMode::kThreads, 2, WireMatrix);
  RunShm(RankMode::kThreads, 3, WireMatrix);
  RunShm(RankMode::kProcesses, 4, WireMatrix);
}

TEST(ShmBackend, WireCastOfAnythingButAnF32SumAllreduceIsRefused) {
  RunShm(RankMode::kThreads, 2, [](int rank, int world, const std::string& dir) {
    std::unique_ptr<Backend> b = Create(SmallOptions(rank, world, FileStore(dir)));
    ASSERT_NE(b, nullptr);
    std::vector<float> f(8);
    std::vector<double> g(8);
    OpDesc max =
        Op(OpKind::kAllreduce, HostView(f.data(), 8), HostView(f.data(), 8), ReduceOp::kMax);
    max.wire = DType::kBF16;
    OpDesc f64 = Op(OpKind::kAllreduce, HostView(g.data(), 8), HostView(g.data(), 8));
    f64.wire = DType::kBF16;
    OpDesc i8 = Op(OpKind::kAllreduce, HostView(f.data(), 8), HostView(f.data(), 8));
    i8.wire = DType::kI8;
    for (const OpDesc* d : {&max, &f64, &i8}) {
      const absl::Status s = b->Run(*d);
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("wire-cast op must be an f32 sum allreduce"));
    }
    EXPECT_TRUE(b->health().ok());
  });
}

// What online tuning compares its candidates with (Backend::StaticKnobs): the values an op runs
// with when it sets none, a tuned band's where one holds the size, clamped as the backend clamps
// them (a step is at most half a slot).
TEST(ShmBackend, StaticKnobsAreWhatAnOpWithoutKnobsRunsWith) {
  RunShm(RankMode::kThreads, 2, [](int rank, int world, const std::string& dir) {
    ShmBackendOptions o = SmallOptions(rank, world, FileStore(dir));  // flat 1 KiB, chunk 8 KiB
    o.tuned_allreduce.chunk_bytes = {{16 << 10, 1 << 20, 16 << 10}, {1 << 20, 2 << 20, 1 << 20}};
    o.tuned_reduce.flat_max_bytes = {{0, 4 << 10, 4 << 10}};
    std::unique_ptr<Backend> b = Create(o);
    ASSERT_NE(b, nullptr);
    using Knobs = std::vector<std::pair<std::string, int64_t>>;
    EXPECT_EQ(b->StaticKnobs(OpKind::kAllreduce, 512),
              (Knobs{{"flat_max_bytes", 1024}, {"chunk_bytes", 8192}}));
    EXPECT_EQ(b->StaticKnobs(OpKind::kAllreduce, 64 << 10),
              (Knobs{{"flat_max_bytes", 1024}, {"chunk_bytes", 16384}}));
    // A tuned 1 MiB chunk is cut to half the 64 KiB slot.
    EXPECT_EQ(b->StaticKnobs(OpKind::kAllreduce, 2 << 20),
              (Knobs{{"flat_max_bytes", 1024}, {"chunk_bytes", 32768}}));
    EXPECT_EQ(b->StaticKnobs(OpKind::kReduce, 2048),
              (Knobs{{"flat_max_bytes", 4096}, {"chunk_bytes", 8192}}));
    EXPECT_TRUE(b->StaticKnobs(OpKind::kBroadcast, 2048).empty());
    EXPECT_TRUE(b->StaticKnobs(OpKind::kAllgather, 2048).empty());
  });
}

// Tuning reads the largest step from the knob registry (KnobBehaviour, `adaptcomm tune`'s and
// online tuning's candidates), which cannot see ShmBackendOptions: it must be half the default
// slot.
TEST(ShmBackend, KnobRegistryLargestStepIsHalfTheDefaultSlot) {
  const uint64_t half = ShmBackendOptions{}.slot_bytes / 2;
  for (const char* knob : {"flat_max_bytes", "chunk_bytes"}) {
    const config::TunedKnobSpec* spec = config::FindTunedKnob("shm", knob);
    ASSERT_NE(spec, nullptr) << knob;
    EXPECT_EQ(static_cast<uint64_t>(spec->max), half) << knob;
  }
}

std::set<std::string> DevShm() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

// Rank `victim` dies (SIGKILL) before the allreduce the others are in: they fail with
// Unavailable naming it within a couple of seconds, not at the 30 s timeout.
TEST(ShmBackend, KilledPeerFailsSurvivorsFastAndLeaksNothing) {
  const std::set<std::string> before = DevShm();
  const std::string dir = TempDir();
  constexpr int kVictim = 2;
  std::vector<int> status = testing::RunRankProcesses(
      3,
      [&](const testing::RankEnv& env) {
        std::unique_ptr<Backend> b = Create(SmallOptions(env.rank, 3, FileStore(dir)));
        ASSERT_NE(b, nullptr);
        std::vector<float> x(100000, 1.0f);
        OpDesc d =
            Op(OpKind::kAllreduce, HostView(x.data(), x.size()), HostView(x.data(), x.size()));
        d.seq = 1;
        d.timeout = absl::Seconds(30);
        ASSERT_TRUE(b->Run(d).ok());
        if (env.rank == kVictim) raise(SIGKILL);
        d.seq = 2;
        const absl::Time start = absl::Now();
        const absl::Status s = b->Run(d);
        const absl::Duration took = absl::Now() - start;
        EXPECT_TRUE(absl::IsUnavailable(s)) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 (pid "));
        EXPECT_THAT(std::string(s.message()), HasSubstr("exited"));
        EXPECT_THAT(std::string(s.message()), HasSubstr("allreduce #2"));
        EXPECT_LT(took, absl::Seconds(2));
        EXPECT_FALSE(b->health().ok());
        EXPECT_FALSE(b->Run(d).ok());
      },
      absl::Seconds(60));
  for (int r = 0; r < 3; ++r) {
    if (r == kVictim) {
      EXPECT_TRUE(WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL) << status[r];
    } else {
      EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
    }
  }
  EXPECT_EQ(DevShm(), before);
}

// A stopped rank (SIGSTOP) is not dead: its peers wait out the op's timeout, then fail with
// DeadlineExceeded saying it is stopped.
TEST(ShmBackend, StoppedPeerIsNamedAtTheTimeout) {
  const std::string dir = TempDir();
  std::vector<int> status = testing::RunRankProcesses(
      2,
      [&](const testing::RankEnv& env) {
        std::shared_ptr<Store> store = FileStore(dir);
        std::unique_ptr<Backend> b = Create(SmallOptions(env.rank, 2, store));
        ASSERT_NE(b, nullptr);
        if (env.rank == 1) {
          ASSERT_TRUE(store->Set("victim", absl::StrCat(getpid())).ok());
          raise(SIGSTOP);
          _exit(3);  // never resumed: killed by rank 0
        }
        absl::StatusOr<std::string> victim = store->Get("victim", absl::Seconds(20));
        ASSERT_TRUE(victim.ok()) << victim.status();
        absl::SleepFor(absl::Milliseconds(100));  // let it stop
        std::vector<float> x(10, 1.0f);
        OpDesc d =
            Op(OpKind::kAllreduce, HostView(x.data(), x.size()), HostView(x.data(), x.size()));
        d.seq = 1;
        d.timeout = absl::Seconds(1);
        const absl::Time start = absl::Now();
        const absl::Status s = b->Run(d);
        const absl::Duration took = absl::Now() - start;
        int pid = 0;
        ASSERT_TRUE(absl::SimpleAtoi(*victim, &pid));
        kill(pid, SIGKILL);
        EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
        EXPECT_THAT(std::string(s.message()),
                    HasSubstr(absl::StrCat("peer rank 1 (pid ", pid, ", stopped)")));
        EXPECT_GE(took, absl::Milliseconds(990));
        EXPECT_LT(took, absl::Seconds(3));
      },
      absl::Seconds(60));
  EXPECT_TRUE(WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 0);
  EXPECT_TRUE(WIFSIGNALED(status[1])) << status[1];
}

// Abort() from another thread wakes a rank blocked in an op within 100 ms; its peer's next op
// then fails at once with the reason instead of waiting for its timeout.
TEST(ShmBackend, AbortWakesAWaiterPromptlyAndBreaksThePeers) {
  std::shared_ptr<Store> store = CreateHashStore();
  std::unique_ptr<Backend> b0, b1;
  std::thread t([&] { b1 = Create(SmallOptions(1, 2, store)); });
  b0 = Create(SmallOptions(0, 2, store));
  t.join();
  ASSERT_NE(b0, nullptr);
  ASSERT_NE(b1, nullptr);
  std::vector<float> x(10, 1.0f);
  OpDesc d = Op(OpKind::kAllreduce, HostView(x.data(), 10), HostView(x.data(), 10));
  d.seq = 1;
  d.timeout = absl::Seconds(30);
  std::atomic<int64_t> returned_ns{0};
  absl::Status s0;
  std::thread waiter([&] {
    s0 = b0->Run(d);
    returned_ns = absl::ToUnixNanos(absl::Now());
  });
  absl::SleepFor(absl::Milliseconds(300));  // well into the futex sleep
  const absl::Time aborted = absl::Now();
  b0->Abort(absl::CancelledError("test abort"));
  waiter.join();
  EXPECT_LT(absl::FromUnixNanos(returned_ns) - aborted, absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsAborted(s0)) << s0;
  EXPECT_THAT(std::string(s0.message()), HasSubstr("test abort"));
  const absl::Time start = absl::Now();
  const absl::Status s1 = b1->Run(d);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnavailable(s1)) << s1;
  EXPECT_THAT(std::string(s1.message()), HasSubstr("peer rank 0 failed"));
  EXPECT_THAT(std::string(s1.message()), HasSubstr("test abort"));
}

// Through the communicator: the shm backend sees the killed rank within its liveness interval
// and its error (naming the dead rank and its pid) is retryable like Gloo's, so the coordinated
// retry runs; that retry waits for the dead rank's vote up to the op timeout (lib/core), and the
// flight records name the dead rank.
TEST(ShmCommunicator, KilledRankFailsSurvivorsFastWithARetryableErrorAndAVerdict) {
  const std::string dir = TempDir();
  constexpr int kVictim = 2;
  constexpr absl::Duration kTimeout = absl::Seconds(4);
  std::vector<int> status = testing::RunRankProcesses(
      3,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.backend = BackendChoice::kShm;
        o.fallback = Fallback::kDeny;
        o.timeout = kTimeout;
        o.failure_report_window = absl::Seconds(1);
        o.flight_recorder_dir = dir;
        auto comm = Communicator::Create(o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        ASSERT_EQ(std::string((*comm)->backend_name()), "shm");
        std::vector<float> grad(64 << 10);
        for (int step = 0; step < 1000; ++step) {
          if (env.rank == kVictim && step == 20) raise(SIGKILL);
          const absl::Time start = absl::Now();
          absl::Status s = (*comm)->Allreduce(HostView(grad.data(), grad.size())).Wait();
          if (!s.ok()) {
            EXPECT_TRUE(IsRetryable(s)) << s;
            EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 2 did not vote"));
            EXPECT_THAT(std::string(s.message()), HasSubstr("peer rank 2 (pid "));
            EXPECT_THAT(std::string(s.message()), HasSubstr(") exited; waited "));
            EXPECT_LT(absl::Now() - start, kTimeout + absl::Seconds(4)) << s;
            return;
          }
        }
        ADD_FAILURE() << "rank " << env.rank << " never saw the failure";
      },
      absl::Seconds(60));
  for (int r = 0; r < 3; ++r) {
    if (r != kVictim) {
      EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
    }
  }
  absl::StatusOr<trace::CulpritReport> report = trace::AnalyzeFlightDumps(dir);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->missing, std::vector<int>{kVictim}) << report->ToText();
}

TEST(ShmBackend, LayoutVersionSkewIsRefusedOnEveryRankByName) {
  std::shared_ptr<Store> store = CreateHashStore();
  absl::Status s[2];
  std::thread t([&] {
    ShmBackendOptions o = SmallOptions(1, 2, store);
    o.layout_version_for_testing = 99;
    s[1] = CreateShmBackend(o).status();
  });
  s[0] = CreateShmBackend(SmallOptions(0, 2, store)).status();
  t.join();
  for (const absl::Status& st : s) {
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("layout version 1, rank 1 has version 99"));
  }
}

TEST(ShmBackend, SegmentPastTheLimitNamesSizeAndLimit) {
  std::shared_ptr<Store> store = CreateHashStore();
  absl::Status s[2];
  auto create = [&](int r) {
    ShmBackendOptions o = SmallOptions(r, 2, store);
    o.slot_bytes = 8 << 20;
    o.max_segment_bytes = 4 << 20;
    s[r] = CreateShmBackend(o).status();
  };
  std::thread t(create, 1);
  create(0);
  t.join();
  for (const absl::Status& st : s) {
    EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("over the limit of 4 MiB"));
  }
  EXPECT_THAT(std::string(s[0].message()), HasSubstr("needs 16.1 MiB ("));
}

// Selection: backend=shm and auto (no NCCL here) both pick shm for ranks of one host, and say so.
TEST(ShmSelection, ShmAndAutoPickShmOnOneHost) {
  for (BackendChoice choice : {BackendChoice::kShm, BackendChoice::kAuto}) {
    testing::RunRanks(RankMode::kThreads, 2, [choice](const testing::RankEnv& env) {
      CommunicatorOptions o = env.options;
      o.backend = choice;
      auto comm = Communicator::Create(o);
      ASSERT_TRUE(comm.ok()) << comm.status();
      EXPECT_EQ(std::string((*comm)->backend_name()), "shm");
      EXPECT_THAT((*comm)->selection_reason(), HasSubstr("shm: all 2 ranks on "));
      std::vector<float> x = {1.0f + env.rank, 5.0f};
      ASSERT_TRUE((*comm)->Allreduce(HostView(x.data(), 2)).Wait().ok());
      EXPECT_EQ(x[0], 3.0f);
      EXPECT_EQ(x[1], 10.0f);
    });
  }
}

}  // namespace
}  // namespace adaptcomm

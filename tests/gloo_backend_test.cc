// The Gloo backend, driven directly (no Communicator): ranks are threads sharing a HashStore. The
// values of every op come from the conformance suite (tests/backend_conformance.h); here what is
// Gloo's own: its knobs, half conversions, refusals, creation, timeouts and aborts.
#include "lib/gloo/gloo_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/store.h"
#include "lib/gloo/gloo_reduce.h"
#include "tests/backend_conformance.h"

namespace adaptcomm {
namespace {

namespace gb = gloo_backend;
using Backends = std::vector<std::unique_ptr<Backend>>;

constexpr absl::Duration kOpTimeout = absl::Seconds(20);

GlooBackendOptions Options(int rank, int size, std::shared_ptr<Store> store) {
  GlooBackendOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::move(store);
  o.hostname = "127.0.0.1";
  o.init_timeout = absl::Seconds(20);
  o.default_timeout = kOpTimeout;
  return o;
}

// Runs fn(rank) on `n` threads and joins them (every op inside is bounded by its timeout).
void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

Backends Connect(int n, const std::string& prefix) {
  auto store = CreatePrefixStore(prefix, CreateHashStore());
  Backends backends(n);
  OnRanks(n, [&](int r) {
    auto b = CreateGlooBackend(Options(r, n, store));
    ASSERT_TRUE(b.ok()) << b.status();
    backends[r] = std::move(*b);
  });
  for (const auto& b : backends) {
    if (b == nullptr) ADD_FAILURE() << "a rank failed to connect";
  }
  return backends;
}

// ---- conformance: every op x dtype x reduce op, bad input, refusal once aborted ----

using testing::BackendConformanceTest;
using testing::ConformanceTarget;
using testing::RankMode;

testing::RankBackendFactory GlooRanks() {
  return [](int rank, int world, std::shared_ptr<Store> store) -> std::unique_ptr<Backend> {
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateGlooBackend(Options(rank, world, store));
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : nullptr;
  };
}

INSTANTIATE_TEST_SUITE_P(
    Gloo, BackendConformanceTest,
    ::testing::Values(ConformanceTarget{.name = "threads1", .world = 1, .prepare = GlooRanks},
                      ConformanceTarget{.name = "threads2", .world = 2, .prepare = GlooRanks},
                      ConformanceTarget{.name = "threads4", .world = 4, .prepare = GlooRanks},
                      ConformanceTarget{.name = "processes3",
                                        .world = 3,
                                        .mode = RankMode::kProcesses,
                                        .prepare = GlooRanks}),
    testing::ConformanceTargetName);

// What online tuning compares its candidates with (Backend::StaticKnobs): the profile's algorithm
// and segment cap, or a tuned band's where one holds the size.
TEST(GlooBackendTest, StaticKnobsAreWhatAnAllreduceWithoutKnobsRunsWith) {
  GlooBackendOptions o = Options(0, 1, CreatePrefixStore("static_knobs", CreateHashStore()));
  o.max_segment_bytes = 4 << 20;
  o.tuned_algorithm = {{0, 64 << 10, 1}};
  o.tuned_max_segment_bytes = {{1 << 20, 16 << 20, 1 << 20}};
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateGlooBackend(o);
  ASSERT_TRUE(b.ok()) << b.status();
  using Knobs = std::vector<std::pair<std::string, int64_t>>;
  EXPECT_EQ((*b)->StaticKnobs(OpKind::kAllreduce, 4096),
            (Knobs{{"algorithm", 1}, {"max_segment_bytes", 4 << 20}}));
  EXPECT_EQ((*b)->StaticKnobs(OpKind::kAllreduce, 8 << 20),
            (Knobs{{"algorithm", 0}, {"max_segment_bytes", 1 << 20}}));
  EXPECT_EQ((*b)->StaticKnobs(OpKind::kAllreduce, 64 << 20),
            (Knobs{{"algorithm", 0}, {"max_segment_bytes", 4 << 20}}));
  EXPECT_TRUE((*b)->StaticKnobs(OpKind::kReduce, 4096).empty());
}

// ---- half-precision conversions ----

TEST(GlooReduceTest, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(gb::FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(gb::FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(gb::FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(gb::FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(gb::FloatToHalf(65520.0f), 0x7c00);  // the tie rounds to even: infinity
  EXPECT_EQ(gb::FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(gb::FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(gb::FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(gb::FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even stays
  EXPECT_EQ(gb::FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd rounds up
  EXPECT_TRUE(std::isnan(gb::HalfToFloat(gb::FloatToHalf(NAN))));
  EXPECT_EQ(gb::FloatToBf16(1.0f), 0x3f80);
  float tie_even, tie_odd;
  const uint32_t te = 0x3f808000u, to = 0x3f818000u;
  std::memcpy(&tie_even, &te, 4);
  std::memcpy(&tie_odd, &to, 4);
  EXPECT_EQ(gb::FloatToBf16(tie_even), 0x3f80);
  EXPECT_EQ(gb::FloatToBf16(tie_odd), 0x3f82);
  EXPECT_TRUE(std::isnan(gb::Bf16ToFloat(gb::FloatToBf16(NAN))));
  // Every finite 16-bit pattern survives a round trip through float; NaNs stay NaN.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto x = static_cast<uint16_t>(h);
    const float f = gb::HalfToFloat(x);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(gb::HalfToFloat(gb::FloatToHalf(f)))) << h;
    } else {
      ASSERT_EQ(gb::FloatToHalf(f), x) << h;
    }
    const float g = gb::Bf16ToFloat(x);
    if (std::isnan(g)) {
      EXPECT_TRUE(std::isnan(gb::Bf16ToFloat(gb::FloatToBf16(g)))) << h;
    } else {
      ASSERT_EQ(gb::FloatToBf16(g), x) << h;
    }
  }
}

TEST(GlooReduceTest, IntegerSumsAndProductsWrap) {
  int32_t a[3] = {INT32_MAX, -7, 3}, b[3] = {1, 2, -4}, out[3];
  gb::GetReduceFn(DType::kI32, ReduceOp::kSum)(out, a, b, 3);
  EXPECT_EQ(out[0], INT32_MIN);
  EXPECT_EQ(out[1], -5);
  gb::GetReduceFn(DType::kI32, ReduceOp::kProd)(a, a, b, 3);  // in place
  EXPECT_EQ(a[0], INT32_MAX);
  EXPECT_EQ(a[1], -14);
  EXPECT_EQ(a[2], -12);
  int8_t c[2] = {127, -128}, d[2] = {1, -1};
  gb::GetReduceFn(DType::kI8, ReduceOp::kSum)(c, c, d, 2);
  EXPECT_EQ(c[0], -128);
  EXPECT_EQ(c[1], 127);
  EXPECT_EQ(gb::GetReduceFn(DType::kI64, ReduceOp::kAvg), nullptr);
}

// ---- Supports, creation errors ----

TEST(GlooBackendTest, SupportsRejectsWhatGlooCannotRun) {
  Backends backends = Connect(2, "supports");
  ASSERT_NE(backends[0], nullptr);
  Backend& b = *backends[0];
  EXPECT_STREQ(b.name(), "gloo");
  EXPECT_EQ(b.rank(), 0);
  EXPECT_EQ(b.size(), 2);
  const Capabilities caps = b.capabilities();
  EXPECT_TRUE(caps.host_memory);
  EXPECT_FALSE(caps.device_memory);
  EXPECT_FALSE(caps.native_bf16);
  EXPECT_FALSE(caps.native_avg);
  EXPECT_TRUE(caps.send_recv);
  EXPECT_TRUE(caps.abortable);

  std::vector<int32_t> data(8);
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.input = op.output = HostView(data.data(), data.size());
  op.seq = 1;
  EXPECT_TRUE(b.Supports(op).ok());

  OpDesc avg = op;
  avg.reduce = ReduceOp::kAvg;
  absl::Status s = b.Supports(avg);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("i32"), absl::string_view::npos) << s;
  // Run refuses it the same way, and an InvalidArgument does not break the backend.
  EXPECT_TRUE(absl::IsInvalidArgument(b.Run(avg)));
  EXPECT_TRUE(b.health().ok());

  OpDesc cuda = op;
  cuda.output.device = Device::Cuda(1);
  s = b.Supports(cuda);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("needs host memory"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("cuda:1"), absl::string_view::npos) << s;

  OpDesc huge = op;
  huge.output.count = size_t{1} << 31;  // never dereferenced: refused before any access
  huge.input = huge.output;
  s = b.Supports(huge);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;

  OpDesc self_send;
  self_send.kind = OpKind::kSend;
  self_send.input = HostView(data.data(), data.size());
  self_send.peer = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(b.Supports(self_send)));

  OpDesc uneven;
  uneven.kind = OpKind::kAlltoall;
  uneven.input = uneven.output = HostView(data.data(), 7);
  EXPECT_TRUE(absl::IsInvalidArgument(b.Supports(uneven)));
  EXPECT_TRUE(b.health().ok());
}

TEST(GlooBackendTest, CreateRejectsBadOptions) {
  auto store = CreateHashStore();
  GlooBackendOptions o = Options(0, 2, store);
  o.hostname.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(CreateGlooBackend(o).status()));
  o = Options(2, 2, store);
  EXPECT_TRUE(absl::IsInvalidArgument(CreateGlooBackend(o).status()));
  o = Options(0, 2, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(CreateGlooBackend(o).status()));
}

TEST(GlooBackendTest, RendezvousTimeoutNamesTheMissingRank) {
  GlooBackendOptions o = Options(0, 3, CreatePrefixStore("missing", CreateHashStore()));
  o.init_timeout = absl::Seconds(1);
  // Rank 1 publishes its address, rank 2 never shows up.
  absl::StatusOr<std::unique_ptr<Backend>> r0, r1;
  const absl::Time start = absl::Now();
  OnRanks(2, [&](int r) {
    GlooBackendOptions mine = o;
    mine.rank = r;
    (r == 0 ? r0 : r1) = CreateGlooBackend(mine);
  });
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(r0.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(r0.status())) << r0.status();
  EXPECT_NE(r0.status().message().find("rank 2"), absl::string_view::npos) << r0.status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(r1.status())) << r1.status();
  EXPECT_LT(took, absl::Seconds(4));
}

// ---- timeouts and abort ----

OpDesc Allreduce(std::vector<float>& data, uint64_t seq, absl::Duration timeout) {
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.input = op.output = HostView(data.data(), data.size());
  op.seq = seq;
  op.timeout = timeout;
  return op;
}

// One rank runs `op` while its peer never joins: DeadlineExceeded within timeout + 2 s, the
// backend broken after, later ops refused fast; the peer notices the dead connection promptly.
void ExpectTimesOut(const std::string& prefix,
                    const std::function<OpDesc(std::vector<float>&)>& make) {
  Backends backends = Connect(2, prefix);
  ASSERT_NE(backends[0], nullptr);
  ASSERT_NE(backends[1], nullptr);
  std::vector<float> data(1000, 1.0f);
  OpDesc op = make(data);
  const absl::Time start = absl::Now();
  absl::Status s = backends[0]->Run(op);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_GE(took, op.timeout - absl::Milliseconds(50));
  EXPECT_LT(took, op.timeout + absl::Seconds(2));
  EXPECT_NE(s.message().find(OpKindName(op.kind)), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("seq 7"), absl::string_view::npos) << s;
  EXPECT_TRUE(absl::IsDeadlineExceeded(backends[0]->health())) << backends[0]->health();

  OpDesc again = Allreduce(data, 8, absl::Seconds(5));
  const absl::Time refused_at = absl::Now();
  s = backends[0]->Run(again);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_LT(absl::Now() - refused_at, absl::Milliseconds(100));
  // A later Abort (as a communicator does after a timeout) keeps the original cause.
  backends[0]->Abort(absl::CancelledError("cleanup"));
  EXPECT_TRUE(absl::IsDeadlineExceeded(backends[0]->health())) << backends[0]->health();

  // The timed-out rank closed its connections: the peer fails instead of waiting 5 s.
  const absl::Time peer_start = absl::Now();
  s = backends[1]->Run(Allreduce(data, 8, absl::Seconds(5)));
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - peer_start, absl::Seconds(2)) << s;
  EXPECT_FALSE(backends[1]->health().ok());
}

TEST(GlooBackendTest, AllreduceTimeoutIsDeadlineExceededAndBreaks) {
  ExpectTimesOut("timeout-allreduce",
                 [](std::vector<float>& d) { return Allreduce(d, 7, absl::Seconds(1)); });
}

TEST(GlooBackendTest, ReduceScatterTimeoutIsDeadlineExceeded) {
  ExpectTimesOut("timeout-rs", [](std::vector<float>& d) {
    OpDesc op;
    op.kind = OpKind::kReduceScatter;
    op.input = HostView(d.data(), d.size());
    op.output = HostView(d.data(), d.size() / 2);
    op.seq = 7;
    op.timeout = absl::Milliseconds(700);
    return op;
  });
}

TEST(GlooBackendTest, RecvTimeoutIsDeadlineExceeded) {
  ExpectTimesOut("timeout-recv", [](std::vector<float>& d) {
    OpDesc op;
    op.kind = OpKind::kRecv;
    op.output = HostView(d.data(), d.size());
    op.peer = 1;
    op.seq = 7;
    op.timeout = absl::Milliseconds(700);
    return op;
  });
}

// Abort() from another thread ends a blocked op promptly with Aborted.
void ExpectAbortInterrupts(const std::string& prefix, OpKind kind) {
  Backends backends = Connect(2, prefix);
  ASSERT_NE(backends[0], nullptr);
  ASSERT_NE(backends[1], nullptr);
  std::vector<float> data(1000, 1.0f);
  OpDesc op = Allreduce(data, 1, absl::Seconds(30));
  if (kind == OpKind::kRecv) {
    op.kind = OpKind::kRecv;
    op.peer = 1;
  }
  absl::Status result;
  absl::Time returned_at;
  std::thread runner([&] {
    result = backends[0]->Run(op);
    returned_at = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));  // let it block
  const absl::Time abort_at = absl::Now();
  backends[0]->Abort(absl::CancelledError("test abort"));
  runner.join();
  EXPECT_TRUE(absl::IsAborted(result)) << result;
  EXPECT_NE(result.message().find("test abort"), absl::string_view::npos) << result;
  EXPECT_LT(returned_at - abort_at, absl::Seconds(2));
  EXPECT_TRUE(absl::IsAborted(backends[0]->health())) << backends[0]->health();
  EXPECT_TRUE(absl::IsFailedPrecondition(backends[0]->Run(Allreduce(data, 2, absl::Seconds(5)))));
  backends[0]->Abort(absl::CancelledError("again"));  // idempotent
  EXPECT_TRUE(absl::IsAborted(backends[0]->health()));

  // The peer sees the closed connections instead of waiting out its timeout.
  const absl::Time peer_start = absl::Now();
  absl::Status s = backends[1]->Run(Allreduce(data, 1, absl::Seconds(5)));
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - peer_start, absl::Seconds(2)) << s;
}

TEST(GlooBackendTest, AbortInterruptsBlockedAllreduce) {
  ExpectAbortInterrupts("abort-allreduce", OpKind::kAllreduce);
}

TEST(GlooBackendTest, AbortInterruptsBlockedRecv) {
  ExpectAbortInterrupts("abort-recv", OpKind::kRecv);
}

// Abort() landing while an op is starting (after Run's health check, while Gloo registers the
// op's buffers) must still end it promptly: a signal that reached the pairs before the buffers
// existed used to leave the op waiting out its timeout. Every op kind that receives, at delays
// from 0 to ~300 us after the op began.
TEST(GlooBackendTest, AbortRacingTheStartOfAnOpEndsItPromptly) {
  constexpr absl::Duration kTimeout = absl::Seconds(8);
  std::mt19937 rng(11);
  for (int round = 0; round < 24; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    Backends backends = Connect(2, absl::StrCat("abort-race-", round));
    ASSERT_NE(backends[0], nullptr);
    ASSERT_NE(backends[1], nullptr);
    std::vector<float> data(1000, 1.0f);
    OpDesc op = Allreduce(data, 1, kTimeout);
    const OpKind kinds[] = {OpKind::kAllreduce, OpKind::kBroadcast, OpKind::kReduce, OpKind::kRecv};
    op.kind = kinds[round % 4];
    op.root = 1;  // the peer, which never joins
    op.peer = 1;
    std::atomic<bool> started{false};
    absl::Time returned_at;
    absl::Status result;
    std::thread runner([&] {
      started = true;
      result = backends[0]->Run(op);
      returned_at = absl::Now();
    });
    while (!started) std::this_thread::yield();
    absl::SleepFor(absl::Microseconds(static_cast<int>(rng() % 300)));
    const absl::Time abort_at = absl::Now();
    backends[0]->Abort(absl::CancelledError("racing abort"));
    runner.join();
    EXPECT_FALSE(result.ok());
    EXPECT_LT(returned_at - abort_at, absl::Seconds(2)) << OpKindName(op.kind) << ": " << result;
  }
}

TEST(GlooBackendTest, AbortBeforeAnyOpFailsFast) {
  Backends backends = Connect(2, "abort-idle");
  ASSERT_NE(backends[0], nullptr);
  backends[0]->Abort(absl::UnavailableError("peer lost"));
  std::vector<float> data(4, 1.0f);
  absl::Status s = backends[0]->Run(Allreduce(data, 1, absl::Seconds(5)));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("peer lost"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace adaptcomm

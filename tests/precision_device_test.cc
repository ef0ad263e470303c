// The device (CUDA view) path of the mixed-precision collectives, on the fake CUDA/NCCL seam
// (tests/fake_nccl_api.h: casts are deferred on their stream until something forces it, so a
// collective that does not wait for the cast reads a stale wire buffer). Ranks are threads; each
// rank's communicator is built with its own fake as its CUDA runtime
// (internal::CreateCommunicatorWithBackend), which the device path takes from the communicator.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "adaptcomm/communicator.h"
#include "adaptcomm/precision.h"
#include "adaptcomm/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/cast_kernels.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/nccl/nccl_backend.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using testing::FakeCall;
using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;

struct DeviceWorld {
  std::vector<std::shared_ptr<FakeNcclApi>> apis;
  std::vector<std::unique_ptr<Communicator>> comms;
};

// `n` NCCL communicators over fakes of one world (init is collective: concurrent).
DeviceWorld MakeDeviceWorld(int n, const FakeNcclFaults& faults = {}) {
  DeviceWorld w;
  auto world = testing::MakeFakeNcclWorld();
  auto store = CreateHashStore();
  std::vector<std::unique_ptr<Backend>> backends(n);
  for (int i = 0; i < n; ++i) w.apis.push_back(std::make_shared<FakeNcclApi>(world, faults));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      nccl::NcclBackendOptions o;
      o.rank = i;
      o.size = n;
      o.store = store;
      o.init_timeout = absl::Seconds(10);
      o.abort_timeout = absl::Milliseconds(500);
      auto b = nccl::CreateNcclBackend(w.apis[i], w.apis[i], o);
      EXPECT_TRUE(b.ok()) << b.status();
      if (b.ok()) backends[i] = std::move(*b);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    if (backends[i] == nullptr) return DeviceWorld{};
    CommunicatorOptions o;
    o.timeout = absl::Seconds(10);
    o.max_retry_attempts = 1;  // no replay copies: Malloc counts are the mixed path's
    internal::CommunicatorDeps deps;
    deps.use_given_apis = true;
    deps.cuda = w.apis[i];
    auto comm = internal::CreateCommunicatorWithBackend(std::move(backends[i]), o, deps);
    EXPECT_TRUE(comm.ok()) << comm.status();
    if (!comm.ok()) return DeviceWorld{};
    w.comms.push_back(std::move(*comm));
  }
  return w;
}

// Runs body(rank, comm, fake) on every rank as a thread.
void OnRanks(DeviceWorld& w, const std::function<void(int, Communicator&, FakeNcclApi&)>& body) {
  ASSERT_FALSE(w.comms.empty());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < w.comms.size(); ++r) {
    threads.emplace_back([&, r] { body(static_cast<int>(r), *w.comms[r], *w.apis[r]); });
  }
  for (auto& t : threads) t.join();
}

// The caller's ("compute") stream of rank r: any handle the fake has not handed out.
void* CallerStream(int r) { return reinterpret_cast<void*>(uintptr_t{0xc0de00} + r); }

TensorView DevView(float* p, size_t n, int r) {
  return TensorView{p, n, DType::kF32, Device::Cuda(0), CallerStream(r)};
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float Float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Multiples of 2^-10 in [-8, 8], none zero: every sum of up to 4 wire-rounded values is exact in
// fp32 (and fp64), so the device path (NCCL's reduction) and the host path (fp32 accumulation)
// round the same exact sum once: identical bits.
std::vector<float> ExactData(int rank, size_t n) {
  std::mt19937 rng(77 + rank);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    int k = static_cast<int>(rng() % 16384) - 8192;
    if (k == 0) k = 1;
    v[i] = std::ldexp(static_cast<float>(k), -10);
  }
  return v;
}

uint16_t Narrow(DType wire, float x) {
  return wire == DType::kF16 ? precision::F32BitsToF16(Bits(x)) : precision::F32BitsToBF16(Bits(x));
}
float Widen(DType wire, uint16_t h) {
  return Float(wire == DType::kF16 ? precision::F16ToF32Bits(h) : precision::BF16ToF32Bits(h));
}

// What cast -> wire sum (rounded once) -> cast back with `factor` gives for element i.
float Model(const std::vector<std::vector<float>>& in, size_t i, DType wire, float factor) {
  double sum = 0;
  for (const auto& x : in) sum += Widen(wire, Narrow(wire, x[i]));
  const float w = Widen(wire, Narrow(wire, static_cast<float>(sum)));
  return factor == 1.0f ? w : w * factor;
}

// ---- the result ----

struct WorldWire {
  int world;
  DType wire;
};

class DeviceMixedVsHost : public ::testing::TestWithParam<WorldWire> {};

TEST_P(DeviceMixedVsHost, AllreduceBitIdenticalToHostPath) {
  const auto [world, wire] = GetParam();
  constexpr size_t kN = 1027;  // not a multiple of 4: the kernels' scalar tail too
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(ExactData(r, kN));
  struct OpCase {
    ReduceOp op;
    float scale;
  };
  const std::vector<OpCase> ops = {{ReduceOp::kSum, 1.0f}, {ReduceOp::kAvg, 0.5f}};

  // The host path on Gloo.
  std::vector<std::vector<std::vector<float>>> host(ops.size(),
                                                    std::vector<std::vector<float>>(world));
  testing::RunRanks(testing::RankMode::kThreads, world, [&](const testing::RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.backend = BackendChoice::kGloo;
    o.timeout = absl::Seconds(30);
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    MixedPrecisionContext ctx(**comm);
    for (size_t k = 0; k < ops.size(); ++k) {
      std::vector<float> x = inputs[env.rank];
      MixedOptions mo{.wire = wire, .op = ops[k].op, .scale = ops[k].scale, .context = &ctx};
      auto st = AllreduceMixed(**comm, HostView(x.data(), x.size()), mo);
      ASSERT_TRUE(st.ok()) << st.status();
      host[k][env.rank] = x;
    }
  });

  // The device path on the fake, at every barrier level.
  DeviceWorld w = MakeDeviceWorld(world);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi&) {
    MixedPrecisionContext ctx(comm);
    for (BarrierLevel level : {BarrierLevel::kStream, BarrierLevel::kHost, BarrierLevel::kGlobal}) {
      for (size_t k = 0; k < ops.size(); ++k) {
        std::vector<float> x = inputs[r];
        MixedOptions mo{.wire = wire,
                        .op = ops[k].op,
                        .scale = ops[k].scale,
                        .barrier = level,
                        .context = &ctx};
        auto st = AllreduceMixed(comm, DevView(x.data(), x.size(), r), mo);
        ASSERT_TRUE(st.ok()) << st.status();
        EXPECT_EQ(st->wire_used, wire);
        EXPECT_EQ(st->cast_overflow, 0u);
        EXPECT_EQ(st->nonfinite_inputs, 0u);
        EXPECT_EQ(st->result_nonfinite, 0u);
        const float factor = ops[k].op == ReduceOp::kAvg ? ops[k].scale / world : ops[k].scale;
        int differ = 0;
        for (size_t i = 0; i < kN; ++i) {
          differ += Bits(x[i]) != Bits(host[k][r][i]);
          if (differ == 1 && Bits(x[i]) != Bits(host[k][r][i])) {
            ADD_FAILURE() << "rank " << r << " " << BarrierLevelName(level) << " "
                          << ReduceOpName(ops[k].op) << " [" << i << "]: device " << x[i]
                          << " host " << host[k][r][i];
          }
          ASSERT_EQ(Bits(x[i]), Bits(Model(inputs, i, wire, factor))) << i;
        }
        EXPECT_EQ(differ, 0) << BarrierLevelName(level) << " " << ReduceOpName(ops[k].op);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceMixedVsHost,
                         ::testing::Values(WorldWire{2, DType::kBF16}, WorldWire{2, DType::kF16},
                                           WorldWire{4, DType::kBF16}, WorldWire{4, DType::kF16}),
                         [](const auto& info) {
                           return absl::StrCat("n", info.param.world, "_",
                                               DTypeName(info.param.wire));
                         });

// Random data over several binades, NaN and Inf included: the fake runs lib/precision's CPU
// kernels, so the device path must give exactly the cast -> sum -> round -> cast back model.
TEST(DeviceMixed, NonfiniteInputsPropagateAndAreCounted) {
  constexpr int kWorld = 2;
  constexpr size_t kN = 301;
  std::vector<std::vector<float>> inputs(kWorld);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < kN; ++i) inputs[r].push_back(std::ldexp(u(rng), (int)(rng() % 20) - 10));
  }
  inputs[0][7] = std::numeric_limits<float>::quiet_NaN();
  inputs[1][8] = std::numeric_limits<float>::infinity();
  DeviceWorld w = MakeDeviceWorld(kWorld);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi&) {
    std::vector<float> x = inputs[r];
    MixedOptions mo{.wire = DType::kBF16, .barrier = BarrierLevel::kStream};
    auto st = AllreduceMixed(comm, DevView(x.data(), kN, r), mo);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->nonfinite_inputs, 1u);
    EXPECT_EQ(st->result_nonfinite, 2u);  // the NaN and the Inf, on every rank
    EXPECT_TRUE(std::isnan(x[7]));
    EXPECT_EQ(x[8], std::numeric_limits<float>::infinity());
    for (size_t i = 0; i < kN; ++i) {
      if (i == 7 || i == 8) continue;
      ASSERT_EQ(Bits(x[i]), Bits(Model(inputs, i, DType::kBF16, 1.0f))) << i;
    }
  });
}

// ---- ordering ----

// The article's race on a GPU: the collective on the communication stream must not read the wire
// buffer before the cast on the caller's stream wrote it. With the stream barrier the result is
// the reduction; with the wait skipped (test knob) the fake's collective reads the stale buffer,
// and every element comes out wrong - the barrier is what makes it right.
TEST(DeviceMixed, StreamBarrierOrdersCastBeforeCollective) {
  constexpr int kWorld = 2;
  constexpr size_t kN = 64;
  std::vector<std::vector<float>> inputs = {ExactData(0, kN), ExactData(1, kN)};
  for (auto& v : inputs) {
    for (float& f : v) f = std::fabs(f) + 1.0f;  // same sign: a sum differs from either input
  }
  for (BarrierLevel level : {BarrierLevel::kStream, BarrierLevel::kHost}) {
    for (bool skip : {false, true}) {
      DeviceWorld w = MakeDeviceWorld(kWorld);
      OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi&) {
        MixedPrecisionContext ctx(comm);
        std::vector<float> x = inputs[r];
        MixedOptions mo{.wire = DType::kBF16, .barrier = level, .context = &ctx};
        mo.debug_skip_host_barrier = skip;
        auto st = AllreduceMixed(comm, DevView(x.data(), kN, r), mo);
        ASSERT_TRUE(st.ok()) << st.status();
        size_t right = 0;
        for (size_t i = 0; i < kN; ++i) {
          right += Bits(x[i]) == Bits(Model(inputs, i, DType::kBF16, 1.0f));
        }
        EXPECT_EQ(right, skip ? 0u : kN)
            << BarrierLevelName(level) << (skip ? " without" : " with") << " the wait, rank " << r;
      });
    }
  }
}

// Index of the first call at or after `from` matching `pred`, or -1.
int Find(const std::vector<FakeCall>& calls, size_t from,
         const std::function<bool(const FakeCall&)>& pred) {
  for (size_t i = from; i < calls.size(); ++i) {
    if (pred(calls[i])) return static_cast<int>(i);
  }
  return -1;
}

TEST(DeviceMixed, StreamBarrierCallOrder) {
  DeviceWorld w = MakeDeviceWorld(2);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi& api) {
    MixedPrecisionContext ctx(comm);
    std::vector<float> x = ExactData(r, 100);
    std::vector<HookPoint> hooks;
    std::vector<HookHandle> handles;
    for (HookPoint p : {HookPoint::kBeforeCast, HookPoint::kAfterCast, HookPoint::kBeforeCollective,
                        HookPoint::kAfterCollective}) {
      handles.push_back(ctx.AddHook(p, "record", [&hooks](const HookInfo& info) {
        EXPECT_EQ(info.wire_data, nullptr);  // device memory is not handed to host hooks
        hooks.push_back(info.point);
      }));
    }
    api.ClearCalls();
    MixedOptions mo{.wire = DType::kBF16, .barrier = BarrierLevel::kStream, .context = &ctx};
    ASSERT_TRUE(AllreduceMixed(comm, DevView(x.data(), x.size(), r), mo).ok());
    EXPECT_EQ(hooks.size(), 4u);
    const std::vector<FakeCall> c = api.calls();
    void* s = CallerStream(r);
    const int cast = Find(c, 0, [&](const FakeCall& f) {
      return f.name == "LaunchCast" && f.stream == s && f.detail == "f32->bf16";
    });
    ASSERT_GE(cast, 0);
    const int rec1 =
        Find(c, cast, [&](const FakeCall& f) { return f.name == "EventRecord" && f.stream == s; });
    ASSERT_GT(rec1, cast);
    void* cast_done = c[rec1].event;
    const int wait1 = Find(c, rec1, [&](const FakeCall& f) {
      return f.name == "StreamWaitEvent" && f.event == cast_done;
    });
    ASSERT_GT(wait1, rec1);
    void* b = c[wait1].stream;
    EXPECT_NE(b, s) << "the collective runs on the context's communication stream";
    const int coll = Find(c, wait1, [&](const FakeCall& f) { return f.name == "AllReduce"; });
    ASSERT_GT(coll, wait1);
    EXPECT_EQ(c[coll].detail, std::to_string(static_cast<int>(nccl::NcclDataType::kBfloat16)));
    // The collective is stream-ordered behind B: its place in B is recorded, the communicator's
    // own stream waits for it and runs the collective, and B waits for that (Work::Wait).
    const int issued =
        Find(c, wait1, [&](const FakeCall& f) { return f.name == "EventRecord" && f.stream == b; });
    ASSERT_GT(issued, wait1);
    ASSERT_LT(issued, coll);
    const int comm_waits = Find(c, issued, [&](const FakeCall& f) {
      return f.name == "StreamWaitEvent" && f.event == c[issued].event;
    });
    ASSERT_GT(comm_waits, issued);
    ASSERT_LT(comm_waits, coll);
    EXPECT_EQ(c[comm_waits].stream, c[coll].stream);
    // B waits for the collective, unless the watchdog saw it finish before Wait() was called
    // (then there is nothing left to wait for).
    const int b_waits = Find(
        c, coll, [&](const FakeCall& f) { return f.name == "StreamWaitEvent" && f.stream == b; });
    if (b_waits >= 0) {
      EXPECT_GT(b_waits, coll);
    }
    const int wait2 = Find(
        c, coll, [&](const FakeCall& f) { return f.name == "StreamWaitEvent" && f.stream == s; });
    ASSERT_GT(wait2, coll);
    void* coll_done = c[wait2].event;
    EXPECT_NE(coll_done, cast_done);
    const int rec2 = Find(c, coll, [&](const FakeCall& f) {
      return f.name == "EventRecord" && f.event == coll_done;
    });
    ASSERT_GT(rec2, std::max(b_waits, coll));
    EXPECT_LT(rec2, wait2);
    EXPECT_EQ(c[rec2].stream, b);
    const int back = Find(c, wait2, [&](const FakeCall& f) {
      return f.name == "LaunchCast" && f.stream == s && f.detail == "bf16->f32";
    });
    EXPECT_GT(back, wait2);
    // No host stall between the cast and the collective: nothing synchronizes S in between.
    for (int i = cast; i < coll; ++i) {
      EXPECT_FALSE(c[i].name == "StreamSynchronize" || c[i].name == "MemcpyAsync") << i;
    }
  });
}

TEST(DeviceMixed, HostBarrierWaitsOnTheHostAndNeverOnAnEvent) {
  DeviceWorld w = MakeDeviceWorld(2);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi& api) {
    std::vector<float> x = ExactData(r, 100);
    api.ClearCalls();
    MixedOptions mo{.wire = DType::kF16, .barrier = BarrierLevel::kHost};
    ASSERT_TRUE(AllreduceMixed(comm, DevView(x.data(), x.size(), r), mo).ok());
    const std::vector<FakeCall> c = api.calls();
    const int cast = Find(c, 0, [](const FakeCall& f) { return f.name == "LaunchCast"; });
    const int read = Find(c, cast, [](const FakeCall& f) { return f.name == "MemcpyAsync"; });
    const int coll = Find(c, 0, [](const FakeCall& f) { return f.name == "AllReduce"; });
    ASSERT_GE(cast, 0);
    EXPECT_GT(read, cast);  // counters read back and waited for: the cast is done
    EXPECT_GT(coll, read);
    // The only stream waits before the collective are the communicator's own stream waiting for
    // the op's place in the caller's stream (stream ordering), never a barrier on the cast.
    for (int i = cast; i < coll; ++i) {
      if (c[i].name == "StreamWaitEvent") {
        EXPECT_EQ(c[i].stream, c[coll].stream) << i;
      }
    }
  });
}

// ---- scratch, counts, policies ----

TEST(DeviceMixed, ScratchIsReused) {
  DeviceWorld w = MakeDeviceWorld(2);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi& api) {
    MixedPrecisionContext ctx(comm);
    std::vector<float> x = ExactData(r, 4096);
    MixedOptions mo{.wire = DType::kBF16, .barrier = BarrierLevel::kStream, .context = &ctx};
    ASSERT_TRUE(AllreduceMixed(comm, DevView(x.data(), 4096, r), mo).ok());
    const int after_first = api.malloc_calls();
    ASSERT_TRUE(AllreduceMixed(comm, DevView(x.data(), 4096, r), mo).ok());
    ASSERT_TRUE(AllreduceMixed(comm, DevView(x.data(), 1000, r), mo).ok());
    EXPECT_EQ(api.malloc_calls(), after_first) << "no cudaMalloc once the scratch is big enough";
    std::vector<float> y = ExactData(r, 8192);
    ASSERT_TRUE(AllreduceMixed(comm, DevView(y.data(), 8192, r), mo).ok());
    EXPECT_EQ(api.malloc_calls(), after_first + 1) << "the wire buffer grows once";
  });
}

TEST(DeviceMixed, Fp16OverflowCountedAndPolicies) {
  constexpr size_t kN = 40;
  DeviceWorld w = MakeDeviceWorld(2);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi&) {
    MixedPrecisionContext ctx(comm);
    auto input = [&] {
      std::vector<float> x(kN, 1.5f);
      x[3] = 70000.0f;  // |x| >= 65520: Inf in fp16
      if (r == 1) x[4] = -1e6f;
      return x;
    };
    // report: counted, Inf in the result
    std::vector<float> x = input();
    MixedOptions mo{.wire = DType::kF16, .barrier = BarrierLevel::kStream, .context = &ctx};
    auto st = AllreduceMixed(comm, DevView(x.data(), kN, r), mo);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->cast_overflow, r == 0 ? 1u : 2u);
    EXPECT_EQ(st->global_cast_overflow, -1);  // no exchange with kReport
    EXPECT_EQ(x[3], std::numeric_limits<float>::infinity());
    EXPECT_EQ(x[4], -std::numeric_limits<float>::infinity());  // 1.5 + -Inf
    EXPECT_EQ(x[0], 3.0f);
    // fail: every rank, naming the counts
    x = input();
    mo.overflow = OverflowPolicy::kFail;
    st = AllreduceMixed(comm, DevView(x.data(), kN, r), mo);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(st.status().message(), HasSubstr("rank 0: 1, rank 1: 2"));
    EXPECT_EQ(x, input()) << "the input is untouched";
    // resend in bf16: finite, right
    mo.overflow = OverflowPolicy::kResendBF16;
    st = AllreduceMixed(comm, DevView(x.data(), kN, r), mo);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_TRUE(st->resent);
    EXPECT_EQ(st->wire_used, DType::kBF16);
    EXPECT_EQ(st->global_cast_overflow, 3);
    EXPECT_EQ(x[3], 140288.0f);  // 2 x bf16(70000) = 2 x 70144
    EXPECT_EQ(x[0], 3.0f);
  });
}

TEST(DeviceMixed, Fp16SumOverflowResendsInF32) {
  DeviceWorld w = MakeDeviceWorld(2);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi&) {
    std::vector<float> x(16, 40000.0f + r);  // each fits fp16; the sum does not
    MixedOptions mo{.wire = DType::kF16, .overflow = OverflowPolicy::kResendF32};
    mo.barrier = BarrierLevel::kStream;
    auto st = AllreduceMixed(comm, DevView(x.data(), 16, r), mo);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_TRUE(st->resent);
    EXPECT_EQ(st->wire_used, DType::kF32);
    EXPECT_EQ(st->result_nonfinite, 0u);
    for (float v : x) EXPECT_EQ(v, 80001.0f);
  });
}

TEST(DeviceMixed, ReduceScatterAllgatherAndF32Wire) {
  constexpr int kWorld = 2;
  constexpr size_t kBlock = 50;
  std::vector<std::vector<float>> inputs = {ExactData(0, kBlock * kWorld),
                                            ExactData(1, kBlock * kWorld)};
  DeviceWorld w = MakeDeviceWorld(kWorld);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi&) {
    MixedPrecisionContext ctx(comm);
    std::vector<float> in = inputs[r], out(kBlock, -1.0f);
    MixedOptions mo{.wire = DType::kBF16,
                    .op = ReduceOp::kAvg,
                    .barrier = BarrierLevel::kStream,
                    .context = &ctx};
    auto st = ReduceScatterMixed(comm, DevView(in.data(), in.size(), r),
                                 DevView(out.data(), kBlock, r), mo);
    ASSERT_TRUE(st.ok()) << st.status();
    for (size_t i = 0; i < kBlock; ++i) {
      ASSERT_EQ(Bits(out[i]), Bits(Model(inputs, r * kBlock + i, DType::kBF16, 0.5f))) << i;
    }
    std::vector<float> gathered(kBlock * kWorld);
    st = AllgatherMixed(comm, DevView(in.data(), kBlock, r),
                        DevView(gathered.data(), gathered.size(), r), mo);
    ASSERT_TRUE(st.ok()) << st.status();
    for (int j = 0; j < kWorld; ++j) {
      for (size_t i = 0; i < kBlock; ++i) {
        ASSERT_EQ(gathered[j * kBlock + i],
                  Widen(DType::kBF16, Narrow(DType::kBF16, inputs[j][i])));
      }
    }
    // The plain fp32 wire: the collective on the caller's buffer, the scale on the device.
    std::vector<float> x = inputs[r];
    mo.wire = DType::kF32;
    mo.scale = 4.0f;
    st = AllreduceMixed(comm, DevView(x.data(), x.size(), r), mo);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->wire_used, DType::kF32);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(x[i], (inputs[0][i] + inputs[1][i]) * 2.0f) << i;
    }
  });
}

TEST(DeviceMixed, GlobalBarrierDetectsMismatchedOps) {
  DeviceWorld w = MakeDeviceWorld(2);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi&) {
    std::vector<float> x(r == 0 ? 10 : 12, 1.0f);
    MixedOptions mo{.wire = DType::kBF16, .barrier = BarrierLevel::kGlobal};
    auto st = AllreduceMixed(comm, DevView(x.data(), x.size(), r), mo);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(st.status().message(), HasSubstr("rank 1 has {allreduce sum wire=bf16 count=12"));
  });
}

// ---- bad input ----

TEST(DeviceMixed, BadViewsAreRefusedNamingTheProblem) {
  DeviceWorld w = MakeDeviceWorld(1);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi&) {
    std::vector<float> in(8, 1.0f), out(8);
    MixedOptions mo{.wire = DType::kBF16, .barrier = BarrierLevel::kStream};
    auto st = ReduceScatterMixed(comm, DevView(in.data(), 8, r), HostView(out.data(), 8), mo);
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(st.status().message(), HasSubstr("input is on cuda:0 but output is on cpu"));
    st = AllgatherMixed(comm, HostView(in.data(), 8), DevView(out.data(), 8, r), mo);
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(st.status().message(), HasSubstr("input is on cpu but output is on cuda:0"));
    TensorView other = DevView(out.data(), 8, r);
    other.device = Device::Cuda(1);
    st = ReduceScatterMixed(comm, DevView(in.data(), 8, r), other, mo);
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(st.status().message(), HasSubstr("output is on cuda:1"));
    other = DevView(out.data(), 8, r);
    other.stream = reinterpret_cast<void*>(0x7777);
    st = AllgatherMixed(comm, DevView(in.data(), 8, r), other, mo);
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(st.status().message(), HasSubstr("different CUDA streams"));
    TensorView far = DevView(in.data(), 8, r);
    far.device = Device::Cuda(3);  // the fake has one device
    st = AllreduceMixed(comm, far, mo);
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(st.status().message(), HasSubstr("cudaSetDevice(3)"));
  });
}

TEST(DeviceMixed, FailingCastLaunchIsReported) {
  FakeNcclFaults f;
  f.launch_cast_error = cuda::kCudaErrorNotSupported;
  DeviceWorld w = MakeDeviceWorld(1, f);
  OnRanks(w, [&](int r, Communicator& comm, FakeNcclApi&) {
    std::vector<float> x(8, 1.0f);
    auto st = AllreduceMixed(comm, DevView(x.data(), 8, r), MixedOptions{});
    EXPECT_EQ(st.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(st.status().message(), HasSubstr("fp32 -> wire cast kernel is not available"));
    EXPECT_EQ(x, std::vector<float>(8, 1.0f));
  });
}

}  // namespace
}  // namespace adaptcomm

// GradientBucketer: fused results equal per-tensor allreduces bit for bit (sum, avg, mixed
// precision, on Gloo and shared memory, tensors marked in random orders), buckets launched before
// backward ends, and every misuse (registrations that differ, a tensor marked twice or never)
// failing every rank with the rank and the tensor named.
#include "adaptcomm/bucketer.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/precision.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::RankEnv;
using testing::RankMode;

// Mixed sizes, a few around the bucket size so that buckets hold one tensor or many.
std::vector<GradientSpec> Specs(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<GradientSpec> specs;
  for (int i = 0; i < n; ++i) {
    const size_t count = i % 7 == 3 ? 6000 + rng() % 3000 : 1 + rng() % 1500;
    specs.push_back({absl::StrCat("layer", i, ".weight"), count});
  }
  return specs;
}

std::vector<std::vector<float>> Gradients(const std::vector<GradientSpec>& specs, int rank,
                                          int step) {
  std::mt19937 rng(1000u * static_cast<unsigned>(rank) + static_cast<unsigned>(step));
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<std::vector<float>> g(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    g[i].resize(specs[i].count);
    for (float& v : g[i]) v = u(rng);
  }
  return g;
}

std::unique_ptr<Communicator> Make(const RankEnv& env, BackendChoice backend) {
  CommunicatorOptions o = env.options;
  o.backend = backend;
  o.fallback = Fallback::kDeny;
  auto comm = Communicator::Create(o);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? *std::move(comm) : nullptr;
}

std::vector<int> Shuffled(int n, unsigned seed) {
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

// Two ranks: a + b is the same bits in either order, so any correct allreduce gives the same bits,
// and a bucketed one must match the per-tensor one exactly, element by element.
void ExpectSameAsPerTensor(BackendChoice backend, ReduceOp op, RankMode mode = RankMode::kThreads) {
  testing::RunRanks(mode, 2, [&](const RankEnv& env) {
    auto comm = Make(env, backend);
    ASSERT_NE(comm, nullptr);
    const std::vector<GradientSpec> specs = Specs(40, 7);
    BucketerOptions bo;
    bo.op = op;
    bo.bucket_bytes = 16 << 10;
    bo.direct_bytes = 30000;  // some of the 6000-9000-element tensors are reduced in place
    auto bucketer = GradientBucketer::Create(*comm, specs, bo);
    ASSERT_TRUE(bucketer.ok()) << bucketer.status();
    EXPECT_GT((*bucketer)->bucket_count(), 4);
    for (int step = 0; step < 3; ++step) {
      std::vector<std::vector<float>> got = Gradients(specs, env.rank, step);
      std::vector<std::vector<float>> want = got;
      // Each rank marks in its own random order, different every step.
      for (int i : Shuffled(static_cast<int>(specs.size()), 31u * env.rank + step)) {
        ASSERT_TRUE((*bucketer)->MarkReady(i, HostView(got[i].data(), got[i].size())).ok());
      }
      auto stats = (*bucketer)->Wait();
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(stats->buckets, (*bucketer)->bucket_count());
      for (auto& w : want) {
        ASSERT_TRUE(comm->Allreduce(HostView(w.data(), w.size()), {op}).Wait().ok());
      }
      for (size_t i = 0; i < specs.size(); ++i) {
        for (size_t k = 0; k < got[i].size(); ++k) {
          uint32_t a, b;
          std::memcpy(&a, &got[i][k], 4);
          std::memcpy(&b, &want[i][k], 4);
          ASSERT_EQ(a, b) << "rank " << env.rank << " step " << step << " tensor " << i
                          << " element " << k << ": " << got[i][k] << " vs " << want[i][k];
        }
      }
    }
  });
}

TEST(Bucketer, SumOnGlooEqualsPerTensorAllreduceBitForBit) {
  ExpectSameAsPerTensor(BackendChoice::kGloo, ReduceOp::kSum);
}
TEST(Bucketer, SumOnShmEqualsPerTensorAllreduceBitForBit) {
  ExpectSameAsPerTensor(BackendChoice::kShm, ReduceOp::kSum);
}
TEST(Bucketer, AvgOnGlooEqualsPerTensorAllreduceBitForBit) {
  ExpectSameAsPerTensor(BackendChoice::kGloo, ReduceOp::kAvg);
}
TEST(Bucketer, AvgOnShmEqualsPerTensorAllreduceBitForBit) {
  ExpectSameAsPerTensor(BackendChoice::kShm, ReduceOp::kAvg);
}
TEST(Bucketer, AvgOnGlooAcrossProcessesEqualsPerTensorAllreduceBitForBit) {
  ExpectSameAsPerTensor(BackendChoice::kGloo, ReduceOp::kAvg, RankMode::kProcesses);
}
TEST(Bucketer, SumOnShmAcrossProcessesEqualsPerTensorAllreduceBitForBit) {
  ExpectSameAsPerTensor(BackendChoice::kShm, ReduceOp::kSum, RankMode::kProcesses);
}

// Three ranks, values that every summation order adds exactly (multiples of 1/8 below 2^20): the
// expected sum is known element by element; in-place storage (no copies) and views mixed.
TEST(Bucketer, ThreeRanksSumExactWithInPlaceStorageAndCopiedViews) {
  testing::RunRanks(RankMode::kThreads, 3, [&](const RankEnv& env) {
    auto comm = Make(env, BackendChoice::kShm);
    ASSERT_NE(comm, nullptr);
    const std::vector<GradientSpec> specs = Specs(25, 3);
    BucketerOptions bo;
    bo.op = ReduceOp::kSum;
    bo.bucket_bytes = 8 << 10;
    auto bucketer = GradientBucketer::Create(*comm, specs, bo);
    ASSERT_TRUE(bucketer.ok()) << bucketer.status();
    auto value = [](int rank, size_t i, size_t k) {
      return static_cast<float>((rank + 1) * static_cast<int>((i * 131 + k) % 4093)) / 8.0f;
    };
    std::vector<std::vector<float>> own(specs.size());
    for (int i : Shuffled(static_cast<int>(specs.size()), 5u + env.rank)) {
      if (i % 2 == 0) {
        TensorView slot = (*bucketer)->Storage(i);
        ASSERT_EQ(slot.count, specs[i].count);
        float* p = static_cast<float*>(slot.data);
        for (size_t k = 0; k < slot.count; ++k) p[k] = value(env.rank, i, k);
        ASSERT_TRUE((*bucketer)->MarkReady(i).ok());
      } else {
        own[i].resize(specs[i].count);
        for (size_t k = 0; k < own[i].size(); ++k) own[i][k] = value(env.rank, i, k);
        ASSERT_TRUE((*bucketer)->MarkReady(i, HostView(own[i].data(), own[i].size())).ok());
      }
    }
    ASSERT_TRUE((*bucketer)->Wait().ok());
    for (size_t i = 0; i < specs.size(); ++i) {
      const float* p =
          i % 2 == 0 ? static_cast<const float*>((*bucketer)->Storage(i).data) : own[i].data();
      for (size_t k = 0; k < specs[i].count; ++k) {
        ASSERT_EQ(p[k], value(0, i, k) + value(1, i, k) + value(2, i, k))
            << "rank " << env.rank << " tensor " << i << " element " << k;
      }
    }
  });
}

// Buckets hold tensors in reverse registration order, a new bucket once one reaches the size;
// the same on every rank whatever the marking order.
TEST(Bucketer, AssignmentIsReverseRegistrationOrderCutAtTheBucketSize) {
  testing::RunRanks(RankMode::kThreads, 1, [&](const RankEnv& env) {
    auto comm = Make(env, BackendChoice::kShm);
    ASSERT_NE(comm, nullptr);
    std::vector<GradientSpec> specs = {{"a", 1000}, {"b", 300}, {"c", 300},
                                       {"d", 3000}, {"e", 200}, {"f", 10, DType::kI32}};
    BucketerOptions bo;
    bo.op = ReduceOp::kSum;
    bo.bucket_bytes = 2400;  // 600 floats
    auto bucketer = GradientBucketer::Create(*comm, specs, bo);
    ASSERT_TRUE(bucketer.ok()) << bucketer.status();
    ASSERT_EQ((*bucketer)->bucket_count(), 4);
    EXPECT_EQ((*bucketer)->bucket(0).tensors, std::vector<int>({5}));  // i32 apart
    EXPECT_EQ((*bucketer)->bucket(1).tensors, std::vector<int>({4, 3}));
    EXPECT_EQ((*bucketer)->bucket(2).tensors, std::vector<int>({2, 1}));
    EXPECT_EQ((*bucketer)->bucket(3).tensors, std::vector<int>({0}));
    EXPECT_EQ((*bucketer)->bucket(2).bytes, 2400u);
    EXPECT_EQ((*bucketer)->bucket_of(3), 1);
    // Tensors of direct_bytes or more are buckets of their own; the others fuse around them.
    bo.direct_bytes = 4000;
    auto direct = GradientBucketer::Create(*comm, specs, bo);
    ASSERT_TRUE(direct.ok()) << direct.status();
    ASSERT_EQ((*direct)->bucket_count(), 4);
    EXPECT_EQ((*direct)->bucket(1).tensors, std::vector<int>({4, 2, 1}));
    EXPECT_EQ((*direct)->bucket(2).tensors, std::vector<int>({3}));
    EXPECT_EQ((*direct)->bucket(3).tensors, std::vector<int>({0}));
  });
}

// The profile's buckets.bytes sizes the buckets when the options leave it unset.
TEST(Bucketer, BucketSizeComesFromTheProfile) {
  const std::string profile = ::testing::TempDir() + "/bucketer_profile.yaml";
  std::ofstream(profile) << "schema: 1\ndefaults:\n  buckets:\n    bytes: 8KiB\n"
                         << "tiers:\n  - name: test\n    params: any\n";
  testing::RunRanks(RankMode::kThreads, 1, [&](const RankEnv& env) {
    CommunicatorOptions o = env.options;
    if (!profile.empty()) o.profile_file = profile;
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ((*comm)->config().buckets.bytes, 8192u);
    std::vector<GradientSpec> specs(10, GradientSpec{"w", 1024});  // 4 KiB each
    auto bucketer = GradientBucketer::Create(**comm, specs, {});
    ASSERT_TRUE(bucketer.ok()) << bucketer.status();
    EXPECT_EQ((*bucketer)->bucket_count(), 5);
  });
}

// bf16 wire: every bucket goes through AllreduceMixed; with two ranks the result is the same bits
// as AllreduceMixed on each tensor alone (each element rounded once, summed, rounded once).
TEST(Bucketer, MixedPrecisionBf16EqualsPerTensorAllreduceMixed) {
  testing::RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    auto comm = Make(env, BackendChoice::kGloo);
    ASSERT_NE(comm, nullptr);
    const std::vector<GradientSpec> specs = Specs(30, 11);
    BucketerOptions bo;
    bo.op = ReduceOp::kAvg;
    bo.wire = DType::kBF16;
    bo.bucket_bytes = 16 << 10;
    auto bucketer = GradientBucketer::Create(*comm, specs, bo);
    ASSERT_TRUE(bucketer.ok()) << bucketer.status();
    std::vector<std::vector<float>> got = Gradients(specs, env.rank, 0), want = got;
    for (int i : Shuffled(static_cast<int>(specs.size()), 17u + env.rank)) {
      ASSERT_TRUE((*bucketer)->MarkReady(i, HostView(got[i].data(), got[i].size())).ok());
    }
    auto stats = (*bucketer)->Wait();
    ASSERT_TRUE(stats.ok()) << stats.status();
    MixedPrecisionContext ctx(*comm);
    MixedOptions mo;
    mo.wire = DType::kBF16;
    mo.op = ReduceOp::kAvg;
    mo.context = &ctx;
    for (auto& w : want) ASSERT_TRUE(AllreduceMixed(*comm, HostView(w.data(), w.size()), mo).ok());
    size_t rounded = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      for (size_t k = 0; k < got[i].size(); ++k) {
        ASSERT_EQ(got[i][k], want[i][k]) << "rank " << env.rank << " tensor " << i << " el " << k;
        uint32_t bits;
        std::memcpy(&bits, &got[i][k], 4);
        rounded += (bits & 0xffff) == 0;
      }
    }
    size_t total = 0;
    for (const auto& s : specs) total += s.count;
    EXPECT_EQ(rounded, total);  // every result went through bf16 (low 16 bits zero)
  });
}

// fp16 wire with the overflow guard set to fail: one rank's gradient past 65504 fails the step on
// every rank, and the next step runs normally.
TEST(Bucketer, MixedFp16OverflowGuardFailsTheStepOnEveryRank) {
  testing::RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    auto comm = Make(env, BackendChoice::kShm);
    ASSERT_NE(comm, nullptr);
    std::vector<GradientSpec> specs(6, GradientSpec{"w", 500});
    BucketerOptions bo;
    bo.op = ReduceOp::kSum;
    bo.wire = DType::kF16;
    bo.overflow = OverflowPolicy::kFail;
    bo.bucket_bytes = 4096;
    auto bucketer = GradientBucketer::Create(*comm, specs, bo);
    ASSERT_TRUE(bucketer.ok()) << bucketer.status();
    for (int step = 0; step < 2; ++step) {
      std::vector<std::vector<float>> g(specs.size(), std::vector<float>(500, 1.5f));
      if (step == 0 && env.rank == 1) g[2][7] = 1e6f;
      for (int i = 5; i >= 0; --i) {
        ASSERT_TRUE((*bucketer)->MarkReady(i, HostView(g[i].data(), g[i].size())).ok());
      }
      auto stats = (*bucketer)->Wait();
      if (step == 0) {
        EXPECT_TRUE(absl::IsInvalidArgument(stats.status())) << stats.status();
      } else {
        ASSERT_TRUE(stats.ok()) << stats.status();
        for (const auto& t : g) {
          for (float v : t) ASSERT_EQ(v, 3.0f);
        }
      }
    }
  });
}

TEST(Bucketer, RegistrationsThatDifferAreRefusedNamingRankAndTensor) {
  testing::RunRanks(RankMode::kThreads, 3, [&](const RankEnv& env) {
    auto comm = Make(env, BackendChoice::kShm);
    ASSERT_NE(comm, nullptr);
    std::vector<GradientSpec> specs = Specs(8, 1);
    if (env.rank == 2) specs[3].count += 1;
    auto bucketer = GradientBucketer::Create(*comm, specs, {});
    ASSERT_FALSE(bucketer.ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(bucketer.status())) << bucketer.status();
    EXPECT_THAT(std::string(bucketer.status().message()),
                HasSubstr(absl::StrCat("rank 2's registration differs from rank 0's: tensor 3 "
                                       "(layer3.weight here) is ",
                                       specs[3].count + (env.rank == 2 ? 0 : 1), " x f32 on cpu")))
        << "rank " << env.rank;
    // A missing tensor, and a dtype that differs.
    std::vector<GradientSpec> fewer = Specs(8, 1);
    if (env.rank == 1) fewer.pop_back();
    auto b2 = GradientBucketer::Create(*comm, fewer, {});
    EXPECT_THAT(std::string(b2.status().message()),
                HasSubstr("rank 1 registers 7 tensors and rank 0 8; the first tensor only one of "
                          "them has is tensor 7"));
    std::vector<GradientSpec> typed = Specs(8, 1);
    if (env.rank == 1) typed[5].dtype = DType::kF64;
    auto b3 = GradientBucketer::Create(*comm, typed, {});
    EXPECT_THAT(std::string(b3.status().message()), HasSubstr("tensor 5"));
    EXPECT_THAT(std::string(b3.status().message()), HasSubstr("f64 on cpu on rank 1"));
  });
}

// Rank 1 forgets tensor 2 in step 0 and marks tensor 4 twice in step 1: both ranks' Wait fail
// naming rank 1 and the tensor (nobody hangs), and step 2 is correct again.
TEST(Bucketer, TensorNeverMarkedOrMarkedTwiceFailsEveryRankNamingIt) {
  testing::RunRanks(
      RankMode::kThreads, 2,
      [&](const RankEnv& env) {
        auto comm = Make(env, BackendChoice::kShm);
        ASSERT_NE(comm, nullptr);
        const std::vector<GradientSpec> specs = Specs(6, 9);
        BucketerOptions bo;
        bo.op = ReduceOp::kSum;
        bo.bucket_bytes = 4096;
        auto bucketer = GradientBucketer::Create(*comm, specs, bo);
        ASSERT_TRUE(bucketer.ok()) << bucketer.status();
        for (int step = 0; step < 3; ++step) {
          std::vector<std::vector<float>> g(specs.size());
          for (size_t i = 0; i < specs.size(); ++i) g[i].assign(specs[i].count, 1.0f + env.rank);
          for (int i = 5; i >= 0; --i) {
            if (step == 0 && env.rank == 1 && i == 2) continue;
            ASSERT_TRUE((*bucketer)->MarkReady(i, HostView(g[i].data(), g[i].size())).ok());
            if (step == 1 && env.rank == 1 && i == 4) {
              absl::Status again = (*bucketer)->MarkReady(i, HostView(g[i].data(), g[i].size()));
              EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
            }
          }
          const absl::Time start = absl::Now();
          auto stats = (*bucketer)->Wait();
          EXPECT_LT(absl::Now() - start, absl::Seconds(10));
          if (step == 0) {
            EXPECT_THAT(std::string(stats.status().message()),
                        HasSubstr("rank 1: tensor 2 (layer2.weight) was never marked ready"))
                << "rank " << env.rank;
          } else if (step == 1) {
            EXPECT_THAT(std::string(stats.status().message()),
                        HasSubstr("rank 1: tensor 4 (layer4.weight) was marked ready twice"))
                << "rank " << env.rank;
          } else {
            ASSERT_TRUE(stats.ok()) << stats.status();
            for (const auto& t : g) {
              for (float v : t) ASSERT_EQ(v, 3.0f);
            }
          }
        }
      },
      absl::Seconds(60));
}

// UnusedPolicy::kZero: rank 1 never produces tensor 1's gradient; it counts as zero there and the
// average is rank 0's value over two, on both ranks (rank 1 reads it in Storage(1)).
TEST(Bucketer, UnusedTensorsCountAsZeroWhenAsked) {
  testing::RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    auto comm = Make(env, BackendChoice::kGloo);
    ASSERT_NE(comm, nullptr);
    std::vector<GradientSpec> specs(3, GradientSpec{"w", 100});
    BucketerOptions bo;
    bo.unused = UnusedPolicy::kZero;
    auto bucketer = GradientBucketer::Create(*comm, specs, bo);
    ASSERT_TRUE(bucketer.ok()) << bucketer.status();
    std::vector<std::vector<float>> g(3, std::vector<float>(100, 4.0f));
    for (int i = 2; i >= 0; --i) {
      if (env.rank == 1 && i == 1) continue;
      ASSERT_TRUE((*bucketer)->MarkReady(i, HostView(g[i].data(), 100)).ok());
    }
    auto stats = (*bucketer)->Wait();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->unused_tensors, env.rank == 1 ? 1 : 0);
    const float* one =
        env.rank == 1 ? static_cast<const float*>((*bucketer)->Storage(1).data) : g[1].data();
    for (int k = 0; k < 100; ++k) {
      ASSERT_EQ(one[k], 2.0f) << "rank " << env.rank;
      ASSERT_EQ(g[0][k], 4.0f);
      ASSERT_EQ(g[2][k], 4.0f);
    }
  });
}

// Overlap: with one tensor per bucket, marking the last three tensors launches their buckets at
// once; the first of them completes while the first tensor is still "in backward".
TEST(Bucketer, BucketCompletesBeforeTheLastTensorIsReady) {
  for (BackendChoice backend : {BackendChoice::kShm, BackendChoice::kGloo}) {
    testing::RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
      auto comm = Make(env, backend);
      ASSERT_NE(comm, nullptr);
      std::vector<GradientSpec> specs(4, GradientSpec{"w", 4096});
      BucketerOptions bo;
      bo.bucket_bytes = 4096 * 4;
      auto bucketer = GradientBucketer::Create(*comm, specs, bo);
      ASSERT_TRUE(bucketer.ok()) << bucketer.status();
      ASSERT_EQ((*bucketer)->bucket_count(), 4);
      std::vector<std::vector<float>> g(4, std::vector<float>(4096, 1.0f));
      for (int i = 3; i >= 1; --i) {
        ASSERT_TRUE((*bucketer)->MarkReady(i, HostView(g[i].data(), 4096)).ok());
      }
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      while ((*bucketer)->bucket_state(0) != WorkState::kDone && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      EXPECT_EQ((*bucketer)->bucket_state(0), WorkState::kDone);
      EXPECT_EQ((*bucketer)->bucket_state(3), WorkState::kPending);  // tensor 0: not ready yet
      ASSERT_TRUE((*bucketer)->MarkReady(0, HostView(g[0].data(), 4096)).ok());
      auto stats = (*bucketer)->Wait();
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(stats->launched_before_wait, 4);
      for (const auto& t : g) ASSERT_EQ(t[100], 1.0f);  // avg of ones
    });
  }
}

TEST(Bucketer, BadOptionsAndViewsAreRefused) {
  testing::RunRanks(RankMode::kThreads, 1, [&](const RankEnv& env) {
    auto comm = Make(env, BackendChoice::kShm);
    ASSERT_NE(comm, nullptr);
    auto avg_int = GradientBucketer::Create(*comm, {{"steps", 4, DType::kI32}}, {});
    EXPECT_TRUE(absl::IsInvalidArgument(avg_int.status())) << avg_int.status();
    auto cuda = GradientBucketer::Create(*comm, {{"w", 4, DType::kF32, Device::Cuda(0)}}, {});
    EXPECT_TRUE(absl::IsUnimplemented(cuda.status())) << cuda.status();
    auto empty = GradientBucketer::Create(*comm, {{"w", 0}}, {});
    EXPECT_TRUE(absl::IsInvalidArgument(empty.status())) << empty.status();
    // Zero once meant "the profile's" / "the communicator's"; set, it is refused (unset is that).
    BucketerOptions zero_bytes;
    zero_bytes.bucket_bytes = 0;
    auto no_bytes = GradientBucketer::Create(*comm, {{"w", 4}}, zero_bytes);
    EXPECT_TRUE(absl::IsInvalidArgument(no_bytes.status())) << no_bytes.status();
    BucketerOptions zero_timeout;
    zero_timeout.timeout = absl::ZeroDuration();
    auto no_time = GradientBucketer::Create(*comm, {{"w", 4}}, zero_timeout);
    EXPECT_THAT(std::string(no_time.status().message()), HasSubstr("timeout must be positive"));
    auto ok = GradientBucketer::Create(*comm, {{"w", 4}}, {});
    ASSERT_TRUE(ok.ok()) << ok.status();
    std::vector<float> three(3);
    EXPECT_TRUE(absl::IsInvalidArgument((*ok)->MarkReady(0, HostView(three.data(), 3))));
    EXPECT_TRUE(absl::IsInvalidArgument((*ok)->MarkReady(7, HostView(three.data(), 3))));
    auto stats = (*ok)->Wait();
    EXPECT_THAT(std::string(stats.status().message()),
                HasSubstr("rank 0: tensor 0 (w) was marked ready with a view unlike"));
  });
}

}  // namespace
}  // namespace adaptcomm

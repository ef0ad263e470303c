// GradientBucketer and CUDA tensors, on the fake CUDA/NCCL seams: a backend that stages CUDA
// views (Gloo) reduces each CUDA tensor as a bucket of its own beside fused host buckets; on NCCL
// (device memory only) the bookkeeping goes through device scratch, with the same checks.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adaptcomm/bucketer.h"
#include "adaptcomm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/gloo/gloo_backend.h"
#include "lib/nccl/staged_backend.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;

TEST(NcclBucketer, CudaTensorsOnAStagingBackendAreBucketsOfTheirOwn) {
  auto fakes = std::vector<std::shared_ptr<FakeNcclApi>>{
      std::make_shared<FakeNcclApi>(testing::MakeFakeNcclWorld(), FakeNcclFaults{}),
      std::make_shared<FakeNcclApi>(testing::MakeFakeNcclWorld(), FakeNcclFaults{})};
  testing::RunRanks(
      testing::RankMode::kThreads, 2,
      [&](const testing::RankEnv& env) {
        GlooBackendOptions go;
        go.rank = env.rank;
        go.size = 2;
        go.store = CreatePrefixStore("bucketer-gloo", env.options.store);
        go.hostname = "127.0.0.1";
        go.init_timeout = absl::Seconds(20);
        auto gloo = CreateGlooBackend(go);
        ASSERT_TRUE(gloo.ok()) << gloo.status();
        auto staged = nccl::CreateStagedBackend(std::move(*gloo), fakes[env.rank]);
        ASSERT_TRUE(staged.ok()) << staged.status();
        auto comm = Communicator::CreateWithBackend(std::move(*staged), env.options);
        ASSERT_TRUE(comm.ok()) << comm.status();
        const std::vector<GradientSpec> specs = {{"a", 100},
                                                 {"b", 50, DType::kF32, Device::Cuda(0)},
                                                 {"c", 100},
                                                 {"d", 10, DType::kF32, Device::Cuda(0)}};
        BucketerOptions bo;
        bo.op = ReduceOp::kSum;
        auto bucketer = GradientBucketer::Create(**comm, specs, bo);
        ASSERT_TRUE(bucketer.ok()) << bucketer.status();
        ASSERT_EQ((*bucketer)->bucket_count(), 3);
        EXPECT_EQ((*bucketer)->bucket(0).tensors, std::vector<int>({3}));
        EXPECT_EQ((*bucketer)->bucket(1).tensors, std::vector<int>({2, 0}));
        EXPECT_EQ((*bucketer)->bucket(2).tensors, std::vector<int>({1}));
        EXPECT_EQ((*bucketer)->Storage(1).data, nullptr);  // no host slot for a CUDA tensor
        // The fake CUDA takes host pointers tagged cuda:0 as device memory.
        std::vector<std::vector<float>> g;
        for (const GradientSpec& s : specs) g.emplace_back(s.count, 1.5f + env.rank);
        for (int i = 3; i >= 0; --i) {
          ASSERT_TRUE((*bucketer)
                          ->MarkReady(i, TensorView{g[i].data(), g[i].size(), DType::kF32,
                                                    specs[i].device, nullptr})
                          .ok());
        }
        auto stats = (*bucketer)->Wait();
        ASSERT_TRUE(stats.ok()) << stats.status();
        EXPECT_EQ(stats->buckets, 3);
        for (size_t i = 0; i < g.size(); ++i) {
          for (float v : g[i]) ASSERT_EQ(v, 4.0f) << "rank " << env.rank << " tensor " << i;
        }
        EXPECT_GE(fakes[env.rank]->memcpy_calls(), 4);  // each CUDA bucket staged both ways
      },
      absl::Seconds(60));
}

// Two fake-NCCL ranks, each with its own fake GPU, running `body` on an NCCL communicator.
void OnNccl(const std::function<void(Communicator&, int rank, FakeNcclApi& gpu)>& body) {
  auto world = testing::MakeFakeNcclWorld();
  std::vector<std::shared_ptr<FakeNcclApi>> fakes;
  for (int r = 0; r < 2; ++r) {
    fakes.push_back(std::make_shared<FakeNcclApi>(world, FakeNcclFaults{}));
  }
  testing::RunRanks(
      testing::RankMode::kThreads, 2,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.backend = BackendChoice::kNccl;
        internal::CommunicatorDeps deps;
        deps.use_given_apis = true;
        deps.cuda = fakes[static_cast<size_t>(env.rank)];
        deps.nccl = fakes[static_cast<size_t>(env.rank)];
        auto comm = internal::CreateCommunicatorWith(o, deps);
        ASSERT_TRUE(comm.ok()) << comm.status();
        ASSERT_STREQ((*comm)->backend_name(), "nccl");
        body(**comm, env.rank, *fakes[static_cast<size_t>(env.rank)]);
      },
      absl::Seconds(60));
}

TensorView Cuda(std::vector<float>& v) {
  return TensorView{v.data(), v.size(), DType::kF32, Device::Cuda(0), nullptr};
}

// Every op of the backend before it has finished on the device once this returns.
void DrainDevice(Communicator& comm) {
  float one = 1;
  ASSERT_TRUE(comm.Allreduce(TensorView{&one, 1, DType::kF32, Device::Cuda(0), nullptr})
                  .Synchronize(absl::Seconds(20))
                  .ok());
}

std::vector<GradientSpec> CudaSpecs() {
  std::vector<GradientSpec> specs;
  for (int i = 0; i < 5; ++i) {
    specs.push_back({absl::StrCat("w", i), size_t(100 + 37 * i), DType::kF32, Device::Cuda(0)});
  }
  return specs;
}

// NCCL takes device memory only: the registration digest and the error exchange go through
// device scratch, where CUDA tensors are fused too: each copied in on its own stream (two streams
// here), the bucket reduced on the bucketer's stream once every copy is done, copied back, and
// each gradient's stream made to wait for that. A tensor alone in its bucket is reduced in place.
TEST(NcclBucketer, CudaTensorsOnNcclAreFusedInDeviceScratch) {
  OnNccl([](Communicator& comm, int rank, FakeNcclApi& gpu) {
    const std::vector<GradientSpec> specs = CudaSpecs();  // 100, 137, 174, 211, 248 floats
    BucketerOptions bo;
    bo.bucket_bytes = 1000;
    auto bucketer = GradientBucketer::Create(comm, specs, bo);
    ASSERT_TRUE(bucketer.ok()) << bucketer.status();
    ASSERT_EQ((*bucketer)->bucket_count(), 3);
    EXPECT_EQ((*bucketer)->bucket(0).tensors, std::vector<int>({4, 3}));
    EXPECT_EQ((*bucketer)->bucket(1).tensors, std::vector<int>({2, 1}));
    EXPECT_EQ((*bucketer)->bucket(2).tensors, std::vector<int>({0}));
    EXPECT_NE((*bucketer)->Storage(3).data, nullptr);  // a device slot
    EXPECT_EQ((*bucketer)->Storage(0).data, nullptr);  // alone: the caller's view is reduced
    cuda::CudaStream other = nullptr;
    ASSERT_EQ(gpu.StreamCreateNonBlocking(&other), cuda::kCudaSuccess);
    for (int step = 0; step < 2; ++step) {
      std::vector<std::vector<float>> g;
      for (const GradientSpec& s : specs) g.emplace_back(s.count, 1.0f + 2.0f * rank + step);
      for (int i : {2, 4, 0, 3, 1}) {
        TensorView v = Cuda(g[i]);
        v.stream = i % 2 == 0 ? other : nullptr;
        ASSERT_TRUE((*bucketer)->MarkReady(i, v).ok());
      }
      auto stats = (*bucketer)->Wait();
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(stats->buckets, 3);
      // What work queued on each gradient's stream after Wait() reads: the reduced values.
      for (size_t i = 0; i < g.size(); ++i) {
        cuda::CudaStream stream = i % 2 == 0 ? other : nullptr;
        std::vector<float> seen(g[i].size(), -1.0f);
        ASSERT_EQ(gpu.MemcpyAsync(seen.data(), g[i].data(), seen.size() * sizeof(float),
                                  cuda::MemcpyKind::kDeviceToHost, stream),
                  cuda::kCudaSuccess);
        ASSERT_EQ(gpu.StreamSynchronize(stream), cuda::kCudaSuccess);
        for (float v : seen) ASSERT_EQ(v, 2.0f + step) << "rank " << rank << " tensor " << i;
      }
    }
    (void)gpu.StreamDestroy(other);
  });
}

TEST(NcclBucketer, MismatchAndUnmarkedTensorsAreNamedOnEveryRankThroughTheDevice) {
  OnNccl([](Communicator& comm, int rank, FakeNcclApi&) {
    std::vector<GradientSpec> specs = CudaSpecs();
    if (rank == 1) specs[2].count = 7;
    auto bad = GradientBucketer::Create(comm, specs, {});
    EXPECT_THAT(std::string(bad.status().message()),
                HasSubstr("rank 1's registration differs from rank 0's: tensor 2 (w2 here) is 7 x "
                          "f32 on cuda:0 on rank 1 but 174 x f32 on cuda:0 on rank 0"))
        << bad.status();
    auto bucketer = GradientBucketer::Create(comm, CudaSpecs(), {});
    ASSERT_TRUE(bucketer.ok()) << bucketer.status();
    for (int step = 0; step < 2; ++step) {
      std::vector<std::vector<float>> g;
      for (const GradientSpec& s : CudaSpecs()) g.emplace_back(s.count, 3.0f);
      for (int i = 4; i >= 0; --i) {
        if (step == 0 && rank == 1 && i == 3) continue;  // never marked: zeros stand in
        ASSERT_TRUE((*bucketer)->MarkReady(i, Cuda(g[i])).ok());
      }
      auto stats = (*bucketer)->Wait();
      if (step == 0) {
        EXPECT_THAT(std::string(stats.status().message()),
                    HasSubstr("rank 1: tensor 3 (w3) was never marked ready"))
            << "rank " << rank << ": " << stats.status();
        continue;
      }
      ASSERT_TRUE(stats.ok()) << stats.status();
      DrainDevice(comm);
      for (const auto& t : g) {
        for (float v : t) ASSERT_EQ(v, 3.0f);  // avg
      }
    }
  });
}

TEST(NcclBucketer, HostTensorsAndMixedWiresOnNcclAreRefused) {
  OnNccl([](Communicator& comm, int, FakeNcclApi&) {
    auto host = GradientBucketer::Create(comm, {{"w", 64}}, {});
    EXPECT_TRUE(absl::IsUnimplemented(host.status())) << host.status();
    EXPECT_THAT(std::string(host.status().message()),
                HasSubstr("is host memory but the communicator's backend (nccl) takes device "
                          "memory only"));
    BucketerOptions bf16;
    bf16.wire = DType::kBF16;
    auto mixed = GradientBucketer::Create(comm, CudaSpecs(), bf16);
    EXPECT_TRUE(absl::IsUnimplemented(mixed.status())) << mixed.status();
  });
}

}  // namespace
}  // namespace adaptcomm

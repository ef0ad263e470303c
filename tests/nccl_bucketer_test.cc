// GradientBucketer and CUDA tensors, on the fake CUDA/NCCL seams: a backend that stages CUDA
// views (Gloo) reduces each CUDA tensor as a bucket of its own beside fused host buckets; a
// device-only backend (NCCL) is refused at Create, naming why.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adaptcomm/bucketer.h"
#include "adaptcomm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator_factory.h"
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

TEST(NcclBucketer, DeviceOnlyBackendIsRefusedNamingWhy) {
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
        auto bucketer =
            GradientBucketer::Create(**comm, {{"w", 64, DType::kF32, Device::Cuda(0)}}, {});
        EXPECT_TRUE(absl::IsUnimplemented(bucketer.status())) << bucketer.status();
        EXPECT_THAT(std::string(bucketer.status().message()),
                    HasSubstr("backend (nccl) takes device memory only"));
      },
      absl::Seconds(60));
}

}  // namespace
}  // namespace adaptcomm

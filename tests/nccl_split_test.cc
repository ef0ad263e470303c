// Communicator::Split on the NCCL backend, through the fake NCCL seam: children of an NCCL
// communicator are NCCL communicators built with the parent's seams, and their device
// collectives sum within each group only.
#include <memory>
#include <vector>

#include "adaptcomm/communicator.h"
#include "gtest/gtest.h"
#include "lib/core/communicator/communicator_factory.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;

TEST(NcclSplit, ChildrenAreNcclCommunicatorsOfTheirGroupOnly) {
  constexpr int kWorld = 4;
  constexpr size_t kCount = 256;
  auto world = testing::MakeFakeNcclWorld();
  std::vector<std::shared_ptr<FakeNcclApi>> fakes;
  for (int r = 0; r < kWorld; ++r) {
    fakes.push_back(std::make_shared<FakeNcclApi>(world, FakeNcclFaults{}));
  }
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.backend = BackendChoice::kNccl;
        internal::CommunicatorDeps deps;
        deps.use_given_apis = true;
        deps.cuda = fakes[static_cast<size_t>(env.rank)];
        deps.nccl = fakes[static_cast<size_t>(env.rank)];
        auto parent = internal::CreateCommunicatorWith(o, deps);
        ASSERT_TRUE(parent.ok()) << parent.status();
        const int color = env.rank / 2;  // {0, 1} and {2, 3}
        SplitOptions split;
        split.backend = BackendChoice::kNccl;
        auto child = (*parent)->Split(color, env.rank, split);
        ASSERT_TRUE(child.ok()) << child.status();
        ASSERT_NE(*child, nullptr);
        EXPECT_STREQ((*child)->backend_name(), "nccl");
        EXPECT_EQ((*child)->size(), 2);
        EXPECT_EQ((*child)->rank(), env.rank % 2);
        std::vector<float> x(kCount);
        for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(env.rank * 100 + i);
        ASSERT_TRUE((*child)
                        ->Allreduce(TensorView{x.data(), kCount, DType::kF32, Device::Cuda(0)})
                        .Synchronize(absl::Seconds(20))
                        .ok());
        for (size_t i = 0; i < kCount; ++i) {
          const float want = static_cast<float>((2 * color) * 100 + i + (2 * color + 1) * 100 + i);
          ASSERT_EQ(x[i], want) << "rank " << env.rank << " element " << i;
        }
        child->reset();
      },
      absl::Seconds(60));
}

}  // namespace
}  // namespace adaptcomm

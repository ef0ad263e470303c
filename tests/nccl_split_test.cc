// Communicator::Split on the NCCL backend, through the fake NCCL seam: children of an NCCL
// communicator are NCCL communicators built with the parent's seams by ncclCommSplit (no unique
// id, no fresh init) where every rank of the parent can split, and their device collectives sum
// within each group only. Where some rank cannot, or a split fails, the children init afresh.
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "adaptcomm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/nccl/nccl_api.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::ElementsAre;
using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::Pair;

constexpr size_t kCount = 256;

std::vector<std::shared_ptr<FakeNcclApi>> Fakes(int world_size,
                                                std::vector<FakeNcclFaults> faults = {}) {
  auto world = testing::MakeFakeNcclWorld();
  faults.resize(static_cast<size_t>(world_size));
  std::vector<std::shared_ptr<FakeNcclApi>> fakes;
  for (int r = 0; r < world_size; ++r) {
    fakes.push_back(std::make_shared<FakeNcclApi>(world, faults[static_cast<size_t>(r)]));
  }
  return fakes;
}

// Runs body(env, fake, parent) on each of `fakes.size()` thread ranks, `parent` an NCCL
// communicator on that rank's fake.
template <typename Body>
void OnNcclParents(const std::vector<std::shared_ptr<FakeNcclApi>>& fakes, Body&& body) {
  testing::RunRanks(
      testing::RankMode::kThreads, static_cast<int>(fakes.size()),
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.backend = BackendChoice::kNccl;
        const std::shared_ptr<FakeNcclApi>& fake = fakes[static_cast<size_t>(env.rank)];
        auto parent = internal::CreateCommunicatorWith(o, testing::FakeSeams(fake));
        ASSERT_TRUE(parent.ok()) << parent.status();
        body(env, *fake, **parent);
      },
      absl::Seconds(60));
}

// A device allreduce on `child` whose ranks are `parent_ranks` (child rank order): element i of
// parent rank p contributes p * 100 + i.
void ExpectChildSum(Communicator& child, int parent_rank, const std::vector<int>& parent_ranks) {
  std::vector<float> x(kCount);
  for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(parent_rank * 100 + i);
  ASSERT_TRUE(child.Allreduce(TensorView{x.data(), kCount, DType::kF32, Device::Cuda(0)})
                  .Synchronize(absl::Seconds(20))
                  .ok());
  for (size_t i = 0; i < kCount; ++i) {
    float want = 0;
    for (int p : parent_ranks) want += static_cast<float>(p * 100 + i);
    ASSERT_EQ(x[i], want) << "parent rank " << parent_rank << " element " << i;
  }
}

TEST(NcclSplit, ChildrenComeFromNcclCommSplitOfTheirGroupOnly) {
  constexpr int kWorld = 4;
  auto fakes = Fakes(kWorld);
  OnNcclParents(fakes, [&](const testing::RankEnv& env, FakeNcclApi& fake, Communicator& parent) {
    const int color = env.rank / 2;  // {0, 1} and {2, 3}
    auto child = parent.Split(color, env.rank);
    ASSERT_TRUE(child.ok()) << child.status();
    ASSERT_NE(*child, nullptr);
    EXPECT_STREQ((*child)->backend_name(), "nccl");
    EXPECT_EQ((*child)->size(), 2);
    EXPECT_EQ((*child)->rank(), env.rank % 2);
    ExpectChildSum(**child, env.rank, {2 * color, 2 * color + 1});
    // One ncclCommSplit with this rank's color and key; the parent's init is the only one.
    EXPECT_THAT(fake.split_args(), ElementsAre(Pair(color, env.rank)));
    EXPECT_EQ(fake.init_calls(), 1);
    EXPECT_THAT((*child)->selection_reason(), ::testing::HasSubstr("ncclCommSplit"));
    child->reset();
  });
}

// A rank without a color takes part in ncclCommSplit (a collective over the parent) and gets no
// child; keys order the child's ranks before parent ranks do.
TEST(NcclSplit, NoColorTakesPartAndKeysOrderTheChild) {
  constexpr int kWorld = 3;
  auto fakes = Fakes(kWorld);
  OnNcclParents(fakes, [&](const testing::RankEnv& env, FakeNcclApi& fake, Communicator& parent) {
    const int color = env.rank == 2 ? Communicator::kNoColor : 7;
    auto child = parent.Split(color, /*key=*/10 - env.rank);
    ASSERT_TRUE(child.ok()) << child.status();
    ASSERT_EQ(fake.split_args().size(), 1u);
    EXPECT_EQ(fake.split_args()[0].first, env.rank == 2 ? nccl::kSplitNoColor : 7);
    if (env.rank == 2) {
      EXPECT_EQ(*child, nullptr);
      return;
    }
    ASSERT_NE(*child, nullptr);
    EXPECT_EQ((*child)->rank(), 1 - env.rank);  // key 10 before key 9: rank 1 first
    ExpectChildSum(**child, env.rank, {1, 0});
    EXPECT_EQ(fake.init_calls(), 1);
    child->reset();
  });
}

// A child asked on Gloo: no rank splits the NCCL communicator.
TEST(NcclSplit, AChildOnAnotherBackendSplitsNothing) {
  constexpr int kWorld = 2;
  auto fakes = Fakes(kWorld);
  OnNcclParents(fakes, [&](const testing::RankEnv& env, FakeNcclApi& fake, Communicator& parent) {
    SplitOptions split;
    split.backend = BackendChoice::kGloo;
    auto child = parent.Split(0, env.rank, split);
    ASSERT_TRUE(child.ok()) << child.status();
    ASSERT_NE(*child, nullptr);
    EXPECT_THAT((*child)->backend_name(), ::testing::StartsWith("gloo"));
    EXPECT_EQ(fake.split_calls(), 0);
    child->reset();
  });
}

// One rank's NCCL has no ncclCommSplit: no rank splits (it is a collective over the parent), and
// the children init NCCL afresh; one rank's split fails: its child's ranks agree to init afresh.
TEST(NcclSplit, WhereARankCannotSplitOrItsSplitFailsTheChildInitsAfresh) {
  constexpr int kWorld = 4;
  for (const bool missing_symbol : {true, false}) {
    SCOPED_TRACE(missing_symbol ? "rank 3 has no ncclCommSplit" : "rank 3's split fails");
    std::vector<FakeNcclFaults> faults(kWorld);
    if (missing_symbol) {
      faults[3].has_comm_split = false;
    } else {
      faults[3].split_fails = true;
    }
    auto fakes = Fakes(kWorld, faults);
    OnNcclParents(fakes, [&](const testing::RankEnv& env, FakeNcclApi& fake, Communicator& parent) {
      const int color = env.rank / 2;
      auto child = parent.Split(color, env.rank);
      ASSERT_TRUE(child.ok()) << child.status();
      ASSERT_NE(*child, nullptr);
      EXPECT_STREQ((*child)->backend_name(), "nccl");
      ExpectChildSum(**child, env.rank, {2 * color, 2 * color + 1});
      EXPECT_EQ(fake.split_calls(), missing_symbol ? 0 : 1);
      // Ranks 0 and 1 split and built their child on it; ranks 2 and 3 init afresh, and so
      // do all four when rank 3 could not split at all.
      const bool fresh = missing_symbol || color == 1;
      EXPECT_EQ(fake.init_calls(), fresh ? 2 : 1) << "rank " << env.rank;
      EXPECT_EQ(absl::StrContains((*child)->selection_reason(), "ncclCommSplit"), !fresh);
      child->reset();
    });
  }
}

}  // namespace
}  // namespace adaptcomm

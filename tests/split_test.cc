// Communicator::Split: MPI_Comm_split's grouping and ordering, children that run their own
// collectives in any order relative to each other, kNoColor, and a split some rank never joins.
#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::RankEnv;
using testing::RankMode;

TEST(Split, RanksOfAColorFormAChildOrderedByKey) {
  constexpr int kWorld = 4;
  constexpr size_t kCount = 1000;
  testing::RunRanks(RankMode::kThreads, kWorld, [&](const RankEnv& env) {
    auto parent = Communicator::Create(env.options);
    ASSERT_TRUE(parent.ok()) << parent.status();
    // Colors 0 and 1 by parity; keys reverse the parent's order.
    const int color = env.rank % 2;
    auto child = (*parent)->Split(color, -env.rank);
    ASSERT_TRUE(child.ok()) << child.status();
    ASSERT_NE(*child, nullptr);
    EXPECT_EQ((*child)->size(), 2);
    EXPECT_EQ((*child)->rank(), env.rank < 2 ? 1 : 0) << "rank " << env.rank;
    std::vector<float> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(env.rank + 1) + i * 0.5f;
    ASSERT_TRUE((*child)->Allreduce(HostView(x.data(), kCount)).Wait().ok());
    const float ranks_sum = color == 0 ? 1 + 3 : 2 + 4;  // (rank + 1) over the color's ranks
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(x[i], ranks_sum + 2 * (i * 0.5f)) << "rank " << env.rank << " element " << i;
    }
    // Its flight record is its own file, in a folder named after it.
    absl::StatusOr<std::string> dump = (*child)->DumpFlightRecord("split test");
    ASSERT_TRUE(dump.ok()) << dump.status();
    EXPECT_THAT(*dump, HasSubstr(absl::StrCat("split1.color", color, "/flight.rank")));
    // The parent still works, with its own sequence.
    float one = 1;
    ASSERT_TRUE((*parent)->Allreduce(HostView(&one, 1)).Wait().ok());
    EXPECT_EQ(one, kWorld);
    child->reset();
  });
}

// A 2 x 2 grid: every rank is in a row and a column communicator. Even ranks issue the row's
// allreduce first, odd ranks the column's: each group progresses on its own (no deadlock), and
// every sum is exact.
TEST(Split, TwoGroupsIssuedInDifferentOrdersOnDifferentRanksBothComplete) {
  constexpr int kWorld = 4;
  testing::RunRanks(
      RankMode::kThreads, kWorld,
      [&](const RankEnv& env) {
        auto parent = Communicator::Create(env.options);
        ASSERT_TRUE(parent.ok()) << parent.status();
        const int row = env.rank / 2, col = env.rank % 2;
        auto rows = (*parent)->Split(row, env.rank);
        auto cols = (*parent)->Split(col, env.rank);
        ASSERT_TRUE(rows.ok() && cols.ok()) << rows.status() << " " << cols.status();
        for (int round = 0; round < 20; ++round) {
          float r = static_cast<float>(env.rank + round), c = static_cast<float>(10 * env.rank);
          Work first, second;
          if (env.rank % 2 == 0) {
            first = (*rows)->Allreduce(HostView(&r, 1));
            second = (*cols)->Allreduce(HostView(&c, 1));
          } else {
            first = (*cols)->Allreduce(HostView(&c, 1));
            second = (*rows)->Allreduce(HostView(&r, 1));
          }
          ASSERT_TRUE(first.Wait(absl::Seconds(20)).ok()) << "rank " << env.rank;
          ASSERT_TRUE(second.Wait(absl::Seconds(20)).ok()) << "rank " << env.rank;
          EXPECT_EQ(r, static_cast<float>(4 * row + 1 + 2 * round)) << "rank " << env.rank;
          EXPECT_EQ(c, static_cast<float>(10 * (col + col + 2))) << "rank " << env.rank;
        }
        rows->reset();
        cols->reset();
      },
      absl::Seconds(90));
}

TEST(Split, NoColorTakesPartAndGetsNoChild) {
  testing::RunRanks(RankMode::kThreads, 3, [&](const RankEnv& env) {
    auto parent = Communicator::Create(env.options);
    ASSERT_TRUE(parent.ok()) << parent.status();
    auto child = (*parent)->Split(env.rank == 2 ? Communicator::kNoColor : 7, 0);
    ASSERT_TRUE(child.ok()) << child.status();
    if (env.rank == 2) {
      EXPECT_EQ(*child, nullptr);
      return;
    }
    ASSERT_NE(*child, nullptr);
    EXPECT_EQ((*child)->size(), 2);
    EXPECT_EQ((*child)->rank(), env.rank);
    float x = 1;
    ASSERT_TRUE((*child)->Allreduce(HostView(&x, 1)).Wait().ok());
    EXPECT_EQ(x, 2.0f);
    child->reset();
  });
  testing::RunRanks(RankMode::kThreads, 1, [&](const RankEnv& env) {
    auto parent = Communicator::Create(env.options);
    ASSERT_TRUE(parent.ok()) << parent.status();
    auto bad = (*parent)->Split(-5, 0);
    EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  });
}

// Rank 2 never calls Split: the others fail within the init timeout, naming it.
TEST(Split, SplitThatOneRankSkipsFailsTheOthersNamingIt) {
  std::atomic<int> done{0};
  testing::RunRanks(
      RankMode::kThreads, 3,
      [&](const RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.init_timeout = absl::Seconds(2);
        auto parent = Communicator::Create(o);
        ASSERT_TRUE(parent.ok()) << parent.status();
        if (env.rank == 2) {
          while (done.load() < 2) absl::SleepFor(absl::Milliseconds(10));
          return;
        }
        const absl::Time start = absl::Now();
        auto child = (*parent)->Split(0, 0);
        EXPECT_LT(absl::Now() - start, absl::Seconds(6));
        EXPECT_FALSE(child.ok());
        EXPECT_THAT(std::string(child.status().message()), HasSubstr("rank 2 did not call split"));
        done.fetch_add(1);
      },
      absl::Seconds(60));
}

// The tensor x pipeline x data grid of 8 ranks (2 x 2 x 2): three splits, each child of the
// expected size, built in well under the creation bound (the time is printed for the record).
TEST(Split, ThreeDimensionalGridOfEightRanks) {
  constexpr int kWorld = 8;
  testing::RunRanks(
      RankMode::kThreads, kWorld,
      [&](const RankEnv& env) {
        auto parent = Communicator::Create(env.options);
        ASSERT_TRUE(parent.ok()) << parent.status();
        const absl::Time start = absl::Now();
        // rank = ((data * 2) + pipeline) * 2 + tensor
        const int tp = env.rank % 2, pp = (env.rank / 2) % 2, dp = env.rank / 4;
        auto tensor = (*parent)->Split(dp * 2 + pp, tp);  // same data and pipeline index
        auto pipeline = (*parent)->Split(dp * 2 + tp, pp);
        auto data = (*parent)->Split(pp * 2 + tp, dp);
        const absl::Duration took = absl::Now() - start;
        ASSERT_TRUE(tensor.ok() && pipeline.ok() && data.ok());
        EXPECT_EQ((*tensor)->rank(), tp);
        EXPECT_EQ((*pipeline)->rank(), pp);
        EXPECT_EQ((*data)->rank(), dp);
        float t = 1, p = 1, d = 1;
        ASSERT_TRUE((*tensor)->Allreduce(HostView(&t, 1)).Wait().ok());
        ASSERT_TRUE((*pipeline)->Allreduce(HostView(&p, 1)).Wait().ok());
        ASSERT_TRUE((*data)->Allreduce(HostView(&d, 1)).Wait().ok());
        EXPECT_EQ(t + p + d, 6.0f);
        if (env.rank == 0) {
          std::printf("3D grid of %d ranks (threads): three splits took %s on rank 0\n", kWorld,
                      absl::FormatDuration(took).c_str());
        }
        EXPECT_LT(took, absl::Seconds(30));
        tensor->reset();
        pipeline->reset();
        data->reset();
      },
      absl::Seconds(120));
}

}  // namespace
}  // namespace adaptcomm

// The store all-gather (lib/base/store_allgather.h) and the store traffic of creating a
// communicator: O(1) requests per rank whatever the world size, each rank's keys read by at most
// one other rank. Ranks are threads of this process sharing a HashStore.
#include "lib/base/store_allgather.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/store.h"
#include "tests/counting_store.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using internal::AllGatherThroughStore;
using internal::StoreGathered;
using testing::CountingStore;
using ::testing::HasSubstr;

std::vector<std::shared_ptr<CountingStore>> CountingViews(int n, std::shared_ptr<Store> shared) {
  std::vector<std::shared_ptr<CountingStore>> views;
  for (int r = 0; r < n; ++r) views.push_back(std::make_shared<CountingStore>(shared));
  return views;
}

// Values with the separator, a NUL and nothing at all come back byte for byte, in rank order,
// on every rank; each rank makes 3 requests and the completing rank one more (every value in one
// MultiGet, which Redis serves as one MGET).
TEST(StoreAllGatherTest, EveryRankGetsEveryValueInRankOrder) {
  constexpr int kRanks = 9;
  auto views = CountingViews(kRanks, CreateHashStore());
  auto value = [](int r) {
    return r == 3 ? std::string() : absl::StrCat("r", r, ":x", std::string(1, '\0'), r);
  };
  std::vector<StoreGathered> got(kRanks);
  testing::OnThreads(kRanks, [&](int r) {
    absl::StatusOr<StoreGathered> g = AllGatherThroughStore(*views[r], "ex/", r, kRanks, value(r),
                                                            absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(g.ok()) << g.status();
    got[r] = *std::move(g);
  });
  int completing = 0;
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].complete) << "rank " << r;
    ASSERT_EQ(got[r].values.size(), static_cast<size_t>(kRanks));
    for (int q = 0; q < kRanks; ++q) {
      ASSERT_TRUE(got[r].values[q].has_value());
      EXPECT_EQ(*got[r].values[q], value(q)) << "rank " << r << " of rank " << q;
    }
    if (views[r]->calls() == 4) {
      ++completing;
      EXPECT_EQ(views[r]->sets(), 2);  // its value and the gathered values
    } else {
      EXPECT_EQ(views[r]->calls(), 3) << "rank " << r;
    }
  }
  EXPECT_EQ(completing, 1);
}

// Past 16 ranks, arrivals are counted in groups of 16 (a compare-and-swap add, as etcd's, costs
// the square of the ranks adding to one key): 40 ranks are groups of 16, 16 and 8. The last of
// each group makes one more request, and one rank completes the exchange.
TEST(StoreAllGatherTest, ManyRanksCountTheirArrivalsInGroups) {
  constexpr int kRanks = 40;
  auto shared = CreateHashStore();
  auto views = CountingViews(kRanks, shared);
  std::vector<StoreGathered> got(kRanks);
  testing::OnThreads(kRanks, [&](int r) {
    absl::StatusOr<StoreGathered> g = AllGatherThroughStore(
        *views[r], "grp/", r, kRanks, absl::StrCat("v", r), absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(g.ok()) << g.status();
    got[r] = *std::move(g);
  });
  std::map<int, int> ranks_by_calls;
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].complete) << "rank " << r;
    for (int q = 0; q < kRanks; ++q) {
      EXPECT_EQ(got[r].values[q].value_or("?"), absl::StrCat("v", q)) << "rank " << r;
    }
    ++ranks_by_calls[views[r]->calls()];
  }
  // 3 requests each; the two group-last ranks that did not complete 4; the completing rank 5
  // (its group's count, the top count, the MultiGet and the publishing set).
  EXPECT_EQ(ranks_by_calls, (std::map<int, int>{{3, 37}, {4, 2}, {5, 1}}));
  for (int g = 0; g < 3; ++g) {
    EXPECT_EQ(*shared->Get(absl::StrCat("grp/count/", g), absl::ZeroDuration()),
              g < 2 ? "16" : "8");
  }
  EXPECT_EQ(*shared->Get("grp/count", absl::ZeroDuration()), "3");
  // The same prefix again: refused by the first group count it overflows.
  absl::StatusOr<StoreGathered> again =
      AllGatherThroughStore(*shared, "grp/", 5, kRanks, "x", absl::Now() + absl::Seconds(5));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()),
              ::testing::AllOf(HasSubstr("two exchanges share"), HasSubstr("grp/count/0")));
}

// A rank that never comes: the others return within their deadline, not complete, naming it.
TEST(StoreAllGatherTest, ARankThatNeverComesIsNamedAtTheDeadline) {
  constexpr int kRanks = 4;
  auto store = CreateHashStore();
  std::vector<StoreGathered> got(kRanks);
  const absl::Time start = absl::Now();
  testing::OnThreads(kRanks, [&](int r) {
    if (r == 2) return;
    absl::StatusOr<StoreGathered> g =
        AllGatherThroughStore(*store, "late/", r, kRanks, "v", start + absl::Milliseconds(300));
    ASSERT_TRUE(g.ok()) << g.status();
    got[r] = *std::move(g);
  });
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(290));
  EXPECT_LT(took, absl::Seconds(3));
  for (int r : {0, 1, 3}) {
    EXPECT_FALSE(got[r].complete);
    EXPECT_EQ(got[r].Missing(), std::vector<int>{2});
    EXPECT_EQ(got[r].DescribeMissing(), "rank 2");
    EXPECT_EQ(got[r].values[1].value_or("?"), "v");
  }
}

// The completing rank died between its count and publishing the values: a waiting rank finds
// every value on its slow path at the deadline and completes.
TEST(StoreAllGatherTest, EveryValueInButNeverGatheredStillCompletes) {
  auto store = CreateHashStore();
  auto view = std::make_shared<CountingStore>(store);
  absl::StatusOr<StoreGathered> got = absl::UnknownError("not run");
  std::thread waiting([&] {
    got = AllGatherThroughStore(*view, "gone/", 0, 2, "a", absl::Now() + absl::Milliseconds(400));
  });
  absl::SleepFor(absl::Milliseconds(100));
  // Rank 1 as it would be had it died right after completing the count.
  ASSERT_TRUE(store->Set("gone/1", "b").ok());
  ASSERT_TRUE(store->Add("gone/count", 1).ok());
  waiting.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->complete);
  EXPECT_EQ(got->values[0].value_or("?"), "a");
  EXPECT_EQ(got->values[1].value_or("?"), "b");
  EXPECT_FALSE(store->Get("gone/all", absl::ZeroDuration()).ok());
  // Its value, its count, the wait for the gathered values, then every value in one read.
  EXPECT_EQ(view->calls(), 4);
}

TEST(StoreAllGatherTest, APrefixUsedTwiceIsRefused) {
  auto store = CreateHashStore();
  testing::OnThreads(2, [&](int r) {
    EXPECT_TRUE(
        AllGatherThroughStore(*store, "twice/", r, 2, "x", absl::Now() + absl::Seconds(5)).ok());
  });
  absl::StatusOr<StoreGathered> again =
      AllGatherThroughStore(*store, "twice/", 0, 2, "x", absl::Now() + absl::Seconds(5));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("two exchanges share"));
}

TEST(StoreAllGatherTest, ARankOutsideTheWorldIsRefused) {
  auto store = CreateHashStore();
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  for (auto [rank, world] : {std::pair{2, 2}, std::pair{-1, 2}, std::pair{0, 0}}) {
    absl::StatusOr<StoreGathered> g =
        AllGatherThroughStore(*store, "bad/", rank, world, "x", deadline);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << rank << " of " << world;
  }
  EXPECT_FALSE(store->Get("bad/count", absl::ZeroDuration()).ok());  // nothing written
}

TEST(StoreAllGatherTest, MalformedGatheredValuesAreAnError) {
  EXPECT_FALSE(internal::DecodeGathered("3:ab", 1).ok());
  EXPECT_FALSE(internal::DecodeGathered("x:ab", 1).ok());
  EXPECT_FALSE(internal::DecodeGathered("1:a1:b", 3).ok());
  absl::StatusOr<std::vector<std::string>> ok = internal::DecodeGathered("1:a0:2:b:", 3);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, (std::vector<std::string>{"a", "", "b:"}));
}

// Creating a Gloo communicator, counted per rank at two world sizes (then one checked allreduce).
struct Traffic {
  double mean_calls = 0;
  int max_readers = 0;  // of any key but the gathered values ("…/all"), by ranks other than its
                        // writer
  std::string busiest_key;
};

Traffic CreationTraffic(int ranks) {
  auto views = CountingViews(ranks, CreateHashStore());
  // At the end of creation (the allreduce after it connects what its algorithm needs, which for
  // a small one on 16 ranks is bcube's log2 N peers: Gloo's share, counted in lazy_connect_test).
  std::vector<int> created_calls(static_cast<size_t>(ranks));
  std::vector<std::set<std::string>> created_read(static_cast<size_t>(ranks));
  testing::OnThreads(ranks, [&](int r) {
    CommunicatorOptions o;
    o.name = "traffic";
    o.rank = r;
    o.world_size = ranks;
    o.store = views[r];
    o.backend = BackendChoice::kGloo;
    o.init_timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<Communicator>> c = Communicator::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    created_calls[static_cast<size_t>(r)] = views[r]->calls();
    created_read[static_cast<size_t>(r)] = views[r]->read();
    std::vector<float> v(64, 1.0f);
    ASSERT_TRUE((*c)->Allreduce(HostView(v.data(), v.size())).Wait().ok());
    EXPECT_EQ(v[63], static_cast<float>(ranks));
  });
  Traffic t;
  std::map<std::string, int> readers;
  int calls = 0;
  for (int r = 0; r < ranks; ++r) {
    calls += created_calls[static_cast<size_t>(r)];
    for (const std::string& key : created_read[static_cast<size_t>(r)]) {
      // A rank reading its own key (a claim it holds) is no traffic between ranks.
      if (!absl::EndsWith(key, absl::StrCat("/", r))) ++readers[key];
    }
  }
  t.mean_calls = static_cast<double>(calls) / ranks;
  for (const auto& [key, n] : readers) {
    if (absl::EndsWith(key, "/all") || n <= t.max_readers) continue;
    t.max_readers = n;
    t.busiest_key = key;
  }
  return t;
}

// The requests per rank do not grow with the world, and every per-rank key is read by at most
// one other rank (only the gathered values are read by all).
TEST(StoreAllGatherTest, CreatingACommunicatorCostsConstantStoreRequestsPerRank) {
  const Traffic small = CreationTraffic(4);
  const Traffic large = CreationTraffic(16);
  EXPECT_LE(large.mean_calls, small.mean_calls + 2)
      << "4 ranks: " << small.mean_calls << " per rank, 16 ranks: " << large.mean_calls;
  EXPECT_LE(large.max_readers, 1) << large.busiest_key;
  EXPECT_LE(small.max_readers, 1) << small.busiest_key;
}

}  // namespace
}  // namespace adaptcomm

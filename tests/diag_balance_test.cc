// BalancePartitions (Karmarkar-Karp) against brute force and the greedy baseline.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "adaptcomm/balance.h"
#include "gtest/gtest.h"

namespace adaptcomm {
namespace {

int64_t MaxSum(const Partitioning& p) { return *std::max_element(p.sums.begin(), p.sums.end()); }

// Every index exactly once, sums right, imbalance = max/mean, sizes within one when asked.
void ExpectValid(const std::vector<int64_t>& lengths, int parts, bool equal_sizes,
                 const Partitioning& p) {
  ASSERT_EQ(p.groups.size(), static_cast<size_t>(parts));
  ASSERT_EQ(p.sums.size(), static_cast<size_t>(parts));
  std::vector<int> seen(lengths.size(), 0);
  int64_t total = 0;
  size_t min_size = lengths.size(), max_size = 0;
  for (int g = 0; g < parts; ++g) {
    int64_t sum = 0;
    for (size_t i : p.groups[g]) {
      ASSERT_LT(i, lengths.size());
      ++seen[i];
      sum += lengths[i];
    }
    EXPECT_TRUE(std::is_sorted(p.groups[g].begin(), p.groups[g].end()));
    EXPECT_EQ(sum, p.sums[g]) << "group " << g;
    total += sum;
    min_size = std::min(min_size, p.groups[g].size());
    max_size = std::max(max_size, p.groups[g].size());
  }
  for (size_t i = 0; i < lengths.size(); ++i) EXPECT_EQ(seen[i], 1) << "index " << i;
  if (total > 0) {
    EXPECT_NEAR(p.imbalance, static_cast<double>(MaxSum(p)) * parts / static_cast<double>(total),
                1e-12);
  } else {
    EXPECT_EQ(p.imbalance, 1.0);
  }
  if (equal_sizes) {
    EXPECT_LE(max_size - min_size, 1u);
  }
}

// Smallest possible max group sum over all k^n assignments (with the size rule when asked).
int64_t BruteForceOptimum(const std::vector<int64_t>& lengths, int parts, bool equal_sizes) {
  const size_t n = lengths.size();
  const size_t base = n / parts, extra = n % parts;
  size_t combos = 1;
  for (size_t i = 0; i < n; ++i) combos *= parts;
  int64_t best = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> sums(parts);
  std::vector<size_t> counts(parts);
  for (size_t c = 0; c < combos; ++c) {
    std::fill(sums.begin(), sums.end(), 0);
    std::fill(counts.begin(), counts.end(), 0);
    size_t code = c;
    for (size_t i = 0; i < n; ++i) {
      sums[code % parts] += lengths[i];
      ++counts[code % parts];
      code /= parts;
    }
    if (equal_sizes) {
      size_t big = 0;
      bool ok = true;
      for (size_t cnt : counts) {
        if (cnt == base + 1 && extra > 0) {
          ++big;
        } else if (cnt != base) {
          ok = false;
        }
      }
      if (!ok || big != extra) continue;
    }
    best = std::min(best, *std::max_element(sums.begin(), sums.end()));
  }
  return best;
}

std::vector<int64_t> RandomLengths(std::mt19937_64& rng, size_t n, int64_t max_len) {
  std::uniform_int_distribution<int64_t> dist(1, max_len);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// RL rollout lengths are roughly log-normal: many short answers, a long tail of long ones.
std::vector<int64_t> LogNormalLengths(std::mt19937_64& rng, size_t n) {
  std::lognormal_distribution<double> dist(6.5, 0.9);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = std::clamp<int64_t>(static_cast<int64_t>(dist(rng)), 16, 32768);
  return v;
}

TEST(BalancePartitionsTest, RejectsBadArguments) {
  EXPECT_EQ(BalancePartitions({1, 2}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BalancePartitions({1, -2}, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GreedyPartitions({1, 2}, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BalancePartitionsTest, EmptyInputAndZeroLengths) {
  auto empty = BalancePartitions({}, 3);
  ASSERT_TRUE(empty.ok());
  ExpectValid({}, 3, false, *empty);
  auto zeros = BalancePartitions({0, 0, 0, 0}, 2, true);
  ASSERT_TRUE(zeros.ok());
  ExpectValid({0, 0, 0, 0}, 2, true, *zeros);
  EXPECT_EQ(zeros->imbalance, 1.0);
}

TEST(BalancePartitionsTest, MorePartsThanSequencesLeavesEmptyGroups) {
  std::vector<int64_t> lengths = {5, 9};
  auto r = BalancePartitions(lengths, 4);
  ASSERT_TRUE(r.ok());
  ExpectValid(lengths, 4, false, *r);
  EXPECT_EQ(MaxSum(*r), 9);
  EXPECT_DOUBLE_EQ(r->imbalance, 9.0 / (14.0 / 4.0));
}

// The textbook example: plain differencing ends at 16/14 while {8,7} vs {6,5,4} is perfect; the
// swap refinement after it must find the perfect split.
TEST(BalancePartitionsTest, TwoWayTextbookExample) {
  std::vector<int64_t> lengths = {8, 7, 6, 5, 4};
  auto r = BalancePartitions(lengths, 2);
  ASSERT_TRUE(r.ok());
  ExpectValid(lengths, 2, false, *r);
  std::vector<int64_t> sums = r->sums;
  std::sort(sums.begin(), sums.end());
  EXPECT_EQ(sums, (std::vector<int64_t>{15, 15}));
}

TEST(BalancePartitionsTest, PerfectSplitFound) {
  std::vector<int64_t> lengths = {10, 10, 10, 10, 10, 10};
  auto r = BalancePartitions(lengths, 3, true);
  ASSERT_TRUE(r.ok());
  ExpectValid(lengths, 3, true, *r);
  EXPECT_EQ(r->sums, (std::vector<int64_t>{20, 20, 20}));
  EXPECT_EQ(r->imbalance, 1.0);
}

// Michiels et al. (2007): KK's max part is at most (4/3 - 1/(3k)) times the optimum. A theorem,
// so it must hold on every input.
TEST(BalancePartitionsTest, WithinProvenBoundOfBruteForce) {
  std::mt19937_64 rng(7);
  int optimal_hits = 0, cases = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int parts = 2 + trial % 2;
    const size_t n = 1 + trial % 8;
    auto lengths = RandomLengths(rng, n, trial % 3 == 0 ? 10 : 1000);
    auto r = BalancePartitions(lengths, parts);
    ASSERT_TRUE(r.ok());
    ExpectValid(lengths, parts, false, *r);
    const int64_t opt = BruteForceOptimum(lengths, parts, false);
    const double bound = 4.0 / 3.0 - 1.0 / (3.0 * parts);
    EXPECT_LE(static_cast<double>(MaxSum(*r)), bound * static_cast<double>(opt) + 1e-9)
        << "trial " << trial;
    EXPECT_GE(MaxSum(*r), opt);
    optimal_hits += MaxSum(*r) == opt;
    ++cases;
  }
  // Not a theorem, a sanity check that this is a strong heuristic: optimal on most tiny inputs.
  EXPECT_GT(optimal_hits, cases * 3 / 4);
}

// With equal group sizes no worst-case ratio is proven for k-way KK; the tolerance (10% above
// the constrained optimum) is an observed property of these seeded cases (worst seen: 1.03x).
TEST(BalancePartitionsTest, EqualSizesCloseToConstrainedBruteForce) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int parts = 2 + trial % 2;
    const size_t n = 2 + trial % 7;
    auto lengths = RandomLengths(rng, n, 1000);
    auto r = BalancePartitions(lengths, parts, true);
    ASSERT_TRUE(r.ok());
    ExpectValid(lengths, parts, true, *r);
    const int64_t opt = BruteForceOptimum(lengths, parts, true);
    EXPECT_GE(MaxSum(*r), opt);
    EXPECT_LE(static_cast<double>(MaxSum(*r)), 1.10 * static_cast<double>(opt))
        << "trial " << trial;
  }
}

TEST(GreedyPartitionsTest, ValidAndWithinGrahamBound) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int parts = 2 + trial % 2;
    const size_t n = 1 + trial % 8;
    auto lengths = RandomLengths(rng, n, 1000);
    for (bool equal : {false, true}) {
      auto g = GreedyPartitions(lengths, parts, equal);
      ASSERT_TRUE(g.ok());
      ExpectValid(lengths, parts, equal, *g);
    }
    // Graham's LPT bound, also a theorem.
    auto g = GreedyPartitions(lengths, parts);
    EXPECT_LE(static_cast<double>(MaxSum(*g)),
              (4.0 / 3.0 - 1.0 / (3.0 * parts)) * BruteForceOptimum(lengths, parts, false) + 1e-9);
  }
}

// Realistic batches (log-normal rollout lengths): KK balances to well under 1% and, summed over
// these seeds, is at least as balanced as greedy LPT.
TEST(BalancePartitionsTest, RolloutBatchesBeatGreedyOnAverage) {
  std::mt19937_64 rng(2024);
  for (bool equal : {false, true}) {
    double kk_total = 0, greedy_total = 0;
    for (int trial = 0; trial < 40; ++trial) {
      auto lengths = LogNormalLengths(rng, 256);
      auto kk = BalancePartitions(lengths, 8, equal);
      auto greedy = GreedyPartitions(lengths, 8, equal);
      ASSERT_TRUE(kk.ok());
      ASSERT_TRUE(greedy.ok());
      ExpectValid(lengths, 8, equal, *kk);
      EXPECT_LT(kk->imbalance, 1.01) << "trial " << trial << " equal " << equal;
      kk_total += kk->imbalance - 1.0;
      greedy_total += greedy->imbalance - 1.0;
    }
    EXPECT_LE(kk_total, greedy_total) << "equal sizes " << equal;
  }
}

TEST(BalancePartitionsTest, LargeBatchIsFast) {
  std::mt19937_64 rng(5);
  auto lengths = LogNormalLengths(rng, 100000);
  auto r = BalancePartitions(lengths, 64, true);
  ASSERT_TRUE(r.ok());
  ExpectValid(lengths, 64, true, *r);
  EXPECT_LT(r->imbalance, 1.001);
}

}  // namespace
}  // namespace adaptcomm

// Karmarkar-Karp largest differencing for k-way number partitioning, and the greedy baseline.
#include "adaptcomm/balance.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace adaptcomm {
namespace {

constexpr size_t kPadding = static_cast<size_t>(-1);  // index of a zero-length filler item

struct Subset {
  int64_t sum = 0;
  std::vector<size_t> items;
};

// A partial partition: `parts` subsets kept sorted by sum, descending.
struct State {
  std::vector<Subset> subsets;
  uint64_t order = 0;  // insertion order, for deterministic tie-breaking

  int64_t Spread() const { return subsets.front().sum - subsets.back().sum; }
};

void SortDescending(State& s) {
  std::stable_sort(s.subsets.begin(), s.subsets.end(),
                   [](const Subset& a, const Subset& b) { return a.sum > b.sum; });
}

// Appends the smaller item list onto the larger one so merging stays O(n log n) overall.
void Absorb(Subset& into, Subset&& from) {
  into.sum += from.sum;
  if (from.items.size() > into.items.size()) std::swap(into.items, from.items);
  into.items.insert(into.items.end(), from.items.begin(), from.items.end());
}

absl::Status Validate(const std::vector<int64_t>& lengths, int parts) {
  if (parts < 1) return absl::InvalidArgumentError(absl::StrCat("parts must be >= 1, got ", parts));
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("length ", i, " is negative (", lengths[i], ")"));
    }
  }
  return absl::OkStatus();
}

Partitioning Finish(std::vector<std::vector<size_t>> groups, const std::vector<int64_t>& lengths) {
  Partitioning out;
  out.sums.assign(groups.size(), 0);
  int64_t total = 0;
  for (size_t p = 0; p < groups.size(); ++p) {
    auto& g = groups[p];
    g.erase(std::remove(g.begin(), g.end(), kPadding), g.end());
    std::sort(g.begin(), g.end());
    for (size_t i : g) out.sums[p] += lengths[i];
    total += out.sums[p];
  }
  // Parts come out ordered by sum, heaviest first; that order carries no meaning for callers.
  out.groups = std::move(groups);
  if (total > 0) {
    const double mean = static_cast<double>(total) / static_cast<double>(out.sums.size());
    out.imbalance = static_cast<double>(*std::max_element(out.sums.begin(), out.sums.end())) / mean;
  }
  return out;
}

// Pairwise-swap refinement. Swaps keep group sizes, so it serves both modes; it matters most with
// equal sizes, where differencing seeded with k-item chunks leaves a long-tailed batch several
// percent off (one chunk of the longest sequences dominates its state's spread). Each accepted
// swap lowers the heaviest group without lifting another to its old sum, so the descending
// vector of sums falls lexicographically: the loop terminates, and is capped anyway.
void RefineBySwaps(std::vector<std::vector<size_t>>& groups, const std::vector<int64_t>& lengths) {
  const size_t k = groups.size();
  if (k < 2) return;
  auto len = [&](size_t i) { return i == kPadding ? int64_t{0} : lengths[i]; };
  std::vector<int64_t> sums(k, 0);
  for (size_t p = 0; p < k; ++p) {
    for (size_t i : groups[p]) sums[p] += len(i);
  }
  std::vector<size_t> order(k);
  std::vector<size_t> sorted_g;
  const size_t max_rounds = 16 + 4 * k;
  for (size_t round = 0; round < max_rounds; ++round) {
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sums[a] > sums[b]; });
    const size_t h = order[0];
    bool improved = false;
    // Lightest partner first: it offers the widest range of useful swaps.
    for (size_t o = k - 1; o > 0 && !improved; --o) {
      const size_t g = order[o];
      const int64_t gap = sums[h] - sums[g];
      if (gap <= 1) break;  // partners only get heavier from here
      sorted_g = groups[g];
      std::sort(sorted_g.begin(), sorted_g.end(),
                [&](size_t a, size_t b) { return len(a) < len(b); });
      // Moving d = len(a) - len(b) from h to g improves when 0 < d < gap; best near gap / 2.
      int64_t best_cost = gap;  // |2d - gap| must beat the current gap
      size_t best_a = 0, best_b = 0;
      for (size_t ai = 0; ai < groups[h].size(); ++ai) {
        if (groups[h][ai] == kPadding) continue;
        const int64_t la = len(groups[h][ai]);
        const int64_t target = la - gap / 2;
        auto it = std::lower_bound(sorted_g.begin(), sorted_g.end(), target,
                                   [&](size_t b, int64_t v) { return len(b) < v; });
        // The two lengths around the target: the first >= it and the last < it.
        for (auto cand : {it, it == sorted_g.begin() ? sorted_g.end() : it - 1}) {
          // A filler stands for "one sequence fewer": trading it would unbalance the counts.
          if (cand == sorted_g.end() || *cand == kPadding) continue;
          const int64_t d = la - len(*cand);
          if (d <= 0 || d >= gap) continue;
          const int64_t cost = std::abs(2 * d - gap);
          if (cost < best_cost) {
            best_cost = cost;
            best_a = ai;
            best_b = *cand;
          }
        }
      }
      if (best_cost < gap) {
        const size_t a = groups[h][best_a];
        auto bpos = std::find(groups[g].begin(), groups[g].end(), best_b);
        const int64_t d = len(a) - len(best_b);
        groups[h][best_a] = best_b;
        *bpos = a;
        sums[h] -= d;
        sums[g] += d;
        improved = true;
      }
    }
    if (!improved) return;
  }
}

}  // namespace

absl::StatusOr<Partitioning> BalancePartitions(const std::vector<int64_t>& lengths, int parts,
                                               bool equal_sizes) {
  if (absl::Status s = Validate(lengths, parts); !s.ok()) return s;
  const size_t k = static_cast<size_t>(parts);

  auto by_spread = [](const State& a, const State& b) {
    if (a.Spread() != b.Spread()) return a.Spread() < b.Spread();
    return a.order > b.order;  // earlier states first on ties
  };
  // A binary heap over a vector rather than std::priority_queue, whose top() cannot be moved from.
  std::vector<State> heap;
  auto push = [&](State&& s) {
    heap.push_back(std::move(s));
    std::push_heap(heap.begin(), heap.end(), by_spread);
  };
  auto pop = [&]() {
    std::pop_heap(heap.begin(), heap.end(), by_spread);
    State s = std::move(heap.back());
    heap.pop_back();
    return s;
  };
  uint64_t order = 0;

  if (equal_sizes) {
    // Seed states of k items each (one per subset), taken from the sorted lengths. Every subset of
    // every state then holds the same count, which merging preserves. Zero-length fillers make
    // the count a multiple of k; dropping them leaves group sizes differing by at most one.
    std::vector<size_t> idx(lengths.size());
    std::iota(idx.begin(), idx.end(), size_t{0});
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t a, size_t b) { return lengths[a] < lengths[b]; });
    while (idx.size() % k != 0) idx.insert(idx.begin(), kPadding);
    for (size_t start = 0; start < idx.size(); start += k) {
      State s;
      s.order = order++;
      s.subsets.resize(k);
      for (size_t j = 0; j < k; ++j) {
        const size_t i = idx[start + j];
        s.subsets[j].sum = i == kPadding ? 0 : lengths[i];
        s.subsets[j].items.push_back(i);
      }
      SortDescending(s);
      push(std::move(s));
    }
  } else {
    for (size_t i = 0; i < lengths.size(); ++i) {
      State s;
      s.order = order++;
      s.subsets.resize(k);
      s.subsets[0].sum = lengths[i];
      s.subsets[0].items.push_back(i);
      push(std::move(s));
    }
  }

  if (heap.empty()) return Finish(std::vector<std::vector<size_t>>(k), lengths);
  // Differencing: join the two states of largest spread, heaviest subset of one with the lightest
  // of the other, so their differences cancel.
  while (heap.size() > 1) {
    State a = pop();
    State b = pop();
    for (size_t j = 0; j < k; ++j) Absorb(a.subsets[j], std::move(b.subsets[k - 1 - j]));
    SortDescending(a);
    a.order = order++;
    push(std::move(a));
  }
  State last = pop();
  std::vector<std::vector<size_t>> groups(k);
  for (size_t j = 0; j < k; ++j) groups[j] = std::move(last.subsets[j].items);
  RefineBySwaps(groups, lengths);
  return Finish(std::move(groups), lengths);
}

absl::StatusOr<Partitioning> GreedyPartitions(const std::vector<int64_t>& lengths, int parts,
                                              bool equal_sizes) {
  if (absl::Status s = Validate(lengths, parts); !s.ok()) return s;
  const size_t k = static_cast<size_t>(parts);
  std::vector<size_t> idx(lengths.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  // With equal sizes, `extra` groups may hold base + 1 items and the rest base.
  const size_t base = lengths.size() / k;
  const size_t extra = lengths.size() % k;
  size_t big_groups = 0;
  std::vector<std::vector<size_t>> groups(k);
  std::vector<int64_t> sums(k, 0);
  for (size_t i : idx) {
    size_t best = k;
    for (size_t p = 0; p < k; ++p) {
      if (equal_sizes) {
        const size_t n = groups[p].size();
        const bool open = n < base || (n == base && big_groups < extra);
        if (!open) continue;
      }
      if (best == k || sums[p] < sums[best]) best = p;
    }
    if (equal_sizes && groups[best].size() == base) ++big_groups;
    groups[best].push_back(i);
    sums[best] += lengths[i];
  }
  return Finish(std::move(groups), lengths);
}

}  // namespace adaptcomm

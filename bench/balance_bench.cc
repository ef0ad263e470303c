// Sequence-length balancing: Karmarkar-Karp (+ swap refinement) against greedy LPT on batches
// shaped like RL rollouts (log-normal lengths, a long tail of long answers).
//
// Counters: `imbalance` = max/mean tokens per part, averaged over the batches (1.0 = perfect);
// `lag_tokens` = mean tokens by which the heaviest part exceeds the mean, i.e. what the slowest
// rank waits for in every step.
#include <cstdint>
#include <random>
#include <vector>

#include "adaptcomm/balance.h"
#include "benchmark/benchmark.h"

namespace {

constexpr int kBatches = 16;

std::vector<std::vector<int64_t>> MakeBatches(int n, double sigma) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> dist(6.5, sigma);
  std::vector<std::vector<int64_t>> batches(kBatches, std::vector<int64_t>(n));
  for (auto& b : batches) {
    for (auto& x : b) x = std::max<int64_t>(16, std::min<int64_t>(32768, dist(rng)));
  }
  return batches;
}

template <bool kKarmarkarKarp>
void BM_Balance(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int parts = static_cast<int>(state.range(1));
  const bool equal = state.range(2) != 0;
  const auto batches = MakeBatches(n, 1.0);
  double imbalance = 0, lag = 0;
  int64_t runs = 0;
  size_t next = 0;
  for (auto _ : state) {
    const auto& lengths = batches[next++ % kBatches];
    auto r = kKarmarkarKarp ? adaptcomm::BalancePartitions(lengths, parts, equal)
                            : adaptcomm::GreedyPartitions(lengths, parts, equal);
    if (!r.ok()) {
      state.SkipWithError("partitioning failed");
      return;
    }
    benchmark::DoNotOptimize(r->groups.data());
    imbalance += r->imbalance;
    int64_t total = 0, max_sum = 0;
    for (int64_t s : r->sums) {
      total += s;
      max_sum = std::max(max_sum, s);
    }
    lag += static_cast<double>(max_sum) - static_cast<double>(total) / parts;
    ++runs;
  }
  state.counters["imbalance"] = imbalance / static_cast<double>(runs);
  state.counters["lag_tokens"] = lag / static_cast<double>(runs);
  state.SetItemsProcessed(runs * n);
}

// {sequences per batch, parts, equal sizes}: a mini-batch over 8 ranks, a global batch over 64.
void Shapes(benchmark::internal::Benchmark* b) {
  for (int equal : {0, 1}) {
    b->Args({256, 8, equal});
    b->Args({1024, 64, equal});
    b->Args({8192, 64, equal});
  }
  b->ArgNames({"seqs", "parts", "equal"});
}

BENCHMARK(BM_Balance<true>)->Name("karmarkar_karp")->Apply(Shapes);
BENCHMARK(BM_Balance<false>)->Name("greedy_lpt")->Apply(Shapes);

}  // namespace

BENCHMARK_MAIN();

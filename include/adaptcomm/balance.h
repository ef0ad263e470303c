// Sequence-length balancing: split one batch of sequences over `parts` ranks (or micro-batches)
// so that every part carries nearly the same number of tokens and no rank lags behind the others
// in a collective.
//
//   std::vector<int64_t> lengths = {...};  // tokens per sequence
//   auto r = adaptcomm::BalancePartitions(lengths, /*parts=*/8);
//   if (!r.ok()) return r.status();
//   for (size_t index : r->groups[my_rank]) { ...sequence `index` goes to this rank... }
//
// Compiles as C++17: trainers include it.
#ifndef ADAPTCOMM_BALANCE_H_
#define ADAPTCOMM_BALANCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "adaptcomm/export.h"

namespace adaptcomm {

struct Partitioning {
  // groups[p] holds the indices into `lengths` assigned to part p, ascending. Every index appears
  // in exactly one group; a group may be empty when there are fewer sequences than parts.
  std::vector<std::vector<size_t>> groups;
  std::vector<int64_t> sums;  // sums[p] = total length of groups[p]
  // max(sums) / mean(sums): 1.0 is perfect balance; 1.0 when every length is zero.
  double imbalance = 1.0;
};

// Karmarkar-Karp largest differencing method, k-way. Its worst-case makespan is within
// 4/3 - 1/(3*parts) of the optimum (Michiels et al. 2007) and in practice far closer.
// With equal_sizes, every group gets the same number of sequences (differing by at most one
// when parts does not divide lengths.size()), as when each rank must run the same number of
// micro-batches. InvalidArgument for parts < 1 or a negative length.
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<Partitioning> BalancePartitions(
    const std::vector<int64_t>& lengths, int parts, bool equal_sizes = false);

// The baseline: longest-processing-time-first greedy (each sequence, longest first, goes to the
// currently lightest group that may still take one). Same contract as BalancePartitions.
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<Partitioning> GreedyPartitions(
    const std::vector<int64_t>& lengths, int parts, bool equal_sizes = false);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_BALANCE_H_

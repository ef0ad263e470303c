#include "lib/diag/paired_speedup.h"

#include <algorithm>

#include "lib/diag/collective_timing.h"

namespace adaptcomm::diag {

PairedSpeedup PairSpeedups(const std::vector<double>& base, const std::vector<double>& other) {
  std::vector<double> speedups;
  for (size_t r = 0; r < std::min(base.size(), other.size()); ++r) {
    if (base[r] > 0 && other[r] > 0) speedups.push_back(base[r] / other[r]);
  }
  PairedSpeedup out;
  out.rounds = static_cast<int>(speedups.size());
  out.median = Median(speedups);
  out.p25 = Percentile(speedups, 25);
  out.p75 = Percentile(speedups, 75);
  return out;
}

bool FasterBeyondNoise(const PairedSpeedup& candidate, const PairedSpeedup& control,
                       double threshold_pct) {
  if (candidate.rounds == 0) return false;
  return candidate.median > 1 + threshold_pct / 100 && candidate.median > control.p75 &&
         candidate.p25 > 1;
}

}  // namespace adaptcomm::diag

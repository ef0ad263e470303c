#include "lib/diag/collective_timing.h"

#include <algorithm>
#include <cmath>

namespace adaptcomm::diag {

double BandwidthGBps(double bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / 1e9 : 0;
}

double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double pos = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(samples.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, samples.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return samples[lo] + (samples[hi] - samples[lo]) * frac;
}

TimingSummary Summarize(const std::vector<double>& samples) {
  TimingSummary s;
  s.samples = static_cast<int>(samples.size());
  if (samples.empty()) return s;
  s.median = Percentile(samples, 50);
  s.p10 = Percentile(samples, 10);
  s.p90 = Percentile(samples, 90);
  s.min = *std::min_element(samples.begin(), samples.end());
  s.max = *std::max_element(samples.begin(), samples.end());
  return s;
}

}  // namespace adaptcomm::diag

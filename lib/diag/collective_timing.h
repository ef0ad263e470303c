// Measuring collectives the way nccl-tests reports them: time percentiles, algorithm bandwidth and
// bus bandwidth. Shared by `adaptcomm bench` and the rank checks of `adaptcomm diagnose --ranks`.
#ifndef ADAPTCOMM_LIB_DIAG_COLLECTIVE_TIMING_H_
#define ADAPTCOMM_LIB_DIAG_COLLECTIVE_TIMING_H_

#include <cstddef>
#include <vector>

#include "adaptcomm/ext/backend.h"
#include "lib/base/op_views.h"

namespace adaptcomm::diag {

// nccl-tests' busbw / algbw: what each rank's link must carry relative to the buffer, so that
// numbers compare across world sizes (lib/base/op_views.h).
using ::adaptcomm::BusBandwidthFactor;

// GB/s (10^9 bytes per second) of `bytes` moved in `seconds`; 0 when seconds <= 0.
double BandwidthGBps(double bytes, double seconds);

// p-th percentile (0..100) with linear interpolation between the closest ranks; 0 for no samples.
double Percentile(std::vector<double> samples, double p);
inline double Median(std::vector<double> samples) { return Percentile(std::move(samples), 50); }

struct TimingSummary {
  int samples = 0;
  double median = 0, p10 = 0, p90 = 0, min = 0, max = 0;  // in the samples' unit
};
TimingSummary Summarize(const std::vector<double>& samples);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_COLLECTIVE_TIMING_H_

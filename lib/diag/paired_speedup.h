// Whether one configuration is faster than another on a noisy machine, from times measured in the
// same rounds (adaptcomm tune). A round times every configuration once, back to back, so a load
// change of the machine moves all of a round's times alike: speedups are taken round by round.
// The noise left is what an A/A pair shows: the baseline timed against a second, identical copy
// of itself in the same rounds (identical settings, another communicator, another place in the
// round's order). A candidate counts as faster only beyond that.
#ifndef ADAPTCOMM_LIB_DIAG_PAIRED_SPEEDUP_H_
#define ADAPTCOMM_LIB_DIAG_PAIRED_SPEEDUP_H_

#include <vector>

namespace adaptcomm::diag {

struct PairedSpeedup {
  int rounds = 0;                       // rounds with a time for both
  double median = 0, p25 = 0, p75 = 0;  // of base time / other time, round by round
};

// The speedup of `other` over `base`, paired by round (sample r of each; a round where either
// time is missing or not positive is left out).
PairedSpeedup PairSpeedups(const std::vector<double>& base, const std::vector<double>& other);

// A candidate replaces the baseline when its median speedup exceeds both 1 + threshold_pct/100
// and the A/A control's 75th percentile (the candidate's typical round beats what identical
// settings show in their better rounds), and its 25th percentile exceeds 1 (it was faster in three
// rounds of four). `control`: PairSpeedups(baseline, its A/A copy).
bool FasterBeyondNoise(const PairedSpeedup& candidate, const PairedSpeedup& control,
                       double threshold_pct);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_PAIRED_SPEEDUP_H_

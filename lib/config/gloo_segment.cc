#include "lib/config/gloo_segment.h"

#include <algorithm>

namespace adaptcomm::config {

uint64_t GlooMaxSegmentBytes(uint64_t max_segment_bytes) {
  return max_segment_bytes > 0 ? max_segment_bytes : kGlooDefaultMaxSegmentBytes;
}

uint64_t GlooRingSegmentCapInEffect(uint64_t bytes, size_t element_bytes, int ranks,
                                    uint64_t max_segment_bytes) {
  const uint64_t element = std::max<uint64_t>(element_bytes, 1);
  // Gloo rounds the cap down to whole elements, one at least.
  const uint64_t cap =
      element * std::max<uint64_t>(GlooMaxSegmentBytes(max_segment_bytes) / element, 1);
  const uint64_t fewest_segments = 2 * static_cast<uint64_t>(std::max(ranks, 1));
  return (bytes + cap - 1) / cap > fewest_segments ? cap : 0;
}

bool GlooAutoIsLatencyBound(uint64_t bytes, int ranks) {
  return ranks >= kGlooAutoLatencyMinRanks &&
         bytes <= kGlooAutoLatencyMaxBytesPerRank * static_cast<uint64_t>(ranks);
}

}  // namespace adaptcomm::config

// A setting that takes a value per message-size band (issue #15): what a backend consults per op
// for a tuned knob. Bands are (min_bytes, max_bytes], sorted and disjoint as the tuned table
// (lib/config/tuned_table.h) guarantees; a size no band holds keeps the static value.
#ifndef ADAPTCOMM_LIB_CONFIG_SIZE_BANDS_H_
#define ADAPTCOMM_LIB_CONFIG_SIZE_BANDS_H_

#include <cstdint>
#include <vector>

namespace adaptcomm::config {

struct SizeBand {
  uint64_t min_bytes = 0;  // exclusive
  uint64_t max_bytes = 0;  // inclusive
  int64_t value = 0;
};
using SizeBands = std::vector<SizeBand>;

// The value of the band holding `bytes`, else `fallback`. A linear scan: a tuned knob has a
// handful of bands, and an empty list (no table) costs one comparison per op.
inline int64_t BandValue(const SizeBands& bands, uint64_t bytes, int64_t fallback) {
  for (const SizeBand& b : bands) {
    if (bytes > b.min_bytes && bytes <= b.max_bytes) return b.value;
  }
  return fallback;
}

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_SIZE_BANDS_H_

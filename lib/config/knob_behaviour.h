// What a set of knob values (TunedKnobs(), lib/config/tuned_table.h) makes a backend run for an
// op of a given size: `adaptcomm tune` measures, and online tuning tries, each distinct behaviour
// once, and never a candidate that runs what the static values already run.
#ifndef ADAPTCOMM_LIB_CONFIG_KNOB_BEHAVIOUR_H_
#define ADAPTCOMM_LIB_CONFIG_KNOB_BEHAVIOUR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace adaptcomm::config {

// The algorithm an allreduce (or, on shm, a reduce) of `bytes` in elements of `element_bytes` runs
// on `ranks` ranks with `values` (knob -> value, as OpKnobs names them) for `backend`'s knob
// space: "flat", "one chunk", "chunks of 262144" (shm); "bcube", "ring", "ring, segments of at
// most 1048576" (gloo: a segment cap counts only past 2 * ranks segments,
// lib/config/gloo_segment.h). Two value sets with the same answer run the same algorithm. Empty
// when the answer is not known here: another knob space, or `values` lacks a knob it depends on
// (shm's chunk_bytes of 0 is the backend's own chunk).
std::string KnobBehaviour(std::string_view backend, const std::map<std::string, int64_t>& values,
                          uint64_t bytes, size_t element_bytes, int ranks);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_KNOB_BEHAVIOUR_H_

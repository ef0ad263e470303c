// What gloo.max_segment_bytes does to Gloo's ring allreduce, for the code that chooses its values
// (`adaptcomm tune`, online tuning) without linking Gloo: lib/gloo/gloo_backend.cc checks
// kGlooDefaultMaxSegmentBytes against the Gloo headers it is built with.
#ifndef ADAPTCOMM_LIB_CONFIG_GLOO_SEGMENT_H_
#define ADAPTCOMM_LIB_CONFIG_GLOO_SEGMENT_H_

#include <cstddef>
#include <cstdint>

namespace adaptcomm::config {

// Gloo's own segment cap (gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize): what a
// gloo.max_segment_bytes of 0 runs with.
inline constexpr uint64_t kGlooDefaultMaxSegmentBytes = uint64_t{1} << 20;

// The segment cap Gloo's allreduce runs with for a gloo.max_segment_bytes value (0: Gloo's own
// default), in bytes.
uint64_t GlooMaxSegmentBytes(uint64_t max_segment_bytes);

// Whether that cap changes a ring allreduce of `bytes` (elements of `element_bytes`) over `ranks`
// ranks: the cap in effect, or 0 where it changes nothing. Gloo's ring cuts a message into 2 *
// ranks segments at least, so a cap is reached only past 2 * ranks * cap bytes (gloo/allreduce.cc,
// ring). Two values with the same answer run the same allreduce, which tuning then tries once;
// bcube ignores the value.
uint64_t GlooRingSegmentCapInEffect(uint64_t bytes, size_t element_bytes, int ranks,
                                    uint64_t max_segment_bytes);

// gloo.algorithm "auto": whether an allreduce of `bytes` over `ranks` ranks is latency-bound, so
// that it runs a tree-like algorithm rather than the ring. Ring takes 2 (ranks - 1) steps of
// bytes / ranks each: once a step carries no more than a small TCP message, its latency, not
// bandwidth, sets the time, and an algorithm of about log2(ranks) steps wins (the latency and
// bandwidth terms of Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication
// Operations in MPICH", 2005). Below kGlooAutoLatencyMinRanks ranks the two differ by a few steps
// only and ring's order of summation is kept. The Gloo backend runs bcube where its groups are
// narrow (at most 2 log2(ranks) peers on every rank) and recursive doubling where they are not (a
// world with a large prime factor, such as an odd one after a shrink, makes bcube one full-mesh
// group): lib/gloo/gloo_recursive_doubling.h.
inline constexpr int kGlooAutoLatencyMinRanks = 16;
inline constexpr uint64_t kGlooAutoLatencyMaxBytesPerRank = 4096;
bool GlooAutoIsLatencyBound(uint64_t bytes, int ranks);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_GLOO_SEGMENT_H_

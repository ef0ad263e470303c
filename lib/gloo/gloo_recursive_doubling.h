// A small-message allreduce by recursive doubling over Gloo's unbound buffers (Thakur,
// Rabenseifner and Gropp, "Optimization of Collective Communication Operations in MPICH", 2005):
// floor(log2 n) exchanges of the whole vector, plus one before and one after for the ranks that a
// world of n = 2^k + m folds in pairs (PlanRecursiveDoubling, gloo_peers.h). Each rank talks to at
// most k + 1 peers whatever n's factors, where Gloo's bcube makes one group of every rank for a
// prime n. Each rank sends the whole vector k times: for latency-bound sizes only
// (config::GlooAutoIsLatencyBound).
//
// Every rank ends with the same bits: each exchange combines the two vectors as
// fn(lower rank's, higher rank's) on both ranks, so even a reduction that is not commutative for
// every input (max with a NaN) gives one answer.
#ifndef ADAPTCOMM_LIB_GLOO_GLOO_RECURSIVE_DOUBLING_H_
#define ADAPTCOMM_LIB_GLOO_GLOO_RECURSIVE_DOUBLING_H_

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "gloo/context.h"
#include "lib/gloo/gloo_reduce.h"

namespace adaptcomm::gloo_backend {

// Reduces `count` elements of `bytes` in all at `data`, in place, over `context`'s ranks, whose
// pairs with RecursiveDoublingPeers() must be connected. `scratch` holds `bytes`; `slot_base`
// has its low 8 bits clear and differs between ops that may run at once. Throws what Gloo throws
// (IoException on a broken pair or the deadline).
void RecursiveDoublingAllreduce(::gloo::Context& context, void* data, size_t count, size_t bytes,
                                ReduceFn fn, void* scratch, uint64_t slot_base,
                                std::chrono::steady_clock::time_point deadline);

}  // namespace adaptcomm::gloo_backend

#endif  // ADAPTCOMM_LIB_GLOO_GLOO_RECURSIVE_DOUBLING_H_

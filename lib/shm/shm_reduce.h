// The n-ary reduction of the shared-memory backend: out[i] = s_0[i] op s_1[i] op ... op s_{n-1}[i]
// in one pass over memory, an L1-sized block at a time (Gloo's kernels are binary: reducing n
// slots with them would read and write the output n-1 times).
//
// f16/bf16 widen into fp32 through lib/base's vectorized cast kernels, combine there and round
// once at the end (sum and avg accumulate in fp32: one rounding instead of one per rank).
// Integer sums and products wrap (two's complement), as NCCL's and the Gloo backend's do.
// avg divides the sum by `n` in the element type (fp32 for f16/bf16); integer avg has no kernel.
#ifndef ADAPTCOMM_LIB_SHM_SHM_REDUCE_H_
#define ADAPTCOMM_LIB_SHM_SHM_REDUCE_H_

#include <cstddef>

#include "adaptcomm/types.h"

namespace adaptcomm::shm {

// Whether ReduceSlots has a kernel for dtype x op.
bool CanReduce(DType dtype, ReduceOp op);

// REQUIRES: CanReduce(dtype, op), n >= 1. `out` may be any srcs[j] exactly (every source is read
// before the output is written, block by block); no partial overlap. Each holds `count` elements.
// A non-null `second_out` receives the same result, under the same aliasing rule: it is stored
// from the block still in L1, which costs one write instead of a copy that reads `out` back.
void ReduceSlots(DType dtype, ReduceOp op, const void* const* srcs, int n, void* out, size_t count,
                 void* second_out = nullptr);

}  // namespace adaptcomm::shm

#endif  // ADAPTCOMM_LIB_SHM_SHM_REDUCE_H_

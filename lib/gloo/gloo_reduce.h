// Element-wise reduction kernels for the Gloo backend, one per dtype x reduce op, in the
// signature Gloo's options take: out[i] = a[i] op b[i] for n elements.
//
// Gloo only knows C++ arithmetic types (and a float16 without bf16), so f16 and bf16 are reduced
// here on uint16_t storage: each element widens to float, is combined, and is rounded back to
// nearest-even. Integer sums and products wrap (two's complement), as NCCL's do.
// `out` may equal `a` or `b` (Gloo reduces in place); partial overlap is not allowed.
#ifndef ADAPTCOMM_LIB_GLOO_GLOO_REDUCE_H_
#define ADAPTCOMM_LIB_GLOO_GLOO_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "adaptcomm/types.h"
#include "lib/base/cast_kernels.h"

namespace adaptcomm::gloo_backend {

using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The kernel for dtype x op; kAvg gives the sum kernel (scale afterwards with
// elementwise::DivideInPlace, lib/base/elementwise.h).
// nullptr when the combination has no kernel (integer kAvg).
ReduceFn GetReduceFn(DType dtype, ReduceOp op);

// The f16/bf16 sum GetReduceFn returns, on a given instruction set of lib/base's cast kernels
// (GetReduceFn's uses the measured one): every path gives the same bits.
void SumHalves(precision::CastPath path, bool bf16, void* out, const void* a, const void* b,
               size_t n);

// IEEE binary16 and bfloat16 conversions (round to nearest even; NaN stays NaN, quieted).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToBf16(float f);

}  // namespace adaptcomm::gloo_backend

#endif  // ADAPTCOMM_LIB_GLOO_GLOO_REDUCE_H_

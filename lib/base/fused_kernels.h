// Fused kernels of the split fp32-accumulating allreduce (mixed.cc, RunPipelined): the owner of a
// block sums every rank's contribution in fp32, rounds the sum once to the wire and widens it back
// into the fp32 output, in one pass over memory instead of four (own cast, sum, round, widen).
//
// The result is bit for bit what the separate kernels give: the owner's fp32 contribution is
// rounded to the wire in registers (exactly as F32ToBF16/F32ToF16 would) before it is added, so
// the op keeps "every input rounded once to the wire, summed in fp32 in rank order, the sum rounded
// once" - the semantics and error bound documented in adaptcomm/precision.h, and the same bits as
// RunNarrow's whole-buffer path.
#ifndef ADAPTCOMM_LIB_BASE_FUSED_KERNELS_H_
#define ADAPTCOMM_LIB_BASE_FUSED_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "adaptcomm/precision.h"
#include "lib/base/cast_kernels.h"

namespace adaptcomm::precision {

// For i < count:
//   acc  = c_0 + c_1 + ... + c_{n-1} in fp32, left to right (rank order), where
//          c_j = widen(round(own[i]))  for j == self when own != nullptr,
//          c_j = widen(blocks[j][i])   otherwise;
//   sum[i] = round(acc);
//   out[i] = widen(sum[i]) * scale     when out != nullptr (multiplication skipped at scale 1).
// round/widen are the wire casts of precision.h; adds keep a NaN accumulator (quieted) as
// AccumulateBF16/F16 do, so every path gives identical bits. Element i is read before element i
// is written: `out` may be `own`, and `sum` may be blocks[self]; nothing else may overlap.
struct ReduceRoundArgs {
  const uint16_t* const* blocks = nullptr;  // n pointers; blocks[self] unused when own is set
  int n = 0;
  int self = -1;
  const float* own = nullptr;
  uint16_t* sum = nullptr;
  float* out = nullptr;
  size_t count = 0;
  float scale = 1.0f;
  // Non-temporal stores for `sum` where the path has them (AVX-512): for a large sum that is only
  // read again by the socket copy that sends it (a store then needs no read of the cold line).
  bool stream_sum = false;
};

struct ReduceRoundStats {
  CastStats own;                // the narrowing of `own` (zero when own == nullptr)
  size_t result_nonfinite = 0;  // NaN/Inf among sum[0, count)
};

ReduceRoundStats ReduceRoundBF16(CastPath path, const ReduceRoundArgs& args);
ReduceRoundStats ReduceRoundF16(CastPath path, const ReduceRoundArgs& args);

// The scalar reference, over elements [begin, count) (the AVX2 kernels finish their tails here).
ReduceRoundStats ReduceRoundBF16Scalar(const ReduceRoundArgs& args, size_t begin = 0);
ReduceRoundStats ReduceRoundF16Scalar(const ReduceRoundArgs& args, size_t begin = 0);

namespace x86 {
// The AVX-512 kernels serve both AVX-512 paths (integer bf16 rounding: identical bits).
ReduceRoundStats ReduceRoundBF16Avx512(const ReduceRoundArgs& args);
ReduceRoundStats ReduceRoundF16Avx512(const ReduceRoundArgs& args);
ReduceRoundStats ReduceRoundBF16Avx2(const ReduceRoundArgs& args);
ReduceRoundStats ReduceRoundF16Avx2(const ReduceRoundArgs& args);
}  // namespace x86

}  // namespace adaptcomm::precision

#endif  // ADAPTCOMM_LIB_BASE_FUSED_KERNELS_H_

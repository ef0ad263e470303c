// The scalar reference of the fused reduce-and-round kernels and the per-path dispatch.
#include "lib/base/fused_kernels.h"

#include <cstring>

#include "lib/base/cast_bits.h"

namespace adaptcomm::precision {

using bits::AddKeepingAccNaN;
using bits::BitsOf;
using bits::FloatOf;

namespace {

struct BF16Ops {
  static uint16_t Narrow(uint32_t x) { return F32BitsToBF16(x); }
  static uint32_t Widen(uint16_t h) { return BF16ToF32Bits(h); }
  static CastStats NarrowStats(const float* src, uint16_t* dst) {
    return F32ToBF16Scalar(src, dst, 1);
  }
  static bool Nonfinite(uint16_t h) { return (h & 0x7f80u) == 0x7f80u; }
};
struct F16Ops {
  static uint16_t Narrow(uint32_t x) { return F32BitsToF16(x); }
  static uint32_t Widen(uint16_t h) { return F16ToF32Bits(h); }
  static CastStats NarrowStats(const float* src, uint16_t* dst) {
    return F32ToF16Scalar(src, dst, 1);
  }
  static bool Nonfinite(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }
};

template <typename Ops>
ReduceRoundStats ReduceRoundScalar(const ReduceRoundArgs& a, size_t begin) {
  ReduceRoundStats s;
  for (size_t i = begin; i < a.count; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < a.n; ++j) {
      uint16_t h;
      if (j == a.self && a.own != nullptr) {
        Accumulate(s.own, Ops::NarrowStats(a.own + i, &h));
      } else {
        h = a.blocks[j][i];
      }
      const float w = FloatOf(Ops::Widen(h));
      acc = j == 0 ? w : AddKeepingAccNaN(acc, w);
    }
    const uint16_t r = Ops::Narrow(BitsOf(acc));
    a.sum[i] = r;
    s.result_nonfinite += Ops::Nonfinite(r);
    if (a.out != nullptr) {
      const float f = FloatOf(Ops::Widen(r));
      a.out[i] = a.scale == 1.0f ? f : f * a.scale;
    }
  }
  return s;
}

}  // namespace

ReduceRoundStats ReduceRoundBF16Scalar(const ReduceRoundArgs& args, size_t begin) {
  return ReduceRoundScalar<BF16Ops>(args, begin);
}
ReduceRoundStats ReduceRoundF16Scalar(const ReduceRoundArgs& args, size_t begin) {
  return ReduceRoundScalar<F16Ops>(args, begin);
}

ReduceRoundStats ReduceRoundBF16(CastPath path, const ReduceRoundArgs& args) {
  switch (path) {
    case CastPath::kAvx512Bf16:
    case CastPath::kAvx512:
      return x86::ReduceRoundBF16Avx512(args);
    case CastPath::kAvx2:
      return x86::ReduceRoundBF16Avx2(args);
    case CastPath::kScalar:
      break;
  }
  return ReduceRoundBF16Scalar(args);
}

ReduceRoundStats ReduceRoundF16(CastPath path, const ReduceRoundArgs& args) {
  switch (path) {
    case CastPath::kAvx512Bf16:
    case CastPath::kAvx512:
      return x86::ReduceRoundF16Avx512(args);
    case CastPath::kAvx2:
      return x86::ReduceRoundF16Avx2(args);
    case CastPath::kScalar:
      break;
  }
  return ReduceRoundF16Scalar(args);
}

}  // namespace adaptcomm::precision

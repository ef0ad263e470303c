// Reduction kernels. Built with -O3 (see CMakeLists.txt): at -O2 GCC 12's "very cheap" vectorizer
// cost model leaves these loops scalar, and the f32/f64 sum sits on the allreduce hot path.
#include "lib/gloo/gloo_reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "lib/base/cast_kernels.h"
#include "lib/base/elementwise.h"

namespace adaptcomm::gloo_backend {
namespace {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float HalfToFloatImpl(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t FloatToHalfImpl(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  // 65520 (0x477ff000) is halfway between the largest half 65504 and 2^16; ties go to even = inf.
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (ax < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal in units of 2^-24. 2^-25 (0x33000000)
    // is the tie between 0 and the smallest subnormal and goes to even (zero).
    if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = ax >> 23;  // 102..112
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t q = (ax - 0x38000000u) >> 13;  // rebias 127 -> 15
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | q);
}

inline float Bf16ToFloatImpl(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16Impl(float f) {
  uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

using elementwise::MaxOp;
using elementwise::MinOp;
using elementwise::ProdOp;
using elementwise::SumOp;

// Native element types. Separate loops for the aliasing cases Gloo produces (out == a) so that
// each loop carries __restrict and vectorizes without runtime overlap checks.
template <typename T, typename Op>
void LoopDistinct(T* __restrict o, const T* __restrict x, const T* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = Op::Apply(x[i], y[i]);
}
template <typename T, typename Op>
void LoopInPlace(T* __restrict o, const T* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = Op::Apply(o[i], y[i]);
}
template <typename T, typename Op>
void LoopSelf(T* o, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = Op::Apply(o[i], o[i]);
}

template <typename T, typename Op>
void NativeKernel(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  // Every op here is commutative, so out == b is handled as out == a.
  if (o == x && o == y) {
    LoopSelf<T, Op>(o, n);
  } else if (o == x) {
    LoopInPlace<T, Op>(o, y, n);
  } else if (o == y) {
    LoopInPlace<T, Op>(o, x, n);
  } else {
    LoopDistinct<T, Op>(o, x, y, n);
  }
}

// 16-bit floats on uint16_t storage, combined in float.
struct HalfConv {
  static float Widen(uint16_t h) { return HalfToFloatImpl(h); }
  static uint16_t Narrow(float f) { return FloatToHalfImpl(f); }
};
struct Bf16Conv {
  static float Widen(uint16_t h) { return Bf16ToFloatImpl(h); }
  static uint16_t Narrow(float f) { return FloatToBf16Impl(f); }
};

template <typename Conv, typename Op>
void Loop16Distinct(uint16_t* __restrict o, const uint16_t* __restrict x,
                    const uint16_t* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i)
    o[i] = Conv::Narrow(Op::Apply(Conv::Widen(x[i]), Conv::Widen(y[i])));
}
template <typename Conv, typename Op>
void Loop16InPlace(uint16_t* __restrict o, const uint16_t* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i)
    o[i] = Conv::Narrow(Op::Apply(Conv::Widen(o[i]), Conv::Widen(y[i])));
}

template <typename Conv, typename Op>
void Kernel16(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  if (o == x && o == y) {
    for (size_t i = 0; i < n; ++i) {
      const float v = Conv::Widen(o[i]);
      o[i] = Conv::Narrow(Op::Apply(v, v));
    }
  } else if (o == x) {
    Loop16InPlace<Conv, Op>(o, y, n);
  } else if (o == y) {
    Loop16InPlace<Conv, Op>(o, x, n);
  } else {
    Loop16Distinct<Conv, Op>(o, x, y, n);
  }
}

// Sums of 16-bit floats through the vectorized cast kernels of lib/precision, an L1-sized block at
// a time: widen a, add widened b in fp32, round to nearest even. The same exact widening, fp32 add
// and rounding as Kernel16 (identical bits, up to which payload survives NaN + NaN), several
// times faster. Each block is read before it is written, so out may equal a or b.
template <bool kBF16>
void Sum16Vectorized(void* out, const void* a, const void* b, size_t n) {
  SumHalves(::adaptcomm::precision::ActiveCastPath(), kBF16, out, a, b, n);
}

template <typename T>
ReduceFn NativeFor(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &NativeKernel<T, SumOp>;
    case ReduceOp::kProd:
      return &NativeKernel<T, ProdOp>;
    case ReduceOp::kMin:
      return &NativeKernel<T, MinOp>;
    case ReduceOp::kMax:
      return &NativeKernel<T, MaxOp>;
  }
  return nullptr;
}

template <typename Conv>
ReduceFn SixteenFor(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &Kernel16<Conv, SumOp>;
    case ReduceOp::kProd:
      return &Kernel16<Conv, ProdOp>;
    case ReduceOp::kMin:
      return &Kernel16<Conv, MinOp>;
    case ReduceOp::kMax:
      return &Kernel16<Conv, MaxOp>;
  }
  return nullptr;
}

}  // namespace

ReduceFn GetReduceFn(DType dtype, ReduceOp op) {
  const bool avg = op == ReduceOp::kAvg;
  switch (dtype) {
    case DType::kF32:
      return NativeFor<float>(op);
    case DType::kF64:
      return NativeFor<double>(op);
    case DType::kF16:
      return op == ReduceOp::kSum || avg ? &Sum16Vectorized<false> : SixteenFor<HalfConv>(op);
    case DType::kBF16:
      return op == ReduceOp::kSum || avg ? &Sum16Vectorized<true> : SixteenFor<Bf16Conv>(op);
    case DType::kI8:
      return avg ? nullptr : NativeFor<int8_t>(op);
    case DType::kU8:
      return avg ? nullptr : NativeFor<uint8_t>(op);
    case DType::kI32:
      return avg ? nullptr : NativeFor<int32_t>(op);
    case DType::kI64:
      return avg ? nullptr : NativeFor<int64_t>(op);
  }
  return nullptr;
}

void SumHalves(precision::CastPath path, bool bf16, void* out, const void* a, const void* b,
               size_t n) {
  namespace p = ::adaptcomm::precision;
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  constexpr size_t kBlock = 2048;
  alignas(64) float tmp[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    if (bf16) {
      (void)p::BF16ToF32(path, x + i, tmp, m);
      p::AccumulateBF16(path, y + i, tmp, m);
      (void)p::F32ToBF16(path, tmp, o + i, m);
    } else {
      (void)p::F16ToF32(path, x + i, tmp, m);
      p::AccumulateF16(path, y + i, tmp, m);
      (void)p::F32ToF16(path, tmp, o + i, m);
    }
  }
}

float HalfToFloat(uint16_t h) { return HalfToFloatImpl(h); }
uint16_t FloatToHalf(float f) { return FloatToHalfImpl(f); }
float Bf16ToFloat(uint16_t h) { return Bf16ToFloatImpl(h); }
uint16_t FloatToBf16(float f) { return FloatToBf16Impl(f); }

}  // namespace adaptcomm::gloo_backend

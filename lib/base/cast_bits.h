// The one definition of the fp32 <-> bf16/fp16 bit conversions, compiled for the CPU (the scalar
// reference, lib/base/cast_scalar.cc) and for CUDA (lib/cuda/cast_kernels.cu), so the two can
// never drift apart. Integer arithmetic only: neither the rounding mode nor flush-to-zero changes a
// bit. Round to nearest, ties to even; NaN stays NaN (quieted, sign and top payload bits kept);
// values at or past the halfway point above the largest finite value become Inf.
#ifndef ADAPTCOMM_LIB_BASE_CAST_BITS_H_
#define ADAPTCOMM_LIB_BASE_CAST_BITS_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ADAPTCOMM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ADAPTCOMM_HOST_DEVICE inline
#endif

namespace adaptcomm::precision::bits {

constexpr uint32_t kF32AbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;
constexpr uint32_t kF32QuietBit = 0x00400000u;
// Smallest |x| that rounds to Inf: halfway between the largest finite value and the next power.
constexpr uint32_t kF16OverflowBits = 0x477ff000u;   // 65520.0f
constexpr uint32_t kBF16OverflowBits = 0x7f7f8000u;  // 0x1.ffp127

ADAPTCOMM_HOST_DEVICE uint16_t F32ToBF16(uint32_t x) {
  if ((x & kF32AbsMask) > kF32Inf) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  // Adding 0x7fff plus the lsb of the kept half rounds to nearest, ties to even; a carry out of
  // the mantissa correctly bumps the exponent (up to Inf).
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + lsb) >> 16);
}

ADAPTCOMM_HOST_DEVICE uint16_t F32ToF16(uint32_t x) {
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & kF32AbsMask;
  if (a > kF32Inf) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= kF16OverflowBits) return static_cast<uint16_t>(sign | 0x7c00u);  // also Inf itself
  if (a >= 0x38800000u) {                   // >= 2^-14: an fp16 normal
    uint32_t h = (a >> 13) - (112u << 10);  // rebias the exponent 127 -> 15
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
    return static_cast<uint16_t>(sign | h);
  }
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero (2^-25 itself is a tie to even 0)
  // fp16 denormal: the value in units of 2^-24 is mant * 2^(e - 150 + 24) = mant >> (126 - e).
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t h = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;  // 0x400 is the smallest normal: correct
  return static_cast<uint16_t>(sign | h);
}

ADAPTCOMM_HOST_DEVICE uint32_t BF16ToF32(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  if ((x & kF32AbsMask) > kF32Inf) x |= kF32QuietBit;
  return x;
}

ADAPTCOMM_HOST_DEVICE uint32_t F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return sign | (m != 0 ? (0x7fc00000u | (m << 13)) : kF32Inf);
  if (e != 0) return sign | ((e + 112u) << 23) | (m << 13);
  if (m == 0) return sign;
  // Denormal m * 2^-24: normalise so the leading one becomes the implicit bit.
  uint32_t shift = 0;
  uint32_t mm = m;
  while ((mm & 0x400u) == 0) {
    mm <<= 1;
    ++shift;
  }
  return sign | ((113u - shift) << 23) | ((mm & 0x3ffu) << 13);
}

ADAPTCOMM_HOST_DEVICE uint32_t BitsOf(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof(b));
  return b;
}
ADAPTCOMM_HOST_DEVICE float FloatOf(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof(f));
  return f;
}

// acc + w, except that a NaN accumulator is kept (quieted): which NaN an add returns when both
// operands are NaN depends on the operand order, and compilers commute float adds freely, so every
// path keeps the accumulator's NaN explicitly and the bits do not depend on code generation.
ADAPTCOMM_HOST_DEVICE float AddKeepingAccNaN(float acc, float w) {
  const uint32_t a = BitsOf(acc);
  if ((a & kF32AbsMask) > kF32Inf) return FloatOf(a | kF32QuietBit);
  return acc + w;
}

// What the casts count: finite fp32 values that become +-Inf on the narrow side, and NaN/Inf.
ADAPTCOMM_HOST_DEVICE bool F32Nonfinite(uint32_t x) { return (x & kF32AbsMask) >= kF32Inf; }
ADAPTCOMM_HOST_DEVICE bool F32OverflowsBF16(uint32_t x) {
  const uint32_t a = x & kF32AbsMask;
  return a >= kBF16OverflowBits && a < kF32Inf;
}
ADAPTCOMM_HOST_DEVICE bool F32OverflowsF16(uint32_t x) {
  const uint32_t a = x & kF32AbsMask;
  return a >= kF16OverflowBits && a < kF32Inf;
}
ADAPTCOMM_HOST_DEVICE bool BF16Nonfinite(uint16_t h) { return (h & 0x7f80u) == 0x7f80u; }
ADAPTCOMM_HOST_DEVICE bool F16Nonfinite(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }

}  // namespace adaptcomm::precision::bits

#undef ADAPTCOMM_HOST_DEVICE

#endif  // ADAPTCOMM_LIB_BASE_CAST_BITS_H_

// The scalar reference casts. Integer arithmetic only, so the result never depends on MXCSR
// (rounding mode, FTZ/DAZ) and matches the vector paths bit for bit.
#include <cstring>

#include "lib/base/cast_bits.h"
#include "lib/base/cast_kernels.h"

namespace adaptcomm::precision {

using bits::AddKeepingAccNaN;
using bits::BitsOf;
using bits::FloatOf;

uint16_t F32BitsToBF16(uint32_t x) { return bits::F32ToBF16(x); }
uint16_t F32BitsToF16(uint32_t x) { return bits::F32ToF16(x); }
uint32_t BF16ToF32Bits(uint16_t h) { return bits::BF16ToF32(h); }
uint32_t F16ToF32Bits(uint16_t h) { return bits::F16ToF32(h); }

CastStats F32ToBF16Scalar(const float* src, uint16_t* dst, size_t n) {
  CastStats s;
  s.count = n;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = BitsOf(src[i]);
    s.nonfinite_inputs += bits::F32Nonfinite(x);
    s.overflow += bits::F32OverflowsBF16(x);
    dst[i] = bits::F32ToBF16(x);
  }
  return s;
}

CastStats F32ToF16Scalar(const float* src, uint16_t* dst, size_t n) {
  CastStats s;
  s.count = n;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = BitsOf(src[i]);
    s.nonfinite_inputs += bits::F32Nonfinite(x);
    s.overflow += bits::F32OverflowsF16(x);
    dst[i] = bits::F32ToF16(x);
  }
  return s;
}

CastStats BF16ToF32Scalar(const uint16_t* src, float* dst, size_t n, float scale) {
  CastStats s;
  s.count = n;
  for (size_t i = 0; i < n; ++i) {
    s.nonfinite_inputs += bits::BF16Nonfinite(src[i]);
    const float f = FloatOf(BF16ToF32Bits(src[i]));
    dst[i] = scale == 1.0f ? f : f * scale;
  }
  return s;
}

CastStats F16ToF32Scalar(const uint16_t* src, float* dst, size_t n, float scale) {
  CastStats s;
  s.count = n;
  for (size_t i = 0; i < n; ++i) {
    s.nonfinite_inputs += bits::F16Nonfinite(src[i]);
    const float f = FloatOf(F16ToF32Bits(src[i]));
    dst[i] = scale == 1.0f ? f : f * scale;
  }
  return s;
}

void AccumulateBF16Scalar(const uint16_t* src, float* acc, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = AddKeepingAccNaN(acc[i], FloatOf(BF16ToF32Bits(src[i])));
}

void AccumulateF16Scalar(const uint16_t* src, float* acc, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = AddKeepingAccNaN(acc[i], FloatOf(F16ToF32Bits(src[i])));
}

}  // namespace adaptcomm::precision

// Single-threaded cast kernels per instruction set, the scalar reference they must match bit for
// bit, and the run-time choice among them. The public functions in adaptcomm/precision.h add
// multi-threading on top (cast_parallel.h).
#ifndef ADAPTCOMM_LIB_BASE_CAST_KERNELS_H_
#define ADAPTCOMM_LIB_BASE_CAST_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "adaptcomm/precision.h"

namespace adaptcomm::precision {

enum class CastPath : uint8_t { kScalar, kAvx2, kAvx512, kAvx512Bf16 };
const char* CastPathName(CastPath path);
// Whether this CPU (and this build) can run `path`.
bool CastPathSupported(CastPath path);
// Every path this CPU can run, scalar first.
std::vector<CastPath> SupportedCastPaths();
// The path the public functions use: the fastest supported one, measured at the first call
// (cast_dispatch.cc). Code that must run a given path takes it as an argument (the kernels below,
// CastRequest::path).
CastPath ActiveCastPath();

// Kernels on one path. The widening ones multiply by `scale` in fp32 after the exact conversion
// (skipped when scale == 1, which keeps NaN payloads exact).
CastStats F32ToBF16(CastPath path, const float* src, uint16_t* dst, size_t n);
CastStats F32ToF16(CastPath path, const float* src, uint16_t* dst, size_t n);
CastStats BF16ToF32(CastPath path, const uint16_t* src, float* dst, size_t n, float scale = 1.0f);
CastStats F16ToF32(CastPath path, const uint16_t* src, float* dst, size_t n, float scale = 1.0f);
// The same bits with non-temporal stores where the path has them (AVX-512), for large outputs
// that are not read back soon: a store then needs no read of the cold destination line first.
CastStats F32ToBF16Stream(CastPath path, const float* src, uint16_t* dst, size_t n);
CastStats F32ToF16Stream(CastPath path, const float* src, uint16_t* dst, size_t n);
CastStats BF16ToF32Stream(CastPath path, const uint16_t* src, float* dst, size_t n,
                          float scale = 1.0f);
CastStats F16ToF32Stream(CastPath path, const uint16_t* src, float* dst, size_t n,
                         float scale = 1.0f);

// acc[i] += widen(src[i]) in fp32 (the local reduction of the fp32-accumulating mixed
// collectives). Same add, same operand order on every path: identical bits.
void AccumulateBF16(CastPath path, const uint16_t* src, float* acc, size_t n);
void AccumulateF16(CastPath path, const uint16_t* src, float* acc, size_t n);

// The scalar reference, one element (bits in, bits out). The definitions are in precision.h.
uint16_t F32BitsToBF16(uint32_t x);
uint16_t F32BitsToF16(uint32_t x);
uint32_t BF16ToF32Bits(uint16_t h);
uint32_t F16ToF32Bits(uint16_t h);

// x86 kernels (cast_x86.cc); call only when the path is supported.
namespace x86 {
bool HasAvx2F16c();
bool HasAvx512();
bool HasAvx512Bf16();
CastStats F32ToBF16Avx2(const float* src, uint16_t* dst, size_t n);
CastStats F32ToF16Avx2(const float* src, uint16_t* dst, size_t n);
CastStats BF16ToF32Avx2(const uint16_t* src, float* dst, size_t n, float scale);
CastStats F16ToF32Avx2(const uint16_t* src, float* dst, size_t n, float scale);
CastStats F32ToBF16Avx512(const float* src, uint16_t* dst, size_t n);
CastStats F32ToBF16Avx512Bf16(const float* src, uint16_t* dst, size_t n);
CastStats F32ToF16Avx512(const float* src, uint16_t* dst, size_t n);
CastStats BF16ToF32Avx512(const uint16_t* src, float* dst, size_t n, float scale);
CastStats F16ToF32Avx512(const uint16_t* src, float* dst, size_t n, float scale);
CastStats F32ToBF16StreamAvx512(const float* src, uint16_t* dst, size_t n);
CastStats F32ToBF16StreamAvx512Bf16(const float* src, uint16_t* dst, size_t n);
CastStats F32ToF16StreamAvx512(const float* src, uint16_t* dst, size_t n);
CastStats BF16ToF32StreamAvx512(const uint16_t* src, float* dst, size_t n, float scale);
CastStats F16ToF32StreamAvx512(const uint16_t* src, float* dst, size_t n, float scale);
void AccumulateBF16Avx512(const uint16_t* src, float* acc, size_t n);
void AccumulateF16Avx512(const uint16_t* src, float* acc, size_t n);
void AccumulateBF16Avx2(const uint16_t* src, float* acc, size_t n);
void AccumulateF16Avx2(const uint16_t* src, float* acc, size_t n);
}  // namespace x86

// Scalar kernels (also used for the tails of the AVX2 kernels).
CastStats F32ToBF16Scalar(const float* src, uint16_t* dst, size_t n);
CastStats F32ToF16Scalar(const float* src, uint16_t* dst, size_t n);
CastStats BF16ToF32Scalar(const uint16_t* src, float* dst, size_t n, float scale);
CastStats F16ToF32Scalar(const uint16_t* src, float* dst, size_t n, float scale);
void AccumulateBF16Scalar(const uint16_t* src, float* acc, size_t n);
void AccumulateF16Scalar(const uint16_t* src, float* acc, size_t n);

inline void Accumulate(CastStats& total, const CastStats& part) {
  total.count += part.count;
  total.overflow += part.overflow;
  total.nonfinite_inputs += part.nonfinite_inputs;
}

}  // namespace adaptcomm::precision

#endif  // ADAPTCOMM_LIB_BASE_CAST_KERNELS_H_

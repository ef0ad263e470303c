// Inline SIMD helpers shared by the x86 cast kernels (cast_x86.cc) and the fused kernels
// (fused_x86.cc). Each carries its own target attribute; include only from x86 translation units
// that check the CPU before calling (see cast_x86.cc).
#ifndef ADAPTCOMM_LIB_BASE_CAST_X86_SIMD_H_
#define ADAPTCOMM_LIB_BASE_CAST_X86_SIMD_H_

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's AVX-512 shift and convert intrinsics start from _mm512_undefined_epi32(), which
// -Wmaybe-uninitialized (or, once inlined into a non-inline caller, -Wuninitialized) reports as a
// use of an uninitialized value (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#define ADAPTCOMM_X86 1
#define ADAPTCOMM_AVX512 "avx512f,avx512bw,avx512vl,avx2,f16c"

namespace adaptcomm::precision::x86 {

constexpr int kAbsMask = 0x7fffffff;
constexpr int kInf = 0x7f800000;
constexpr int kMaxFinite = 0x7f7fffff;
constexpr int kF16OverflowMinus1 = 0x477fefff;   // |x| > this (and finite) overflows fp16
constexpr int kBF16OverflowMinus1 = 0x7f7f7fff;  // |x| > this (and finite) overflows bf16

__attribute__((target("avx2"))) inline size_t HorizontalSum(__m256i v) {
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  size_t total = 0;
  for (int32_t lane : lanes) total += static_cast<uint32_t>(lane);
  return total;
}

// Counts, per lane, finite inputs above `overflow_minus1` and non-finite inputs: a compare gives
// -1 per true lane, subtracted from the counters.
struct Avx2Counts {
  __m256i overflow;
  __m256i nonfinite;
};

__attribute__((target("avx2"))) inline void CountNarrow(Avx2Counts& c, __m256i abs,
                                                        __m256i overflow_minus1) {
  const __m256i max_finite = _mm256_set1_epi32(kMaxFinite);
  const __m256i nonfinite = _mm256_cmpgt_epi32(abs, max_finite);
  const __m256i over = _mm256_andnot_si256(nonfinite, _mm256_cmpgt_epi32(abs, overflow_minus1));
  c.overflow = _mm256_sub_epi32(c.overflow, over);
  c.nonfinite = _mm256_sub_epi32(c.nonfinite, nonfinite);
}

__attribute__((target("avx2"))) inline __m256i BF16Round8(__m256i x) {
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(kAbsMask));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(kInf));
  const __m256i hi = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}

__attribute__((target(ADAPTCOMM_AVX512))) inline __mmask16 TailMask(size_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

// Loads and stores of up to 16 lanes: masked only for a partial (tail) vector. A masked access of
// a whole vector can run far slower than a plain one from memory: on a virtualised AMD EPYC, an
// f32 -> bf16 cast of 64 MiB ran at 5.5 GB/s with masked loads and 23.5 GB/s with plain ones.
constexpr __mmask16 kFullMask = 0xffff;
__attribute__((target(ADAPTCOMM_AVX512))) inline __m512i LoadI32(__mmask16 m, const void* p) {
  return m == kFullMask ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(m, p);
}
__attribute__((target(ADAPTCOMM_AVX512))) inline __m512 LoadF32(__mmask16 m, const float* p) {
  return m == kFullMask ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
__attribute__((target(ADAPTCOMM_AVX512))) inline __m256i LoadI16(__mmask16 m, const void* p) {
  return m == kFullMask ? _mm256_loadu_si256(static_cast<const __m256i*>(p))
                        : _mm256_maskz_loadu_epi16(m, p);
}
__attribute__((target(ADAPTCOMM_AVX512))) inline void StoreF32(float* p, __mmask16 m, __m512 v) {
  if (m == kFullMask) {
    _mm512_storeu_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, m, v);
  }
}
__attribute__((target(ADAPTCOMM_AVX512))) inline void StoreI16(void* p, __mmask16 m, __m256i v) {
  if (m == kFullMask) {
    _mm256_storeu_si256(static_cast<__m256i*>(p), v);
  } else {
    _mm256_mask_storeu_epi16(p, m, v);
  }
}

__attribute__((target(ADAPTCOMM_AVX512))) inline __m512i BF16Round16(__m512i x, __mmask16 is_nan) {
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  return _mm512_mask_or_epi32(rounded, is_nan, hi, _mm512_set1_epi32(0x40));
}

// A NaN accumulator stays itself (quieted) whatever operand order the compiler picks for the add;
// see AddKeepingAccNaN in cast_bits.h.
__attribute__((target(ADAPTCOMM_AVX512))) inline __m512 AddKeepingAccNaN512(__m512 acc, __m512 w) {
  const __mmask16 nan = _mm512_cmp_ps_mask(acc, acc, _CMP_UNORD_Q);
  const __m512i quieted = _mm512_or_si512(_mm512_castps_si512(acc), _mm512_set1_epi32(0x00400000));
  return _mm512_mask_blend_ps(nan, _mm512_add_ps(acc, w), _mm512_castsi512_ps(quieted));
}

__attribute__((target("avx2"))) inline __m256 AddKeepingAccNaN256(__m256 acc, __m256 w) {
  const __m256 nan = _mm256_cmp_ps(acc, acc, _CMP_UNORD_Q);
  const __m256 quieted = _mm256_or_ps(acc, _mm256_castsi256_ps(_mm256_set1_epi32(0x00400000)));
  return _mm256_blendv_ps(_mm256_add_ps(acc, w), quieted, nan);
}

}  // namespace adaptcomm::precision::x86

#endif  // x86
#endif  // ADAPTCOMM_LIB_BASE_CAST_X86_SIMD_H_

// AVX2/F16C and AVX-512 cast kernels. Each function is compiled for its own target (attribute),
// so the library still runs on any x86-64; cast_dispatch.cc calls one only after checking the CPU.
//
// Agreement with the scalar reference, by construction:
//   * fp16 narrowing uses vcvtps2ph with imm8 = RNE|no-exceptions (ignores MXCSR.RC); it quiets a
//     NaN keeping mantissa bits 22..13 and makes fp16 denormals (FTZ is not applied), exactly like
//     F32BitsToF16. fp16 widening uses vcvtph2ps: exact, NaN quieted with the payload << 13.
//   * bf16 narrowing is integer arithmetic (x + 0x7fff + lsb) >> 16 with a NaN blend, identical to
//     the scalar formula. vcvtneps2bf16 (AVX512-BF16) treats fp32 denormal inputs as zero, so its
//     lanes with a denormal input are replaced by the integer result.
// Tails shorter than a vector go to the scalar kernels (AVX2) or use masked loads/stores (AVX-512).
#include <algorithm>

#include "lib/base/cast_kernels.h"
#include "lib/base/cast_x86_simd.h"

#ifdef ADAPTCOMM_X86
#include <cpuid.h>
#endif

namespace adaptcomm::precision::x86 {

#ifdef ADAPTCOMM_X86

// __builtin_cpu_supports checks that the OS saves the AVX/AVX-512 state; F16C and AVX512-BF16
// come from CPUID directly because clang 14's builtin does not know those names.
bool HasAvx2F16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const bool f16c = (ecx >> 29) & 1u;
  return f16c && __builtin_cpu_supports("avx2");
}
bool HasAvx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && HasAvx2F16c();
}
bool HasAvx512Bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return false;
  return HasAvx512() && ((eax >> 5) & 1u);
}

__attribute__((target("avx2,f16c"))) CastStats F32ToBF16Avx2(const float* src, uint16_t* dst,
                                                             size_t n) {
  Avx2Counts c{_mm256_setzero_si256(), _mm256_setzero_si256()};
  const __m256i abs_mask = _mm256_set1_epi32(kAbsMask);
  const __m256i over = _mm256_set1_epi32(kBF16OverflowMinus1);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8));
    CountNarrow(c, _mm256_and_si256(a, abs_mask), over);
    CountNarrow(c, _mm256_and_si256(b, abs_mask), over);
    // packus works per 128-bit lane: [a0-3 b0-3 a4-7 b4-7]; the permute restores the order.
    const __m256i packed = _mm256_packus_epi32(BF16Round8(a), BF16Round8(b));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_permute4x64_epi64(packed, 0xd8));
  }
  CastStats s = F32ToBF16Scalar(src + i, dst + i, n - i);
  s.count = n;
  s.overflow += HorizontalSum(c.overflow);
  s.nonfinite_inputs += HorizontalSum(c.nonfinite);
  return s;
}

__attribute__((target("avx2,f16c"))) CastStats F32ToF16Avx2(const float* src, uint16_t* dst,
                                                            size_t n) {
  Avx2Counts c{_mm256_setzero_si256(), _mm256_setzero_si256()};
  const __m256i abs_mask = _mm256_set1_epi32(kAbsMask);
  const __m256i over = _mm256_set1_epi32(kF16OverflowMinus1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    CountNarrow(c, _mm256_and_si256(_mm256_castps_si256(v), abs_mask), over);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  CastStats s = F32ToF16Scalar(src + i, dst + i, n - i);
  s.count = n;
  s.overflow += HorizontalSum(c.overflow);
  s.nonfinite_inputs += HorizontalSum(c.nonfinite);
  return s;
}

__attribute__((target("avx2,f16c"))) CastStats BF16ToF32Avx2(const uint16_t* src, float* dst,
                                                             size_t n, float scale) {
  __m256i nonfinite = _mm256_setzero_si256();
  const __m256i abs_mask = _mm256_set1_epi32(kAbsMask);
  const __m256i inf = _mm256_set1_epi32(kInf);
  const __m256i max_finite = _mm256_set1_epi32(kMaxFinite);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  const __m256 vscale = _mm256_set1_ps(scale);
  const bool scaled = scale != 1.0f;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    const __m256i abs = _mm256_and_si256(x, abs_mask);
    x = _mm256_or_si256(x, _mm256_and_si256(_mm256_cmpgt_epi32(abs, inf), quiet));
    nonfinite = _mm256_sub_epi32(nonfinite, _mm256_cmpgt_epi32(abs, max_finite));
    __m256 f = _mm256_castsi256_ps(x);
    if (scaled) f = _mm256_mul_ps(f, vscale);
    _mm256_storeu_ps(dst + i, f);
  }
  CastStats s = BF16ToF32Scalar(src + i, dst + i, n - i, scale);
  s.count = n;
  s.nonfinite_inputs += HorizontalSum(nonfinite);
  return s;
}

__attribute__((target("avx2,f16c"))) CastStats F16ToF32Avx2(const uint16_t* src, float* dst,
                                                            size_t n, float scale) {
  __m256i nonfinite = _mm256_setzero_si256();
  const __m256i abs_mask = _mm256_set1_epi32(kAbsMask);
  const __m256i max_finite = _mm256_set1_epi32(kMaxFinite);
  const __m256 vscale = _mm256_set1_ps(scale);
  const bool scaled = scale != 1.0f;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    const __m256i abs = _mm256_and_si256(_mm256_castps_si256(f), abs_mask);
    nonfinite = _mm256_sub_epi32(nonfinite, _mm256_cmpgt_epi32(abs, max_finite));
    if (scaled) f = _mm256_mul_ps(f, vscale);
    _mm256_storeu_ps(dst + i, f);
  }
  CastStats s = F16ToF32Scalar(src + i, dst + i, n - i, scale);
  s.count = n;
  s.nonfinite_inputs += HorizontalSum(nonfinite);
  return s;
}

// ---- AVX-512 ----

namespace {

// kStream: a non-temporal store of a whole vector at a 32-byte-aligned dst (see NarrowStreamed).
template <bool kStream>
__attribute__((target(ADAPTCOMM_AVX512))) inline void StoreHalves(uint16_t* dst, __mmask16 m,
                                                                  __m256i h) {
  if (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), h);
  } else {
    StoreI16(dst, m, h);
  }
}

template <bool kStream>
__attribute__((target(ADAPTCOMM_AVX512))) CastStats F32ToBF16Avx512T(const float* src,
                                                                     uint16_t* dst, size_t n) {
  CastStats s;
  s.count = n;
  const __m512i abs_mask = _mm512_set1_epi32(kAbsMask);
  const __m512i inf = _mm512_set1_epi32(kInf);
  const __m512i max_finite = _mm512_set1_epi32(kMaxFinite);
  const __m512i over = _mm512_set1_epi32(kBF16OverflowMinus1);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512i x = LoadI32(m, src + i);
    const __m512i abs = _mm512_and_si512(x, abs_mask);
    const __mmask16 nonfinite = _mm512_cmpgt_epi32_mask(abs, max_finite);
    const __mmask16 overflow = _mm512_mask_cmpgt_epi32_mask(~nonfinite, abs, over);
    s.nonfinite_inputs += __builtin_popcount(nonfinite);
    s.overflow += __builtin_popcount(overflow);
    const __m512i r = BF16Round16(x, _mm512_cmpgt_epi32_mask(abs, inf));
    StoreHalves<kStream>(dst + i, m, _mm512_cvtepi32_epi16(r));
  }
  return s;
}

template <bool kStream>
__attribute__((target(ADAPTCOMM_AVX512 ",avx512bf16"))) CastStats F32ToBF16Avx512Bf16T(
    const float* src, uint16_t* dst, size_t n) {
  CastStats s;
  s.count = n;
  const __m512i abs_mask = _mm512_set1_epi32(kAbsMask);
  const __m512i inf = _mm512_set1_epi32(kInf);
  const __m512i max_finite = _mm512_set1_epi32(kMaxFinite);
  const __m512i over = _mm512_set1_epi32(kBF16OverflowMinus1);
  const __m512i exp_mask = _mm512_set1_epi32(kInf);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512i x = LoadI32(m, src + i);
    const __m512i abs = _mm512_and_si512(x, abs_mask);
    const __mmask16 nonfinite = _mm512_cmpgt_epi32_mask(abs, max_finite);
    s.nonfinite_inputs += __builtin_popcount(nonfinite);
    s.overflow += __builtin_popcount(_mm512_mask_cmpgt_epi32_mask(~nonfinite, abs, over));
    __m256i r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_castsi512_ps(x)));
    // Denormal inputs (exponent 0, mantissa != 0): the instruction flushed them; redo them.
    const __mmask16 denormal = _mm512_mask_cmpneq_epi32_mask(_mm512_testn_epi32_mask(x, exp_mask),
                                                             abs, _mm512_setzero_si512());
    if (denormal != 0) {
      const __m256i fixed =
          _mm512_cvtepi32_epi16(BF16Round16(x, _mm512_cmpgt_epi32_mask(abs, inf)));
      r = _mm256_mask_blend_epi16(denormal, r, fixed);
    }
    StoreHalves<kStream>(dst + i, m, r);
  }
  return s;
}

template <bool kStream>
__attribute__((target(ADAPTCOMM_AVX512))) CastStats F32ToF16Avx512T(const float* src, uint16_t* dst,
                                                                    size_t n) {
  CastStats s;
  s.count = n;
  const __m512i abs_mask = _mm512_set1_epi32(kAbsMask);
  const __m512i max_finite = _mm512_set1_epi32(kMaxFinite);
  const __m512i over = _mm512_set1_epi32(kF16OverflowMinus1);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 v = LoadF32(m, src + i);
    const __m512i abs = _mm512_and_si512(_mm512_castps_si512(v), abs_mask);
    const __mmask16 nonfinite = _mm512_cmpgt_epi32_mask(abs, max_finite);
    s.nonfinite_inputs += __builtin_popcount(nonfinite);
    s.overflow += __builtin_popcount(_mm512_mask_cmpgt_epi32_mask(~nonfinite, abs, over));
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    StoreHalves<kStream>(dst + i, m, h);
  }
  return s;
}

using NarrowFn = CastStats (*)(const float*, uint16_t*, size_t);

// `plain` on the head up to the first 32-byte boundary of dst and on the tail, `stream` on the
// whole vectors between them (non-temporal stores); the sfence orders them before whatever the
// caller publishes next.
__attribute__((target(ADAPTCOMM_AVX512))) CastStats NarrowStreamed(NarrowFn plain, NarrowFn stream,
                                                                   const float* src, uint16_t* dst,
                                                                   size_t n) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(dst);
  if (address % sizeof(uint16_t) != 0) return plain(src, dst, n);
  const size_t head = std::min(n, (32 - address % 32) % 32 / sizeof(uint16_t));
  const size_t body = (n - head) / 16 * 16;
  CastStats s = plain(src, dst, head);
  Accumulate(s, stream(src + head, dst + head, body));
  Accumulate(s, plain(src + head + body, dst + head + body, n - head - body));
  _mm_sfence();
  return s;
}

}  // namespace

__attribute__((target(ADAPTCOMM_AVX512))) CastStats F32ToBF16Avx512(const float* src, uint16_t* dst,
                                                                    size_t n) {
  return F32ToBF16Avx512T<false>(src, dst, n);
}
__attribute__((target(ADAPTCOMM_AVX512 ",avx512bf16"))) CastStats F32ToBF16Avx512Bf16(
    const float* src, uint16_t* dst, size_t n) {
  return F32ToBF16Avx512Bf16T<false>(src, dst, n);
}
__attribute__((target(ADAPTCOMM_AVX512))) CastStats F32ToF16Avx512(const float* src, uint16_t* dst,
                                                                   size_t n) {
  return F32ToF16Avx512T<false>(src, dst, n);
}
__attribute__((target(ADAPTCOMM_AVX512))) CastStats F32ToBF16StreamAvx512(const float* src,
                                                                          uint16_t* dst, size_t n) {
  return NarrowStreamed(F32ToBF16Avx512T<false>, F32ToBF16Avx512T<true>, src, dst, n);
}
__attribute__((target(ADAPTCOMM_AVX512 ",avx512bf16"))) CastStats F32ToBF16StreamAvx512Bf16(
    const float* src, uint16_t* dst, size_t n) {
  return NarrowStreamed(F32ToBF16Avx512Bf16T<false>, F32ToBF16Avx512Bf16T<true>, src, dst, n);
}
__attribute__((target(ADAPTCOMM_AVX512))) CastStats F32ToF16StreamAvx512(const float* src,
                                                                         uint16_t* dst, size_t n) {
  return NarrowStreamed(F32ToF16Avx512T<false>, F32ToF16Avx512T<true>, src, dst, n);
}

namespace {

// One vector of a widening: the (masked: m) 16 elements at src, exact, NaN quieted, times scale
// unless `scaled` is false; adds the non-finite lanes of m to `nonfinite`.
__attribute__((target(ADAPTCOMM_AVX512))) inline __m512 WidenVectorBF16(const uint16_t* src,
                                                                        __mmask16 m, __m512 scale,
                                                                        bool scaled,
                                                                        size_t& nonfinite) {
  const __m256i h = LoadI16(m, src);
  __m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(kAbsMask));
  x = _mm512_mask_or_epi32(x, _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(kInf)), x,
                           _mm512_set1_epi32(0x00400000));
  nonfinite +=
      __builtin_popcount(_mm512_mask_cmpgt_epi32_mask(m, abs, _mm512_set1_epi32(kMaxFinite)));
  const __m512 f = _mm512_castsi512_ps(x);
  return scaled ? _mm512_mul_ps(f, scale) : f;
}

__attribute__((target(ADAPTCOMM_AVX512))) inline __m512 WidenVectorF16(const uint16_t* src,
                                                                       __mmask16 m, __m512 scale,
                                                                       bool scaled,
                                                                       size_t& nonfinite) {
  const __m512 f = _mm512_cvtph_ps(LoadI16(m, src));
  const __m512i abs = _mm512_and_si512(_mm512_castps_si512(f), _mm512_set1_epi32(kAbsMask));
  nonfinite +=
      __builtin_popcount(_mm512_mask_cmpgt_epi32_mask(m, abs, _mm512_set1_epi32(kMaxFinite)));
  return scaled ? _mm512_mul_ps(f, scale) : f;
}

template <bool kBF16>
__attribute__((target(ADAPTCOMM_AVX512))) inline __m512 WidenVector(const uint16_t* src,
                                                                    __mmask16 m, __m512 scale,
                                                                    bool scaled,
                                                                    size_t& nonfinite) {
  return kBF16 ? WidenVectorBF16(src, m, scale, scaled, nonfinite)
               : WidenVectorF16(src, m, scale, scaled, nonfinite);
}

template <bool kBF16>
__attribute__((target(ADAPTCOMM_AVX512))) CastStats WidenAvx512(const uint16_t* src, float* dst,
                                                                size_t n, float scale) {
  CastStats s;
  s.count = n;
  const __m512 vscale = _mm512_set1_ps(scale);
  const bool scaled = scale != 1.0f;
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    StoreF32(dst + i, m, WidenVector<kBF16>(src + i, m, vscale, scaled, s.nonfinite_inputs));
  }
  return s;
}

// Non-temporal stores for the 64-byte-aligned whole vectors (masked ordinary stores before and
// after them); the sfence orders them before whatever the caller publishes next.
template <bool kBF16>
__attribute__((target(ADAPTCOMM_AVX512))) CastStats WidenStreamAvx512(const uint16_t* src,
                                                                      float* dst, size_t n,
                                                                      float scale) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(dst);
  if (address % sizeof(float) != 0) return WidenAvx512<kBF16>(src, dst, n, scale);
  CastStats s;
  s.count = n;
  const __m512 vscale = _mm512_set1_ps(scale);
  const bool scaled = scale != 1.0f;
  const size_t head = std::min(n, ((64 - address % 64) % 64) / sizeof(float));
  if (head > 0) {
    const __mmask16 m = TailMask(head);
    StoreF32(dst, m, WidenVector<kBF16>(src, m, vscale, scaled, s.nonfinite_inputs));
  }
  size_t i = head;
  for (; i + 16 <= n; i += 16) {
    _mm512_stream_ps(dst + i, WidenVector<kBF16>(src + i, static_cast<__mmask16>(0xffff), vscale,
                                                 scaled, s.nonfinite_inputs));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    StoreF32(dst + i, m, WidenVector<kBF16>(src + i, m, vscale, scaled, s.nonfinite_inputs));
  }
  _mm_sfence();
  return s;
}

}  // namespace

__attribute__((target(ADAPTCOMM_AVX512))) CastStats BF16ToF32Avx512(const uint16_t* src, float* dst,
                                                                    size_t n, float scale) {
  return WidenAvx512<true>(src, dst, n, scale);
}

__attribute__((target(ADAPTCOMM_AVX512))) CastStats F16ToF32Avx512(const uint16_t* src, float* dst,
                                                                   size_t n, float scale) {
  return WidenAvx512<false>(src, dst, n, scale);
}

__attribute__((target(ADAPTCOMM_AVX512))) CastStats BF16ToF32StreamAvx512(const uint16_t* src,
                                                                          float* dst, size_t n,
                                                                          float scale) {
  return WidenStreamAvx512<true>(src, dst, n, scale);
}

__attribute__((target(ADAPTCOMM_AVX512))) CastStats F16ToF32StreamAvx512(const uint16_t* src,
                                                                         float* dst, size_t n,
                                                                         float scale) {
  return WidenStreamAvx512<false>(src, dst, n, scale);
}

__attribute__((target(ADAPTCOMM_AVX512))) void AccumulateBF16Avx512(const uint16_t* src, float* acc,
                                                                    size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(kAbsMask);
  const __m512i inf = _mm512_set1_epi32(kInf);
  const __m512i quiet = _mm512_set1_epi32(0x00400000);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    __m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(LoadI16(m, src + i)), 16);
    const __m512i abs = _mm512_and_si512(x, abs_mask);
    x = _mm512_mask_or_epi32(x, _mm512_cmpgt_epi32_mask(abs, inf), x, quiet);
    StoreF32(acc + i, m, AddKeepingAccNaN512(LoadF32(m, acc + i), _mm512_castsi512_ps(x)));
  }
}

__attribute__((target(ADAPTCOMM_AVX512))) void AccumulateF16Avx512(const uint16_t* src, float* acc,
                                                                   size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 w = _mm512_cvtph_ps(LoadI16(m, src + i));
    StoreF32(acc + i, m, AddKeepingAccNaN512(LoadF32(m, acc + i), w));
  }
}

__attribute__((target("avx2,f16c"))) void AccumulateBF16Avx2(const uint16_t* src, float* acc,
                                                             size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(kAbsMask);
  const __m256i inf = _mm256_set1_epi32(kInf);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    const __m256i abs = _mm256_and_si256(x, abs_mask);
    x = _mm256_or_si256(x, _mm256_and_si256(_mm256_cmpgt_epi32(abs, inf), quiet));
    _mm256_storeu_ps(acc + i,
                     AddKeepingAccNaN256(_mm256_loadu_ps(acc + i), _mm256_castsi256_ps(x)));
  }
  AccumulateBF16Scalar(src + i, acc + i, n - i);
}

__attribute__((target("avx2,f16c"))) void AccumulateF16Avx2(const uint16_t* src, float* acc,
                                                            size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(acc + i, AddKeepingAccNaN256(_mm256_loadu_ps(acc + i), w));
  }
  AccumulateF16Scalar(src + i, acc + i, n - i);
}

#else  // not x86: only the scalar path exists.

bool HasAvx2F16c() { return false; }
bool HasAvx512() { return false; }
bool HasAvx512Bf16() { return false; }
CastStats F32ToBF16Avx2(const float* s, uint16_t* d, size_t n) { return F32ToBF16Scalar(s, d, n); }
CastStats F32ToF16Avx2(const float* s, uint16_t* d, size_t n) { return F32ToF16Scalar(s, d, n); }
CastStats BF16ToF32Avx2(const uint16_t* s, float* d, size_t n, float k) {
  return BF16ToF32Scalar(s, d, n, k);
}
CastStats F16ToF32Avx2(const uint16_t* s, float* d, size_t n, float k) {
  return F16ToF32Scalar(s, d, n, k);
}
CastStats F32ToBF16Avx512(const float* s, uint16_t* d, size_t n) {
  return F32ToBF16Scalar(s, d, n);
}
CastStats F32ToBF16Avx512Bf16(const float* s, uint16_t* d, size_t n) {
  return F32ToBF16Scalar(s, d, n);
}
CastStats F32ToF16Avx512(const float* s, uint16_t* d, size_t n) { return F32ToF16Scalar(s, d, n); }
CastStats F32ToBF16StreamAvx512(const float* s, uint16_t* d, size_t n) {
  return F32ToBF16Scalar(s, d, n);
}
CastStats F32ToBF16StreamAvx512Bf16(const float* s, uint16_t* d, size_t n) {
  return F32ToBF16Scalar(s, d, n);
}
CastStats F32ToF16StreamAvx512(const float* s, uint16_t* d, size_t n) {
  return F32ToF16Scalar(s, d, n);
}
CastStats BF16ToF32Avx512(const uint16_t* s, float* d, size_t n, float k) {
  return BF16ToF32Scalar(s, d, n, k);
}
CastStats F16ToF32Avx512(const uint16_t* s, float* d, size_t n, float k) {
  return F16ToF32Scalar(s, d, n, k);
}
CastStats BF16ToF32StreamAvx512(const uint16_t* s, float* d, size_t n, float k) {
  return BF16ToF32Scalar(s, d, n, k);
}
CastStats F16ToF32StreamAvx512(const uint16_t* s, float* d, size_t n, float k) {
  return F16ToF32Scalar(s, d, n, k);
}
void AccumulateBF16Avx512(const uint16_t* s, float* a, size_t n) { AccumulateBF16Scalar(s, a, n); }
void AccumulateF16Avx512(const uint16_t* s, float* a, size_t n) { AccumulateF16Scalar(s, a, n); }
void AccumulateBF16Avx2(const uint16_t* s, float* a, size_t n) { AccumulateBF16Scalar(s, a, n); }
void AccumulateF16Avx2(const uint16_t* s, float* a, size_t n) { AccumulateF16Scalar(s, a, n); }

#endif

}  // namespace adaptcomm::precision::x86

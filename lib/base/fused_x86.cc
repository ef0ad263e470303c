// x86 fused reduce-and-round kernels (fused_kernels.h). Same target-attribute scheme as
// cast_x86.cc: the dispatch in fused_kernels.cc calls one only on a CPU that has its instructions.
//
// The AVX-512 kernels are compute-bound (up to four streams and ~40 vector ops per 16 elements,
// each 512-bit op double-pumped on AMD Zen 4), so they run a short fast path and fall back to an
// exact per-vector path only where the two could differ:
//   fast: plain widen, plain fp32 add, integer rounding without the NaN blend, no counting;
//   exact: the NaN-quieting widen, the add that keeps a NaN accumulator, the NaN blend, counts.
// The fast path is taken only when no lane of the owner's input has |x| above the wire's overflow
// threshold (which covers NaN and Inf) and no lane of the fp32 sum has either. Then every input is
// finite (a NaN or Inf input makes the sum NaN or Inf), so the plain add equals the NaN-keeping
// one, the roundings can neither overflow nor meet a NaN, and every count of the vector is zero:
// both paths give the same bits. Zero-masked tail lanes load as +0 and are never stored.
#include <algorithm>

#include "lib/base/cast_x86_simd.h"
#include "lib/base/fused_kernels.h"

namespace adaptcomm::precision::x86 {

#ifdef ADAPTCOMM_X86

namespace {

// widen(round_to_bf16(x)) as fp32 bits, for |x| <= kBF16OverflowMinus1 (no NaN, no carry into the
// sign bit).
__attribute__((target(ADAPTCOMM_AVX512))) inline __m512i RoundedBF16Bits(__m512i x) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb);
  return _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
}

template <bool kStream>
__attribute__((target(ADAPTCOMM_AVX512))) inline void StoreSum(uint16_t* dst, __mmask16 m,
                                                               __m256i h) {
  if (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), h);
  } else {
    StoreI16(dst, m, h);
  }
}

// 16-bit bf16 values zero-extended in 32-bit lanes -> fp32 bits, NaN quieted (BF16ToF32Bits).
__attribute__((target(ADAPTCOMM_AVX512))) inline __m512i WidenBF16Lanes512(__m512i h) {
  const __m512i x = _mm512_slli_epi32(h, 16);
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(kAbsMask));
  return _mm512_mask_or_epi32(x, _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(kInf)), x,
                              _mm512_set1_epi32(0x00400000));
}

__attribute__((target("avx2"))) inline __m256i WidenBF16Lanes256(__m256i h) {
  const __m256i x = _mm256_slli_epi32(h, 16);
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(kAbsMask));
  return _mm256_or_si256(x, _mm256_and_si256(_mm256_cmpgt_epi32(abs, _mm256_set1_epi32(kInf)),
                                             _mm256_set1_epi32(0x00400000)));
}

// The exact path for the 16 elements at i (tail: mask m).
__attribute__((target(ADAPTCOMM_AVX512))) void ExactVectorBF16(const ReduceRoundArgs& a, size_t i,
                                                               __mmask16 m, ReduceRoundStats& s) {
  const __m512i abs_mask = _mm512_set1_epi32(kAbsMask);
  const __m512i inf = _mm512_set1_epi32(kInf);
  const __m512i max_finite = _mm512_set1_epi32(kMaxFinite);
  const int from_own = a.own != nullptr ? a.self : -1;
  __m512 acc = _mm512_setzero_ps();
  for (int j = 0; j < a.n; ++j) {
    __m512i h;
    if (j == from_own) {
      const __m512i x = LoadI32(m, a.own + i);
      const __m512i abs = _mm512_and_si512(x, abs_mask);
      const __mmask16 nonfinite = _mm512_cmpgt_epi32_mask(abs, max_finite);
      s.own.nonfinite_inputs += __builtin_popcount(nonfinite);
      s.own.overflow += __builtin_popcount(
          _mm512_mask_cmpgt_epi32_mask(~nonfinite, abs, _mm512_set1_epi32(kBF16OverflowMinus1)));
      h = BF16Round16(x, _mm512_cmpgt_epi32_mask(abs, inf));
    } else {
      h = _mm512_cvtepu16_epi32(LoadI16(m, a.blocks[j] + i));
    }
    const __m512 w = _mm512_castsi512_ps(WidenBF16Lanes512(h));
    acc = j == 0 ? w : AddKeepingAccNaN512(acc, w);
  }
  const __m512i x = _mm512_castps_si512(acc);
  const __m512i r = BF16Round16(x, _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs_mask), inf));
  StoreI16(a.sum + i, m, _mm512_cvtepi32_epi16(r));
  const __m512i back = WidenBF16Lanes512(r);
  s.result_nonfinite += __builtin_popcount(
      _mm512_mask_cmpgt_epi32_mask(m, _mm512_and_si512(back, abs_mask), max_finite));
  if (a.out != nullptr) {
    __m512 f = _mm512_castsi512_ps(back);
    if (a.scale != 1.0f) f = _mm512_mul_ps(f, _mm512_set1_ps(a.scale));
    StoreF32(a.out + i, m, f);
  }
}

__attribute__((target(ADAPTCOMM_AVX512))) void ExactVectorF16(const ReduceRoundArgs& a, size_t i,
                                                              __mmask16 m, ReduceRoundStats& s) {
  const __m512i abs_mask = _mm512_set1_epi32(kAbsMask);
  const __m512i max_finite = _mm512_set1_epi32(kMaxFinite);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const int from_own = a.own != nullptr ? a.self : -1;
  __m512 acc = _mm512_setzero_ps();
  for (int j = 0; j < a.n; ++j) {
    __m256i h;
    if (j == from_own) {
      const __m512 v = LoadF32(m, a.own + i);
      const __m512i abs = _mm512_and_si512(_mm512_castps_si512(v), abs_mask);
      const __mmask16 nonfinite = _mm512_cmpgt_epi32_mask(abs, max_finite);
      s.own.nonfinite_inputs += __builtin_popcount(nonfinite);
      s.own.overflow += __builtin_popcount(
          _mm512_mask_cmpgt_epi32_mask(~nonfinite, abs, _mm512_set1_epi32(kF16OverflowMinus1)));
      h = _mm512_cvtps_ph(v, kRound);
    } else {
      h = LoadI16(m, a.blocks[j] + i);
    }
    const __m512 w = _mm512_cvtph_ps(h);
    acc = j == 0 ? w : AddKeepingAccNaN512(acc, w);
  }
  const __m256i r = _mm512_cvtps_ph(acc, kRound);
  StoreI16(a.sum + i, m, r);
  __m512 f = _mm512_cvtph_ps(r);
  s.result_nonfinite += __builtin_popcount(_mm512_mask_cmpgt_epi32_mask(
      m, _mm512_and_si512(_mm512_castps_si512(f), abs_mask), max_finite));
  if (a.out != nullptr) {
    if (a.scale != 1.0f) f = _mm512_mul_ps(f, _mm512_set1_ps(a.scale));
    StoreF32(a.out + i, m, f);
  }
}

// kN: the block count when it is 2 (the loop over contributions unrolls), 0 for any count.
// Elements [begin, end). kStream: non-temporal stores of `sum`, whose every vector here is whole
// and 32-byte aligned (see Split).
template <int kN, bool kOwn, bool kOut, bool kStream>
__attribute__((target(ADAPTCOMM_AVX512))) ReduceRoundStats FastBF16(const ReduceRoundArgs& a,
                                                                    size_t begin, size_t end) {
  ReduceRoundStats s;
  const int n = kN > 0 ? kN : a.n;
  const int self = kOwn ? a.self : -1;
  const __m512i abs_mask = _mm512_set1_epi32(kAbsMask);
  const __m512i over = _mm512_set1_epi32(kBF16OverflowMinus1);
  const __m512 vscale = _mm512_set1_ps(a.scale);
  const bool scaled = a.scale != 1.0f;
  for (size_t i = begin; i < end; i += 16) {
    const __mmask16 m = TailMask(end - i);
    __mmask16 big = 0;
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) {
      __m512i w;
      if (kOwn && j == self) {
        const __m512i x = LoadI32(m, a.own + i);
        big |= _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs_mask), over);
        w = RoundedBF16Bits(x);
      } else {
        w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(LoadI16(m, a.blocks[j] + i)), 16);
      }
      acc = j == 0 ? _mm512_castsi512_ps(w) : _mm512_add_ps(acc, _mm512_castsi512_ps(w));
    }
    const __m512i x = _mm512_castps_si512(acc);
    big |= _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs_mask), over);
    if (__builtin_expect(big != 0, 0)) {
      ExactVectorBF16(a, i, m, s);
      continue;
    }
    const __m512i r = RoundedBF16Bits(x);
    StoreSum<kStream>(a.sum + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    if (kOut) {
      __m512 f = _mm512_castsi512_ps(r);
      if (scaled) f = _mm512_mul_ps(f, vscale);
      StoreF32(a.out + i, m, f);
    }
  }
  return s;
}

template <int kN, bool kOwn, bool kOut, bool kStream>
__attribute__((target(ADAPTCOMM_AVX512))) ReduceRoundStats FastF16(const ReduceRoundArgs& a,
                                                                   size_t begin, size_t end) {
  ReduceRoundStats s;
  const int n = kN > 0 ? kN : a.n;
  const int self = kOwn ? a.self : -1;
  const __m512i abs_mask = _mm512_set1_epi32(kAbsMask);
  const __m512i over = _mm512_set1_epi32(kF16OverflowMinus1);
  const __m512 vscale = _mm512_set1_ps(a.scale);
  const bool scaled = a.scale != 1.0f;
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (size_t i = begin; i < end; i += 16) {
    const __mmask16 m = TailMask(end - i);
    __mmask16 big = 0;
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) {
      __m512 w;
      if (kOwn && j == self) {
        const __m512 v = LoadF32(m, a.own + i);
        big |= _mm512_cmpgt_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), abs_mask), over);
        w = _mm512_cvtph_ps(_mm512_cvtps_ph(v, kRound));
      } else {
        w = _mm512_cvtph_ps(LoadI16(m, a.blocks[j] + i));
      }
      acc = j == 0 ? w : _mm512_add_ps(acc, w);
    }
    big |= _mm512_cmpgt_epi32_mask(_mm512_and_si512(_mm512_castps_si512(acc), abs_mask), over);
    if (__builtin_expect(big != 0, 0)) {
      ExactVectorF16(a, i, m, s);
      continue;
    }
    const __m256i r = _mm512_cvtps_ph(acc, kRound);
    StoreSum<kStream>(a.sum + i, m, r);
    if (kOut) {
      __m512 f = _mm512_cvtph_ps(r);
      if (scaled) f = _mm512_mul_ps(f, vscale);
      StoreF32(a.out + i, m, f);
    }
  }
  return s;
}

template <bool kBF16, int kN, bool kOwn, bool kOut, bool kStream>
__attribute__((target(ADAPTCOMM_AVX512))) ReduceRoundStats Fast(const ReduceRoundArgs& a,
                                                                size_t begin, size_t end) {
  return kBF16 ? FastBF16<kN, kOwn, kOut, kStream>(a, begin, end)
               : FastF16<kN, kOwn, kOut, kStream>(a, begin, end);
}

void Add(ReduceRoundStats& total, const ReduceRoundStats& part) {
  Accumulate(total.own, part.own);
  total.result_nonfinite += part.result_nonfinite;
}

// With stream_sum: ordinary stores up to the first 32-byte boundary of `sum` and for the partial
// last vector, non-temporal ones between; the sfence orders them before the caller's next step.
template <bool kBF16, int kN, bool kOwn, bool kOut>
__attribute__((target(ADAPTCOMM_AVX512))) ReduceRoundStats Split(const ReduceRoundArgs& a) {
  ReduceRoundStats s;
  const uintptr_t address = reinterpret_cast<uintptr_t>(a.sum);
  if (!a.stream_sum || address % sizeof(uint16_t) != 0) {
    s = Fast<kBF16, kN, kOwn, kOut, false>(a, 0, a.count);
  } else {
    const size_t head = std::min(a.count, (32 - address % 32) % 32 / sizeof(uint16_t));
    const size_t body_end = head + (a.count - head) / 16 * 16;
    s = Fast<kBF16, kN, kOwn, kOut, false>(a, 0, head);
    Add(s, Fast<kBF16, kN, kOwn, kOut, true>(a, head, body_end));
    Add(s, Fast<kBF16, kN, kOwn, kOut, false>(a, body_end, a.count));
    _mm_sfence();
  }
  s.own.count = kOwn ? a.count : 0;
  return s;
}

template <bool kBF16>
__attribute__((target(ADAPTCOMM_AVX512))) ReduceRoundStats Dispatch(const ReduceRoundArgs& a) {
  const bool own = a.own != nullptr, out = a.out != nullptr;
  if (a.n == 2) {
    if (own) return out ? Split<kBF16, 2, true, true>(a) : Split<kBF16, 2, true, false>(a);
    return out ? Split<kBF16, 2, false, true>(a) : Split<kBF16, 2, false, false>(a);
  }
  if (own) return out ? Split<kBF16, 0, true, true>(a) : Split<kBF16, 0, true, false>(a);
  return out ? Split<kBF16, 0, false, true>(a) : Split<kBF16, 0, false, false>(a);
}

}  // namespace

__attribute__((target(ADAPTCOMM_AVX512))) ReduceRoundStats ReduceRoundBF16Avx512(
    const ReduceRoundArgs& a) {
  return Dispatch<true>(a);
}

__attribute__((target(ADAPTCOMM_AVX512))) ReduceRoundStats ReduceRoundF16Avx512(
    const ReduceRoundArgs& a) {
  return Dispatch<false>(a);
}

// ---- AVX2 (CPUs without AVX-512): one exact pass, 8 lanes, the scalar reference for the tail ----

__attribute__((target("avx2,f16c"))) ReduceRoundStats ReduceRoundBF16Avx2(
    const ReduceRoundArgs& a) {
  Avx2Counts c{_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i result_nonfinite = _mm256_setzero_si256();
  const __m256i abs_mask = _mm256_set1_epi32(kAbsMask);
  const __m256i max_finite = _mm256_set1_epi32(kMaxFinite);
  const __m256i over = _mm256_set1_epi32(kBF16OverflowMinus1);
  const __m256 vscale = _mm256_set1_ps(a.scale);
  const bool scaled = a.scale != 1.0f;
  const int from_own = a.own != nullptr ? a.self : -1;
  size_t i = 0;
  for (; i + 8 <= a.count; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < a.n; ++j) {
      __m256i h;
      if (j == from_own) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.own + i));
        CountNarrow(c, _mm256_and_si256(x, abs_mask), over);
        h = BF16Round8(x);
      } else {
        h = _mm256_cvtepu16_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.blocks[j] + i)));
      }
      const __m256 w = _mm256_castsi256_ps(WidenBF16Lanes256(h));
      acc = j == 0 ? w : AddKeepingAccNaN256(acc, w);
    }
    const __m256i r = BF16Round8(_mm256_castps_si256(acc));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.sum + i),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
    const __m256i back = WidenBF16Lanes256(r);
    result_nonfinite = _mm256_sub_epi32(
        result_nonfinite, _mm256_cmpgt_epi32(_mm256_and_si256(back, abs_mask), max_finite));
    if (a.out != nullptr) {
      __m256 f = _mm256_castsi256_ps(back);
      if (scaled) f = _mm256_mul_ps(f, vscale);
      _mm256_storeu_ps(a.out + i, f);
    }
  }
  ReduceRoundStats s = ReduceRoundBF16Scalar(a, i);
  s.own.count = a.own != nullptr ? a.count : 0;
  s.own.overflow += HorizontalSum(c.overflow);
  s.own.nonfinite_inputs += HorizontalSum(c.nonfinite);
  s.result_nonfinite += HorizontalSum(result_nonfinite);
  return s;
}

__attribute__((target("avx2,f16c"))) ReduceRoundStats ReduceRoundF16Avx2(const ReduceRoundArgs& a) {
  Avx2Counts c{_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i result_nonfinite = _mm256_setzero_si256();
  const __m256i abs_mask = _mm256_set1_epi32(kAbsMask);
  const __m256i max_finite = _mm256_set1_epi32(kMaxFinite);
  const __m256i over = _mm256_set1_epi32(kF16OverflowMinus1);
  const __m256 vscale = _mm256_set1_ps(a.scale);
  const bool scaled = a.scale != 1.0f;
  const int from_own = a.own != nullptr ? a.self : -1;
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  size_t i = 0;
  for (; i + 8 <= a.count; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < a.n; ++j) {
      __m128i h;
      if (j == from_own) {
        const __m256 v = _mm256_loadu_ps(a.own + i);
        CountNarrow(c, _mm256_and_si256(_mm256_castps_si256(v), abs_mask), over);
        h = _mm256_cvtps_ph(v, kRound);
      } else {
        h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.blocks[j] + i));
      }
      const __m256 w = _mm256_cvtph_ps(h);
      acc = j == 0 ? w : AddKeepingAccNaN256(acc, w);
    }
    const __m128i r = _mm256_cvtps_ph(acc, kRound);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.sum + i), r);
    __m256 f = _mm256_cvtph_ps(r);
    result_nonfinite = _mm256_sub_epi32(
        result_nonfinite,
        _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(f), abs_mask), max_finite));
    if (a.out != nullptr) {
      if (scaled) f = _mm256_mul_ps(f, vscale);
      _mm256_storeu_ps(a.out + i, f);
    }
  }
  ReduceRoundStats s = ReduceRoundF16Scalar(a, i);
  s.own.count = a.own != nullptr ? a.count : 0;
  s.own.overflow += HorizontalSum(c.overflow);
  s.own.nonfinite_inputs += HorizontalSum(c.nonfinite);
  s.result_nonfinite += HorizontalSum(result_nonfinite);
  return s;
}

#else  // not x86: only the scalar path exists.

ReduceRoundStats ReduceRoundBF16Avx512(const ReduceRoundArgs& a) {
  return ReduceRoundBF16Scalar(a);
}
ReduceRoundStats ReduceRoundF16Avx512(const ReduceRoundArgs& a) { return ReduceRoundF16Scalar(a); }
ReduceRoundStats ReduceRoundBF16Avx2(const ReduceRoundArgs& a) { return ReduceRoundBF16Scalar(a); }
ReduceRoundStats ReduceRoundF16Avx2(const ReduceRoundArgs& a) { return ReduceRoundF16Scalar(a); }

#endif

}  // namespace adaptcomm::precision::x86

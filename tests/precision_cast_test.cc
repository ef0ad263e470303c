// Cast kernels: the scalar reference against independent oracles, and every vector path this CPU
// has against the scalar reference, bit for bit (all 65536 fp16/bf16 patterns, fp32 edge cases,
// large random arrays), plus exact overflow/non-finite counts and the multi-threaded public path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "adaptcomm/precision.h"
#include "gtest/gtest.h"
#include "lib/base/cast_kernels.h"
#include "lib/base/fused_kernels.h"
#include "lib/gloo/gloo_reduce.h"
#include "lib/precision/cast_parallel.h"

namespace adaptcomm::precision {

// Readable parameters in test listings ("avx512" rather than "1-byte object <02>").
void PrintTo(CastPath path, std::ostream* os) { *os << CastPathName(path); }

namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float Float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
bool IsF16NaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool IsBF16NaN(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }

std::vector<uint16_t> AllPatterns() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

class PathTest : public ::testing::TestWithParam<CastPath> {};

std::string PathParamName(const ::testing::TestParamInfo<CastPath>& info) {
  return CastPathName(info.param);
}

// ---- the scalar reference against oracles that share none of its code ----

TEST(ScalarReference, F16ToF32MatchesMathematicalValue) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint32_t got = F16ToF32Bits(h);
    const int e = (h >> 10) & 0x1f;
    const int m = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0x1f) {
      if (m == 0) {
        EXPECT_EQ(got, (h & 0x8000 ? 0xff800000u : 0x7f800000u)) << std::hex << h;
      } else {
        EXPECT_EQ(got, (h & 0x8000 ? 0x80000000u : 0u) | 0x7fc00000u | (uint32_t(m) << 13))
            << std::hex << h;
      }
      continue;
    }
    const double value =
        e == 0 ? sign * std::ldexp(double(m), -24) : sign * std::ldexp(1.0 + m / 1024.0, e - 15);
    EXPECT_EQ(double(Float(got)), value) << std::hex << h;
    EXPECT_EQ(got >> 31, uint32_t(h >> 15)) << "sign of " << std::hex << h;
  }
}

// Nearest-even rounding checked by distances in double: no candidate is closer, and a tie goes
// to the even encoding.
void ExpectNearestEven(float x, uint16_t got, uint32_t (*widen)(uint16_t), const char* what) {
  const double xd = x;
  const double g = Float(widen(got));
  for (int delta : {-1, 1}) {
    const uint16_t other = static_cast<uint16_t>(got + delta);
    const uint32_t ob = widen(other);
    if ((ob & 0x7fffffff) > 0x7f800000) continue;                         // NaN neighbour
    if (((ob ^ widen(got)) >> 31) != 0 && (got & 0x7fff) != 0) continue;  // wrapped past 0
    const double o = Float(ob);
    ASSERT_LE(std::fabs(g - xd), std::fabs(o - xd))
        << what << " x=" << std::hexfloat << x << " got " << std::hex << got;
    if (std::fabs(g - xd) == std::fabs(o - xd)) {
      EXPECT_EQ(got & 1, 0) << what << " tie not to even, x=" << std::hexfloat << x;
    }
  }
}

TEST(ScalarReference, NarrowingIsNearestEvenOnRandomFiniteValues) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = rng();
    // Bias towards the fp16 range so both formats see normals, denormals and ties.
    if (i % 2) b = (b & 0x81ffffffu) | (uint32_t(100 + rng() % 44) << 23);
    if (i % 7 == 0) b &= 0xffffe000u | (1u << 12);  // exact fp16 ties / near-ties
    const float x = Float(b);
    if (!std::isfinite(x)) continue;
    const uint16_t bf = F32BitsToBF16(b);
    if ((bf & 0x7fff) != 0x7f80) ExpectNearestEven(x, bf, BF16ToF32Bits, "bf16");
    const uint16_t hf = F32BitsToF16(b);
    if (std::fabs(x) < 65520.0f) {
      ASSERT_NE(hf & 0x7fff, 0x7c00) << std::hexfloat << x;
      ExpectNearestEven(x, hf, F16ToF32Bits, "f16");
    } else {
      EXPECT_EQ(hf & 0x7fff, 0x7c00) << std::hexfloat << x;
    }
  }
}

#ifdef __FLT16_MAX__
// GCC's _Float16 conversion (libgcc soft-float without AVX512-FP16) is an independent RNE oracle.
TEST(ScalarReference, F32ToF16MatchesCompilerFloat16) {
  std::mt19937 rng(11);
  for (int i = 0; i < 300000; ++i) {
    uint32_t b = rng();
    if (i % 2) b = (b & 0x81ffffffu) | (uint32_t(96 + rng() % 48) << 23);
    const float x = Float(b);
    if (std::isnan(x)) continue;
    const _Float16 ref = static_cast<_Float16>(x);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(F32BitsToF16(b), ref_bits) << std::hexfloat << x;
  }
}
#endif

// ---- fp32 edge cases: exact expected bits and counts on every path ----

struct Edge {
  uint32_t f32;
  uint16_t f16;
  uint16_t bf16;
  const char* what;
};

const std::vector<Edge>& Edges() {
  static const std::vector<Edge> edges = {
      {0x3f800000, 0x3c00, 0x3f80, "1.0"},
      {0x3f801000, 0x3c00, 0x3f80, "fp16 tie down to even (1 + 2^-11)"},
      {0x3f803000, 0x3c02, 0x3f80, "fp16 tie up to even (1 + 3*2^-11)"},
      {0x3f801001, 0x3c01, 0x3f80, "just above an fp16 tie"},
      {0x3f808000, 0x3c04, 0x3f80, "bf16 tie down to even"},
      {0x3f818000, 0x3c0c, 0x3f82, "bf16 tie up to even"},
      {0x3f808001, 0x3c04, 0x3f81, "just above a bf16 tie"},
      {0x477fe000, 0x7bff, 0x4780, "65504 = fp16 max finite"},
      {0x477fefff, 0x7bff, 0x4780, "just below the fp16 overflow boundary"},
      {0x477ff000, 0x7c00, 0x4780, "65520: fp16 overflow (tie to even = Inf)"},
      {0xc77ff000, 0xfc00, 0xc780, "-65520"},
      {0x7f7fffff, 0x7c00, 0x7f80, "FLT_MAX: overflows both"},
      {0x7f7f7fff, 0x7c00, 0x7f7f, "largest value that stays finite in bf16"},
      {0x7f7f8000, 0x7c00, 0x7f80, "bf16 overflow boundary"},
      {0x33800000, 0x0001, 0x3380, "2^-24: fp16 min denormal"},
      {0x33000000, 0x0000, 0x3300, "2^-25: tie to even zero"},
      {0x33000001, 0x0001, 0x3300, "just above 2^-25"},
      {0x33c00000, 0x0002, 0x33c0, "3*2^-25: tie up to 2"},
      {0x387fc000, 0x03ff, 0x3880, "fp16 max denormal"},
      {0x387ff000, 0x0400, 0x3880, "rounds from denormal into min normal"},
      {0x38800000, 0x0400, 0x3880, "2^-14: fp16 min normal"},
      {0x00000001, 0x0000, 0x0000, "fp32 min denormal"},
      {0x00018000, 0x0000, 0x0002, "fp32 denormal, bf16 tie up"},
      {0x80400000, 0x8000, 0x8040, "negative fp32 denormal kept by bf16"},
      {0x007fffff, 0x0000, 0x0080, "fp32 max denormal rounds to bf16 min normal"},
      {0x00000000, 0x0000, 0x0000, "+0"},
      {0x80000000, 0x8000, 0x8000, "-0"},
      {0x7f800000, 0x7c00, 0x7f80, "+Inf"},
      {0xff800000, 0xfc00, 0xff80, "-Inf"},
      {0x7fc00000, 0x7e00, 0x7fc0, "canonical quiet NaN"},
      {0x7f800001, 0x7e00, 0x7fc0, "signalling NaN, payload in low bits only"},
      {0x7f802000, 0x7e01, 0x7fc0, "signalling NaN, payload bit 13"},
      {0x7f810000, 0x7e08, 0x7fc1, "signalling NaN, payload bit 16"},
      {0xffa00000, 0xff00, 0xffe0, "negative signalling NaN"},
      {0x7fffffff, 0x7fff, 0x7fff, "all-ones NaN"},
  };
  return edges;
}

constexpr uint32_t kNonFiniteF32Mask = 0x7f800000;

TEST_P(PathTest, EdgeCasesGiveExactBitsAndCounts) {
  const CastPath path = GetParam();
  // Each edge alone (tail code) and inside a long array at every lane position (vector code).
  for (const Edge& e : Edges()) {
    const bool nonfinite = (e.f32 & kNonFiniteF32Mask) == kNonFiniteF32Mask;
    const bool f16_over = !nonfinite && (e.f16 & 0x7fff) == 0x7c00;
    const bool bf16_over = !nonfinite && (e.bf16 & 0x7fff) == 0x7f80;
    for (size_t n : {size_t{1}, size_t{67}}) {
      for (size_t pos = 0; pos < n; pos += (n == 1 ? 1 : 3)) {
        std::vector<float> src(n, 0.5f);
        src[pos] = Float(e.f32);
        std::vector<uint16_t> h(n), b(n);
        const CastStats sh = F32ToF16(path, src.data(), h.data(), n);
        const CastStats sb = F32ToBF16(path, src.data(), b.data(), n);
        ASSERT_EQ(h[pos], e.f16) << e.what << " pos " << pos << " n " << n;
        ASSERT_EQ(b[pos], e.bf16) << e.what << " pos " << pos << " n " << n;
        ASSERT_EQ(h[(pos + 1) % n], n == 1 ? e.f16 : 0x3800) << e.what;
        ASSERT_EQ(sh.overflow, f16_over ? 1u : 0u) << e.what;
        ASSERT_EQ(sb.overflow, bf16_over ? 1u : 0u) << e.what;
        ASSERT_EQ(sh.nonfinite_inputs, nonfinite ? 1u : 0u) << e.what;
        ASSERT_EQ(sb.nonfinite_inputs, nonfinite ? 1u : 0u) << e.what;
        ASSERT_EQ(sh.count, n);
      }
    }
  }
}

// ---- all 65536 patterns: to fp32 and back ----

TEST_P(PathTest, EveryF16PatternWidensAndRoundTrips) {
  const CastPath path = GetParam();
  const std::vector<uint16_t> all = AllPatterns();
  std::vector<float> wide(all.size());
  const CastStats sw = F16ToF32(path, all.data(), wide.data(), all.size());
  size_t nonfinite = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(Bits(wide[i]), F16ToF32Bits(all[i])) << std::hex << i;
    nonfinite += (i & 0x7c00) == 0x7c00;
  }
  EXPECT_EQ(sw.nonfinite_inputs, nonfinite);
  EXPECT_EQ(sw.nonfinite_inputs, 2048u);
  std::vector<uint16_t> back(all.size());
  const CastStats sn = F32ToF16(path, wide.data(), back.data(), all.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t want = IsF16NaN(all[i]) ? static_cast<uint16_t>(all[i] | 0x0200) : all[i];
    ASSERT_EQ(back[i], want) << std::hex << i;
  }
  EXPECT_EQ(sn.overflow, 0u);  // only Inf inputs reach Inf
  EXPECT_EQ(sn.nonfinite_inputs, nonfinite);
}

TEST_P(PathTest, EveryBF16PatternWidensAndRoundTrips) {
  const CastPath path = GetParam();
  const std::vector<uint16_t> all = AllPatterns();
  std::vector<float> wide(all.size());
  const CastStats sw = BF16ToF32(path, all.data(), wide.data(), all.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(Bits(wide[i]), BF16ToF32Bits(all[i])) << std::hex << i;
    if (!IsBF16NaN(all[i])) {
      ASSERT_EQ(Bits(wide[i]), i << 16) << "exact embedding " << i;
    }
  }
  EXPECT_EQ(sw.nonfinite_inputs, 256u);  // 2 signs x 128 mantissas
  std::vector<uint16_t> back(all.size());
  const CastStats sn = F32ToBF16(path, wide.data(), back.data(), all.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t want = IsBF16NaN(all[i]) ? static_cast<uint16_t>(all[i] | 0x0040) : all[i];
    ASSERT_EQ(back[i], want) << std::hex << i;
  }
  EXPECT_EQ(sn.overflow, 0u);
}

// ---- large random arrays: vector path == scalar, bits and counts ----

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t b = rng();
    switch (i % 4) {
      case 0:  // anything: NaNs (all payloads), Inf, denormals, huge
        break;
      case 1:  // the fp16 range incl. its overflow boundary and denormals
        b = (b & 0x81ffffffu) | (uint32_t(98 + rng() % 46) << 23);
        break;
      case 2:  // ties and near-ties for both formats
        b = (b & 0xffff0000u) | ((rng() % 3 == 0) ? 0x8000u : (b & 0x1fffu) | 0x1000u);
        break;
      default:  // gradient-like normal values
        v[i] = std::ldexp(float(int(rng() % 2001) - 1000), -int(rng() % 20));
        continue;
    }
    v[i] = Float(b);
  }
  return v;
}

void ExpectSameStats(const CastStats& a, const CastStats& b, const char* what) {
  EXPECT_EQ(a.count, b.count) << what;
  EXPECT_EQ(a.overflow, b.overflow) << what;
  EXPECT_EQ(a.nonfinite_inputs, b.nonfinite_inputs) << what;
}

TEST_P(PathTest, RandomArraysMatchScalarBitsAndCounts) {
  const CastPath path = GetParam();
  const size_t n = (1 << 20) + 13;  // odd tail
  const std::vector<float> src = RandomFloats(n, 1234);
  std::vector<uint16_t> ref(n), got(n);
  ExpectSameStats(F32ToF16(path, src.data(), got.data(), n),
                  F32ToF16Scalar(src.data(), ref.data(), n), "f16");
  ASSERT_EQ(std::memcmp(ref.data(), got.data(), n * 2), 0);
  ExpectSameStats(F32ToBF16(path, src.data(), got.data(), n),
                  F32ToBF16Scalar(src.data(), ref.data(), n), "bf16");
  ASSERT_EQ(std::memcmp(ref.data(), got.data(), n * 2), 0);

  // Widening, plain and scaled (the scale is applied in fp32 by every path alike).
  std::vector<uint16_t> halves(n);
  std::mt19937 rng(99);
  for (auto& h : halves) h = static_cast<uint16_t>(rng());
  std::vector<float> wref(n), wgot(n);
  for (float scale : {1.0f, 0.25f, 1.0f / 3.0f}) {
    ExpectSameStats(F16ToF32(path, halves.data(), wgot.data(), n, scale),
                    F16ToF32Scalar(halves.data(), wref.data(), n, scale), "f16->f32");
    ASSERT_EQ(std::memcmp(wref.data(), wgot.data(), n * 4), 0) << "scale " << scale;
    ExpectSameStats(BF16ToF32(path, halves.data(), wgot.data(), n, scale),
                    BF16ToF32Scalar(halves.data(), wref.data(), n, scale), "bf16->f32");
    ASSERT_EQ(std::memcmp(wref.data(), wgot.data(), n * 4), 0) << "scale " << scale;
  }
}

TEST_P(PathTest, AccumulateMatchesScalar) {
  const CastPath path = GetParam();
  const size_t n = 100000 + 7;
  std::vector<uint16_t> halves(n);
  std::mt19937 rng(21);
  for (auto& h : halves) h = static_cast<uint16_t>(rng());
  const std::vector<float> start = RandomFloats(n, 8);
  for (bool f16 : {false, true}) {
    std::vector<float> ref = start, got = start;
    if (f16) {
      AccumulateF16Scalar(halves.data(), ref.data(), n);
      AccumulateF16(path, halves.data(), got.data(), n);
    } else {
      AccumulateBF16Scalar(halves.data(), ref.data(), n);
      AccumulateBF16(path, halves.data(), got.data(), n);
    }
    ASSERT_EQ(std::memcmp(ref.data(), got.data(), n * 4), 0) << (f16 ? "f16" : "bf16");
  }
}

TEST_P(PathTest, EveryLengthUpTo70) {
  const CastPath path = GetParam();
  const std::vector<float> src = RandomFloats(70, 5);
  for (size_t n = 0; n <= 70; ++n) {
    std::vector<uint16_t> ref(n + 1, 0xabcd), got(n + 1, 0xabcd);
    F32ToBF16Scalar(src.data(), ref.data(), n);
    F32ToBF16(path, src.data(), got.data(), n);
    ASSERT_EQ(ref, got) << "n=" << n;  // includes the guard element: no write past the end
    F32ToF16Scalar(src.data(), ref.data(), n);
    F32ToF16(path, src.data(), got.data(), n);
    ASSERT_EQ(ref, got) << "n=" << n;
  }
}

// ---- the fused reduce-and-round kernels of the split allreduce ----

struct FusedResult {
  std::vector<uint16_t> sum;
  std::vector<float> out;
  ReduceRoundStats stats;
};

// The oracle: the separate scalar kernels, one pass each, as the unfused split path ran them.
FusedResult ComposedReference(bool f16, const std::vector<std::vector<uint16_t>>& blocks, int self,
                              const float* own, size_t count, float scale) {
  FusedResult r;
  std::vector<uint16_t> own_wire(count);
  if (own != nullptr) {
    r.stats.own = f16 ? F32ToF16Scalar(own, own_wire.data(), count)
                      : F32ToBF16Scalar(own, own_wire.data(), count);
  }
  std::vector<float> acc(count);
  for (size_t j = 0; j < blocks.size(); ++j) {
    const uint16_t* src =
        own != nullptr && static_cast<int>(j) == self ? own_wire.data() : blocks[j].data();
    if (j == 0) {
      f16 ? F16ToF32Scalar(src, acc.data(), count, 1.0f)
          : BF16ToF32Scalar(src, acc.data(), count, 1.0f);
    } else {
      f16 ? AccumulateF16Scalar(src, acc.data(), count)
          : AccumulateBF16Scalar(src, acc.data(), count);
    }
  }
  r.sum.resize(count);
  f16 ? F32ToF16Scalar(acc.data(), r.sum.data(), count)
      : F32ToBF16Scalar(acc.data(), r.sum.data(), count);
  r.out.resize(count);
  r.stats.result_nonfinite = (f16 ? F16ToF32Scalar(r.sum.data(), r.out.data(), count, scale)
                                  : BF16ToF32Scalar(r.sum.data(), r.out.data(), count, scale))
                                 .nonfinite_inputs;
  return r;
}

// Runs the fused kernel on `path`; `in_place`: out is the own buffer and sum the own wire block.
// `stream`: stream_sum, with `sum` `sum_offset` elements into its buffer (every alignment of the
// non-temporal body); the element before it is a guard too.
FusedResult RunFused(CastPath path, bool f16, std::vector<std::vector<uint16_t>> blocks, int self,
                     const float* own, size_t count, float scale, bool with_out, bool in_place,
                     bool stream = false, size_t sum_offset = 0) {
  FusedResult r;
  std::vector<const uint16_t*> ptrs;
  for (auto& b : blocks) {
    b.push_back(0xdead);  // a guard element: must stay unread and unwritten
    ptrs.push_back(b.data());
  }
  std::vector<float> own_copy;
  if (own != nullptr) own_copy.assign(own, own + count);
  own_copy.push_back(-7.0f);
  std::vector<uint16_t> sum_buffer(sum_offset + count + 1, 0xabcd);
  r.out.assign(count + 1, 123.0f);
  ReduceRoundArgs a;
  a.blocks = ptrs.data();
  a.n = static_cast<int>(blocks.size());
  a.self = self;
  a.own = own != nullptr ? own_copy.data() : nullptr;
  a.sum = in_place && own == nullptr ? blocks[self].data() : sum_buffer.data() + sum_offset;
  a.out = !with_out ? nullptr : in_place && own != nullptr ? own_copy.data() : r.out.data();
  a.count = count;
  a.scale = scale;
  a.stream_sum = stream;
  r.stats = f16 ? ReduceRoundF16(path, a) : ReduceRoundBF16(path, a);
  r.sum.assign(a.sum, a.sum + count + 1);
  for (size_t i = 0; i < sum_offset; ++i) {
    EXPECT_EQ(sum_buffer[i], 0xabcd) << "wrote before sum";
  }
  if (a.out == own_copy.data()) r.out = own_copy;
  return r;
}

void ExpectFusedEq(const FusedResult& want, const FusedResult& got, size_t count, bool with_out,
                   const std::string& what) {
  ASSERT_EQ(got.sum.size(), count + 1) << what;
  ASSERT_TRUE(count == 0 || std::memcmp(want.sum.data(), got.sum.data(), count * 2) == 0) << what;
  EXPECT_TRUE(got.sum[count] == 0xabcd || got.sum[count] == 0xdead) << what << ": wrote past end";
  ASSERT_EQ(got.out.size(), count + 1) << what;
  if (with_out) {
    ASSERT_TRUE(count == 0 || std::memcmp(want.out.data(), got.out.data(), count * 4) == 0) << what;
    EXPECT_TRUE(got.out[count] == 123.0f || got.out[count] == -7.0f) << what << ": wrote past end";
  } else {
    for (float f : got.out) ASSERT_EQ(f, 123.0f) << what << ": out written although null";
  }
  ExpectSameStats(got.stats.own, want.stats.own, what.c_str());
  EXPECT_EQ(got.stats.result_nonfinite, want.stats.result_nonfinite) << what;
}

// Every wire pattern in every rank position, each against a shuffled partner set, with and
// without an fp32 own contribution, in place and not, 2-4 blocks, on every path.
TEST_P(PathTest, FusedReduceRoundMatchesTheSeparateKernelsOnEveryPattern) {
  const CastPath path = GetParam();
  const size_t count = 65536;
  const std::vector<float> own = RandomFloats(count, 42);
  for (int n : {2, 3, 4}) {
    std::vector<std::vector<uint16_t>> blocks;
    for (int j = 0; j < n; ++j) {
      std::vector<uint16_t> b = AllPatterns();
      if (j > 0) std::shuffle(b.begin(), b.end(), std::mt19937(j));
      blocks.push_back(std::move(b));
    }
    for (bool f16 : {false, true}) {
      for (int self : {0, n - 1}) {
        for (bool with_own : {false, true}) {
          const float* o = with_own ? own.data() : nullptr;
          const float scale = n == 3 ? 1.0f / 3.0f : 1.0f;
          const FusedResult want = ComposedReference(f16, blocks, self, o, count, scale);
          for (bool in_place : {false, true}) {
            const std::string what = std::string(CastPathName(path)) + (f16 ? " f16" : " bf16") +
                                     " n=" + std::to_string(n) + " self=" + std::to_string(self) +
                                     (with_own ? " own" : "") + (in_place ? " in place" : "");
            ExpectFusedEq(want, RunFused(path, f16, blocks, self, o, count, scale, true, in_place),
                          count, true, what);
            if (::testing::Test::HasFailure()) return;
          }
        }
      }
    }
  }
}

// Lengths 0..70 (vector bodies, masked/scalar tails, guard elements), with and without the
// output, on fp32 edge cases (NaN payloads, overflow boundaries, denormals) as own contribution.
TEST_P(PathTest, FusedReduceRoundEveryLengthAndEdges) {
  const CastPath path = GetParam();
  std::vector<float> own = RandomFloats(70, 6);
  for (size_t i = 0; i < Edges().size() && i < own.size(); ++i)
    own[i * 2 % 70] = Float(Edges()[i].f32);
  std::mt19937 rng(11);
  std::vector<std::vector<uint16_t>> blocks(2, std::vector<uint16_t>(70));
  for (auto& b : blocks)
    for (auto& h : b) h = static_cast<uint16_t>(rng());
  for (size_t count = 0; count <= 70; ++count) {
    std::vector<std::vector<uint16_t>> cut;
    for (const auto& b : blocks) cut.emplace_back(b.begin(), b.begin() + count);
    for (bool f16 : {false, true}) {
      for (float scale : {1.0f, 0.5f}) {
        const FusedResult want = ComposedReference(f16, cut, 1, own.data(), count, scale);
        for (bool with_out : {false, true}) {
          const std::string what = std::string(CastPathName(path)) + (f16 ? " f16" : " bf16") +
                                   " count=" + std::to_string(count);
          ExpectFusedEq(want,
                        RunFused(path, f16, cut, 1, own.data(), count, scale, with_out, false),
                        count, with_out, what);
          ExpectFusedEq(want,
                        RunFused(path, f16, cut, 1, own.data(), count, scale, with_out, false,
                                 /*stream=*/true, count % 17),
                        count, with_out, what + " streamed");
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

// Gradient-like finite data (the kernels' fast path) with specials planted in some vectors at
// every lane position: NaN payloads (one whose rounding would carry into the sign), Inf, owner
// values at the overflow boundaries, finite pairs whose sum overflows, denormals. Vectors with and
// without specials alternate, so the fast and the exact path both run and must agree.
TEST_P(PathTest, FusedReduceRoundFastAndExactPathsAgree) {
  const CastPath path = GetParam();
  const size_t count = 4096 + 5;
  std::mt19937 rng(5);
  std::vector<float> own(count);
  for (auto& x : own) x = std::ldexp(float(int(rng() % 2001) - 1000), -int(rng() % 24));
  for (bool f16 : {false, true}) {
    std::vector<std::vector<uint16_t>> blocks(3, std::vector<uint16_t>(count));
    for (auto& b : blocks) {
      for (size_t i = 0; i < count; ++i) {
        const float x = std::ldexp(float(int(rng() % 2001) - 1000), -int(rng() % 20));
        b[i] = f16 ? F32BitsToF16(Bits(x)) : F32BitsToBF16(Bits(x));
      }
    }
    std::vector<float> o = own;
    const uint32_t big_finite = f16 ? 0x477fe000u : 0x7f7f0000u;  // max finite of the wire
    const uint32_t own_specials[] = {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0x7f800000u,
                                     0xff800000u, 0x7f7f8000u, 0x7f7f7fffu, 0x477ff000u,
                                     0x477fefffu, 0x00000001u, 0x80400000u, big_finite};
    size_t k = 0;
    for (size_t v = 1; v * 16 + 16 <= count; v += 3) {  // every third vector gets one special
      const size_t i = v * 16 + (v / 3) % 16;
      switch (v % 4) {
        case 0:
          o[i] = Float(own_specials[k++ % std::size(own_specials)]);
          break;
        case 1:  // a peer NaN or Inf
          blocks[1][i] = f16 ? ((v & 1) ? 0x7c00 : 0xfe01) : ((v & 1) ? 0x7f80 : 0xff81);
          break;
        default:  // finite + finite overflowing in the sum
          o[i] = Float(big_finite);
          blocks[1][i] = f16 ? 0x7bff : 0x7f7f;
          break;
      }
    }
    for (int n : {2, 3}) {
      std::vector<std::vector<uint16_t>> cut(blocks.begin(), blocks.begin() + n);
      for (int self = 0; self < n; ++self) {
        for (float scale : {1.0f, 0.5f}) {
          const FusedResult want = ComposedReference(f16, cut, self, o.data(), count, scale);
          ASSERT_GT(want.stats.result_nonfinite, 10u);
          const std::string what = std::string(CastPathName(path)) + (f16 ? " f16" : " bf16") +
                                   " n=" + std::to_string(n) + " self=" + std::to_string(self);
          for (bool in_place : {false, true}) {
            ExpectFusedEq(want,
                          RunFused(path, f16, cut, self, o.data(), count, scale, true, in_place),
                          count, true, what);
          }
          for (size_t offset : {0, 1, 5, 16}) {  // every head length of the streamed body
            ExpectFusedEq(want,
                          RunFused(path, f16, cut, self, o.data(), count, scale, true, false,
                                   /*stream=*/true, offset),
                          count, true, what + " streamed at +" + std::to_string(offset));
          }
          const FusedResult wire_only = ComposedReference(f16, cut, self, nullptr, count, scale);
          ExpectFusedEq(wire_only,
                        RunFused(path, f16, cut, self, nullptr, count, scale, false, true), count,
                        false, what + " wire only");
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

// Non-temporal narrowing: the bits and counts of the plain kernels at every destination alignment,
// and no write outside [0, n).
TEST_P(PathTest, StreamingNarrowingMatchesThePlainKernels) {
  const CastPath path = GetParam();
  const std::vector<float> src = RandomFloats(100000 + 3, 31);
  for (bool f16 : {false, true}) {
    auto plain = f16 ? F32ToF16 : F32ToBF16;
    auto stream = f16 ? F32ToF16Stream : F32ToBF16Stream;
    for (size_t offset = 0; offset < 17; ++offset) {
      for (size_t n :
           {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{33}, size_t{70}, src.size()}) {
        std::vector<uint16_t> want(n), got(n + 40, 0x5a5a);
        const CastStats ws = plain(path, src.data(), want.data(), n);
        const CastStats gs = stream(path, src.data(), got.data() + offset, n);
        ASSERT_TRUE(n == 0 || std::memcmp(got.data() + offset, want.data(), n * 2) == 0)
            << CastPathName(path) << " offset " << offset << " n " << n;
        for (size_t i = 0; i < got.size(); ++i) {
          if (i < offset || i >= offset + n) {
            ASSERT_EQ(got[i], 0x5a5a) << "wrote at " << i;
          }
        }
        ExpectSameStats(gs, ws, f16 ? "f16 stream" : "bf16 stream");
      }
    }
  }
}

// Non-temporal widening: the bits and counts of the plain kernels, at every destination alignment
// (head, aligned body, tail), for every pattern and scale, and no write outside [0, n).
TEST_P(PathTest, StreamingWideningMatchesThePlainKernels) {
  const CastPath path = GetParam();
  const std::vector<uint16_t> all = AllPatterns();
  for (bool f16 : {false, true}) {
    auto plain = f16 ? F16ToF32 : BF16ToF32;
    auto stream = f16 ? F16ToF32Stream : BF16ToF32Stream;
    for (float scale : {1.0f, 0.25f}) {
      std::vector<float> want(all.size());
      const CastStats ws = plain(path, all.data(), want.data(), all.size(), scale);
      for (size_t offset = 0; offset < 17; ++offset) {
        for (size_t n :
             {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{33}, size_t{70}, all.size()}) {
          std::vector<float> got(n + 40, -3.0f);
          const CastStats gs = stream(path, all.data(), got.data() + offset, n, scale);
          ASSERT_TRUE(n == 0 || std::memcmp(got.data() + offset, want.data(), n * 4) == 0)
              << CastPathName(path) << " offset " << offset << " n " << n;
          for (size_t i = 0; i < got.size(); ++i) {
            if (i < offset || i >= offset + n) {
              ASSERT_EQ(got[i], -3.0f) << "wrote at " << i;
            }
          }
          if (n == all.size()) ExpectSameStats(gs, ws, f16 ? "f16 stream" : "bf16 stream");
          EXPECT_EQ(gs.count, n);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, PathTest, ::testing::ValuesIn(SupportedCastPaths()), PathParamName);

// The active path is measured at first use (lib/base/cast_dispatch.cc): a vector path whenever the
// CPU has one, and the one the public functions name.
TEST(CastPaths, MeasuredPathIsAVectorPathAndNamed) {
  const std::vector<CastPath> paths = SupportedCastPaths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.front(), CastPath::kScalar);
  const CastPath active = ActiveCastPath();
  EXPECT_TRUE(CastPathSupported(active));
  if (paths.size() > 1) {
    EXPECT_NE(active, CastPath::kScalar);
  }
  EXPECT_STREQ(CastImplementationName(), CastPathName(active));
  ::testing::Test::RecordProperty("cast_path", CastImplementationName());
}

// ---- overflow counting, exact, through the public multi-threaded functions ----

TEST(PublicCast, OverflowCountIsExactOnLargeParallelBuffer) {
  const size_t n = (size_t{6} << 20) / 4 + 5;  // 6 MiB of fp32: above the parallel threshold
  std::vector<float> src(n);
  std::mt19937 rng(3);
  size_t f16_over = 0, bf16_over = 0, nonfinite = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = rng() % 1000;
    float x = std::ldexp(float(rng() % 1000) / 1000.0f, int(rng() % 16));  // < 65520
    if (r == 0) {
      x = 65520.0f + float(rng() % 100000);  // overflows fp16 only
      ++f16_over;
    } else if (r == 1) {
      x = -Float(0x7f7f8000u + rng() % 0x8000u);  // overflows both
      ++f16_over;
      ++bf16_over;
    } else if (r == 2) {
      x = (rng() & 1) ? INFINITY : NAN;  // non-finite input: never an overflow
      ++nonfinite;
    } else if (r == 3) {
      x = 65504.0f;  // max finite: not an overflow
    }
    src[i] = x;
  }
  ASSERT_GT(f16_over, 1000u);
  std::vector<uint16_t> got(n), ref(n);
  const CastStats s16 = CastF32ToF16(src.data(), got.data(), n);
  const CastStats r16 = F32ToF16Scalar(src.data(), ref.data(), n);
  EXPECT_EQ(s16.overflow, f16_over);
  EXPECT_EQ(s16.nonfinite_inputs, nonfinite);
  EXPECT_EQ(s16.count, n);
  ExpectSameStats(s16, r16, "public f16");
  ASSERT_EQ(std::memcmp(ref.data(), got.data(), n * 2), 0);
  const CastStats sb = CastF32ToBF16(src.data(), got.data(), n);
  EXPECT_EQ(sb.overflow, bf16_over);
  EXPECT_EQ(sb.nonfinite_inputs, nonfinite);
  F32ToBF16Scalar(src.data(), ref.data(), n);
  ASSERT_EQ(std::memcmp(ref.data(), got.data(), n * 2), 0);

  std::vector<float> wide(n), wref(n);
  const CastStats w = CastF16ToF32(got.data(), wide.data(), n);  // got holds bf16 now: reuse
  F16ToF32Scalar(got.data(), wref.data(), n, 1.0f);
  EXPECT_EQ(w.count, n);
  ASSERT_EQ(std::memcmp(wref.data(), wide.data(), n * 4), 0);
  CastBF16ToF32(got.data(), wide.data(), n);
  BF16ToF32Scalar(got.data(), wref.data(), n, 1.0f);
  ASSERT_EQ(std::memcmp(wref.data(), wide.data(), n * 4), 0);
}

TEST(PublicCast, EveryPathThroughThePoolGivesTheSameBits) {
  const size_t n = 100003;
  const std::vector<float> src = RandomFloats(n, 77);
  std::vector<uint16_t> fast(n);
  CastF32ToF16(src.data(), fast.data(), n);
  for (CastPath path : SupportedCastPaths()) {
    std::vector<uint16_t> other(n);
    CastRequest req{CastKind::kF32ToF16, src.data(), other.data(), n};
    req.parallel_min_bytes = 0;
    req.threads = 3;
    req.path = path;
    std::shared_ptr<CastJob> job = StartCast(req);
    ASSERT_TRUE(job->Join().ok());
    EXPECT_EQ(fast, other) << CastPathName(path);
  }
}

TEST(CastJobTest, ChunksCoverTheBufferExactlyOnce) {
  for (size_t n : {size_t{0}, size_t{511}, size_t{512}, size_t{100000}, size_t{1000003}}) {
    for (int threads : {1, 2, 3, 7}) {
      std::vector<float> src = RandomFloats(n, 1);
      std::vector<uint16_t> got(n + 1, 0x5a5a), ref(n + 1, 0x5a5a);
      CastRequest req{CastKind::kF32ToBF16, src.data(), got.data(), n};
      req.parallel_min_bytes = 0;
      req.threads = threads;
      std::shared_ptr<CastJob> job = StartCast(req);
      ASSERT_TRUE(job->Wait(absl::Seconds(30)).ok());  // the pool alone finishes it
      EXPECT_TRUE(job->done());
      const CastStats ref_stats = F32ToBF16Scalar(src.data(), ref.data(), n);
      ASSERT_EQ(got, ref) << n << " x " << threads;
      ExpectSameStats(job->stats(), ref_stats, "job");
    }
  }
}

// The Gloo backend's bf16/f16 sum runs on these kernels (lib/gloo/gloo_reduce.cc): it must give
// the bits of its own scalar definition, round(widen(a) + widen(b)), on every path, for every
// pattern of a against shuffled patterns of b, in place (out == a, out == b) and not.
TEST(GlooReduce, VectorizedHalfSumsMatchTheScalarDefinition) {
  namespace gb = ::adaptcomm::gloo_backend;
  const std::vector<uint16_t> a = AllPatterns();
  std::vector<uint16_t> b = a;
  std::shuffle(b.begin(), b.end(), std::mt19937(7));
  for (CastPath path : SupportedCastPaths()) {
    for (bool bf16 : {true, false}) {
      const gb::ReduceFn fn = gb::GetReduceFn(bf16 ? DType::kBF16 : DType::kF16, ReduceOp::kSum);
      ASSERT_EQ(fn, gb::GetReduceFn(bf16 ? DType::kBF16 : DType::kF16, ReduceOp::kAvg));
      std::vector<uint16_t> out(a.size()), in_a = a, in_b = b, active(a.size());
      gb::SumHalves(path, bf16, out.data(), a.data(), b.data(), a.size());
      gb::SumHalves(path, bf16, in_a.data(), in_a.data(), b.data(), a.size());
      gb::SumHalves(path, bf16, in_b.data(), a.data(), in_b.data(), a.size());
      fn(active.data(), a.data(), b.data(), a.size());  // the measured path, through Gloo's API
      for (size_t i = 0; i < a.size(); ++i) {
        const uint16_t want = bf16 ? gb::FloatToBf16(gb::Bf16ToFloat(a[i]) + gb::Bf16ToFloat(b[i]))
                                   : gb::FloatToHalf(gb::HalfToFloat(a[i]) + gb::HalfToFloat(b[i]));
        const bool nan = bf16 ? IsBF16NaN(want) : IsF16NaN(want);
        for (uint16_t got : {out[i], in_a[i], in_b[i], active[i]}) {
          if (nan) {  // which NaN payload survives NaN + NaN is the hardware's choice
            ASSERT_TRUE(bf16 ? IsBF16NaN(got) : IsF16NaN(got)) << CastPathName(path) << " " << i;
          } else {
            ASSERT_EQ(got, want) << CastPathName(path) << (bf16 ? " bf16 " : " f16 ") << a[i]
                                 << " + " << b[i];
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace adaptcomm::precision

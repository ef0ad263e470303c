// The run-time choice among the cast kernels and the dispatch to them (cast_kernels.h).
//
// The choice is measured, not assumed: where AVX-512 exists it is not always the fastest (on some
// virtualised AMD EPYC hosts its casts run at a quarter of AVX2's speed), so the first call times
// every supported vector path on a cache-resident buffer and keeps the fastest. What is timed is
// every kernel the path selects: the casts and the fused reduce-and-round of fused_kernels.h. The
// casts alone run at memory speed on either path (a coin toss between AVX2 and AVX-512 on a noisy
// host), while the fused kernel's AVX2 version, exact lane by lane, takes 2.7x the AVX-512 one on
// AMD Zen 4: choosing by the casts alone picked AVX2 in 4-7 of 40 processes there, and those ranks
// ran the shared-memory bf16 allreduce at 2x the time. Every path gives the same bits
// (cast_kernels.h), so ranks that choose differently still agree.
#include <algorithm>
#include <chrono>
#include <vector>

#include "lib/base/cast_kernels.h"
#include "lib/base/fused_kernels.h"

namespace adaptcomm::precision {
namespace {

// Best of a few runs of a narrowing cast, a two-rank fused reduce-and-round (the rank's own fp32
// and a peer's bf16) and a widening cast over `f32.size()` elements, in seconds.
double TimePath(CastPath path, const std::vector<float>& f32, std::vector<uint16_t>& wire,
                std::vector<uint16_t>& peer, std::vector<float>& back) {
  using Clock = std::chrono::steady_clock;
  const uint16_t* blocks[2] = {nullptr, peer.data()};
  ReduceRoundArgs round;
  round.blocks = blocks;
  round.n = 2;
  round.self = 0;
  round.own = f32.data();
  round.sum = wire.data();
  round.count = f32.size();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    (void)F32ToBF16(path, f32.data(), peer.data(), f32.size());
    (void)ReduceRoundBF16(path, round);
    (void)BF16ToF32(path, wire.data(), back.data(), back.size());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

CastPath DetectBestPath() {
  std::vector<CastPath> candidates;
  for (CastPath p : {CastPath::kAvx512Bf16, CastPath::kAvx512, CastPath::kAvx2}) {
    if (CastPathSupported(p)) candidates.push_back(p);
  }
  if (candidates.empty()) return CastPath::kScalar;
  if (candidates.size() == 1) return candidates.front();
  // 16 Ki elements: 192 KiB in all, in L2 everywhere; well under a millisecond per path.
  std::vector<float> f32(16384), back(f32.size());
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<float>(i % 977) * 0.37f - 150.0f;
  std::vector<uint16_t> wire(f32.size()), peer(f32.size());
  CastPath best = candidates.front();
  double best_time = 1e30;
  for (CastPath p : candidates) {
    (void)TimePath(p, f32, wire, peer, back);  // warm up: the first AVX-512 instructions stall
    // Widest first: a narrower path must be clearly (10%) faster to replace a wider one.
    const double t = TimePath(p, f32, wire, peer, back);
    if (t < best_time * 0.9) {
      best = p;
      best_time = t;
    }
  }
  return best;
}

}  // namespace

const char* CastPathName(CastPath path) {
  switch (path) {
    case CastPath::kScalar:
      return "scalar";
    case CastPath::kAvx2:
      return "avx2_f16c";
    case CastPath::kAvx512:
      return "avx512";
    case CastPath::kAvx512Bf16:
      return "avx512bf16";
  }
  return "unknown";
}

bool CastPathSupported(CastPath path) {
  switch (path) {
    case CastPath::kScalar:
      return true;
    case CastPath::kAvx2:
      return x86::HasAvx2F16c();
    case CastPath::kAvx512:
      return x86::HasAvx512();
    case CastPath::kAvx512Bf16:
      return x86::HasAvx512Bf16();
  }
  return false;
}

std::vector<CastPath> SupportedCastPaths() {
  std::vector<CastPath> paths;
  for (CastPath p : {CastPath::kScalar, CastPath::kAvx2, CastPath::kAvx512, CastPath::kAvx512Bf16})
    if (CastPathSupported(p)) paths.push_back(p);
  return paths;
}

CastPath ActiveCastPath() {
  static const CastPath best = DetectBestPath();
  return best;
}

CastStats F32ToBF16(CastPath path, const float* src, uint16_t* dst, size_t n) {
  switch (path) {
    case CastPath::kAvx512Bf16:
      return x86::F32ToBF16Avx512Bf16(src, dst, n);
    case CastPath::kAvx512:
      return x86::F32ToBF16Avx512(src, dst, n);
    case CastPath::kAvx2:
      return x86::F32ToBF16Avx2(src, dst, n);
    case CastPath::kScalar:
      break;
  }
  return F32ToBF16Scalar(src, dst, n);
}

CastStats F32ToF16(CastPath path, const float* src, uint16_t* dst, size_t n) {
  switch (path) {
    case CastPath::kAvx512Bf16:
    case CastPath::kAvx512:
      return x86::F32ToF16Avx512(src, dst, n);
    case CastPath::kAvx2:
      return x86::F32ToF16Avx2(src, dst, n);
    case CastPath::kScalar:
      break;
  }
  return F32ToF16Scalar(src, dst, n);
}

CastStats BF16ToF32(CastPath path, const uint16_t* src, float* dst, size_t n, float scale) {
  switch (path) {
    case CastPath::kAvx512Bf16:
    case CastPath::kAvx512:
      return x86::BF16ToF32Avx512(src, dst, n, scale);
    case CastPath::kAvx2:
      return x86::BF16ToF32Avx2(src, dst, n, scale);
    case CastPath::kScalar:
      break;
  }
  return BF16ToF32Scalar(src, dst, n, scale);
}

CastStats F16ToF32(CastPath path, const uint16_t* src, float* dst, size_t n, float scale) {
  switch (path) {
    case CastPath::kAvx512Bf16:
    case CastPath::kAvx512:
      return x86::F16ToF32Avx512(src, dst, n, scale);
    case CastPath::kAvx2:
      return x86::F16ToF32Avx2(src, dst, n, scale);
    case CastPath::kScalar:
      break;
  }
  return F16ToF32Scalar(src, dst, n, scale);
}

CastStats F32ToBF16Stream(CastPath path, const float* src, uint16_t* dst, size_t n) {
  switch (path) {
    case CastPath::kAvx512Bf16:
      return x86::F32ToBF16StreamAvx512Bf16(src, dst, n);
    case CastPath::kAvx512:
      return x86::F32ToBF16StreamAvx512(src, dst, n);
    case CastPath::kAvx2:
    case CastPath::kScalar:
      break;
  }
  return F32ToBF16(path, src, dst, n);
}

CastStats F32ToF16Stream(CastPath path, const float* src, uint16_t* dst, size_t n) {
  switch (path) {
    case CastPath::kAvx512Bf16:
    case CastPath::kAvx512:
      return x86::F32ToF16StreamAvx512(src, dst, n);
    case CastPath::kAvx2:
    case CastPath::kScalar:
      break;
  }
  return F32ToF16(path, src, dst, n);
}

CastStats BF16ToF32Stream(CastPath path, const uint16_t* src, float* dst, size_t n, float scale) {
  switch (path) {
    case CastPath::kAvx512Bf16:
    case CastPath::kAvx512:
      return x86::BF16ToF32StreamAvx512(src, dst, n, scale);
    case CastPath::kAvx2:
    case CastPath::kScalar:
      break;
  }
  return BF16ToF32(path, src, dst, n, scale);
}

CastStats F16ToF32Stream(CastPath path, const uint16_t* src, float* dst, size_t n, float scale) {
  switch (path) {
    case CastPath::kAvx512Bf16:
    case CastPath::kAvx512:
      return x86::F16ToF32StreamAvx512(src, dst, n, scale);
    case CastPath::kAvx2:
    case CastPath::kScalar:
      break;
  }
  return F16ToF32(path, src, dst, n, scale);
}

void AccumulateBF16(CastPath path, const uint16_t* src, float* acc, size_t n) {
  switch (path) {
    case CastPath::kAvx512Bf16:
    case CastPath::kAvx512:
      return x86::AccumulateBF16Avx512(src, acc, n);
    case CastPath::kAvx2:
      return x86::AccumulateBF16Avx2(src, acc, n);
    case CastPath::kScalar:
      break;
  }
  AccumulateBF16Scalar(src, acc, n);
}

void AccumulateF16(CastPath path, const uint16_t* src, float* acc, size_t n) {
  switch (path) {
    case CastPath::kAvx512Bf16:
    case CastPath::kAvx512:
      return x86::AccumulateF16Avx512(src, acc, n);
    case CastPath::kAvx2:
      return x86::AccumulateF16Avx2(src, acc, n);
    case CastPath::kScalar:
      break;
  }
  AccumulateF16Scalar(src, acc, n);
}

}  // namespace adaptcomm::precision

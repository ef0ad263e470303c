// CUDA fp32 <-> bf16/fp16 casts for the device mixed-precision path. Bit for bit the CPU casts of
// lib/precision: both compile the same conversions (lib/base/cast_bits.h); bench/gpu_check
// compares all 65536 half patterns and the fp32 edge cases on a GPU. Vectorized: 4 elements per
// thread and step (a 16-byte fp32 access and an 8-byte half access) when both buffers are aligned,
// else one; grid-stride loops; counts summed per block and added to the device counters with one
// atomic per block.
#include <cuda_runtime.h>

#include <cstdint>

#include "lib/base/cast_bits.h"
#include "lib/cuda/cast_kernels_cuda.h"

namespace adaptcomm::cuda::kernels {
namespace {

using precision::bits::kF32AbsMask;
using precision::bits::kF32Inf;
using precision::bits::kF32QuietBit;
constexpr uint32_t kX86DefaultNaN = 0xffc00000u;  // what an x86 invalid multiply returns
constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

struct Counts {
  unsigned long long overflow = 0;
  unsigned long long nonfinite = 0;
};

// The shared bit conversions (lib/base/cast_bits.h), plus the counts.
__device__ __forceinline__ uint16_t F32BitsToBF16(uint32_t x, Counts& c) {
  c.nonfinite += precision::bits::F32Nonfinite(x);
  c.overflow += precision::bits::F32OverflowsBF16(x);
  return precision::bits::F32ToBF16(x);
}

__device__ __forceinline__ uint16_t F32BitsToF16(uint32_t x, Counts& c) {
  c.nonfinite += precision::bits::F32Nonfinite(x);
  c.overflow += precision::bits::F32OverflowsF16(x);
  return precision::bits::F32ToF16(x);
}

__device__ __forceinline__ uint32_t BF16ToF32Bits(uint16_t h, Counts& c) {
  c.nonfinite += precision::bits::BF16Nonfinite(h);
  return precision::bits::BF16ToF32(h);
}

__device__ __forceinline__ uint32_t F16ToF32Bits(uint16_t h, Counts& c) {
  c.nonfinite += precision::bits::F16Nonfinite(h);
  return precision::bits::F16ToF32(h);
}

// fp32 multiply with x86 SSE's NaN results, which the CPU path produces: a NaN operand is
// returned (quieted), an invalid product (Inf * 0) is the negative default NaN. A GPU would return
// its canonical 0x7fffffff instead.
__device__ __forceinline__ uint32_t ScaleBits(uint32_t x, float scale) {
  if ((x & kF32AbsMask) > kF32Inf) return x | kF32QuietBit;  // a signaling NaN too (x86 quiets it)
  const uint32_t s = __float_as_uint(scale);
  if ((s & kF32AbsMask) > kF32Inf) return s | kF32QuietBit;
  const uint32_t r = __float_as_uint(__fmul_rn(__uint_as_float(x), scale));
  return (r & kF32AbsMask) > kF32Inf ? kX86DefaultNaN : r;
}

__device__ __forceinline__ unsigned long long WarpSum(unsigned long long v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

// Sums the block's counts and adds them to the device counters: one atomic per block.
__device__ void Publish(Counts c, unsigned long long* counters) {
  __shared__ unsigned long long part[2][kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  c.overflow = WarpSum(c.overflow);
  c.nonfinite = WarpSum(c.nonfinite);
  if (lane == 0) {
    part[0][warp] = c.overflow;
    part[1][warp] = c.nonfinite;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long o = 0, n = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      o += part[0][w];
      n += part[1][w];
    }
    if (o != 0) atomicAdd(&counters[0], o);
    if (n != 0) atomicAdd(&counters[1], n);
  }
}

template <bool kF16>
__global__ void __launch_bounds__(kThreads)
    NarrowKernel(const float* __restrict__ src, uint16_t* __restrict__ dst, size_t n, bool vec,
                 unsigned long long* counters) {
  Counts c;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t groups = vec ? n / 4 : 0;
  const float4* src4 = reinterpret_cast<const float4*>(src);
  ushort4* dst4 = reinterpret_cast<ushort4*>(dst);
  for (size_t i = tid; i < groups; i += stride) {
    const float4 v = src4[i];
    ushort4 o;
    if (kF16) {
      o.x = F32BitsToF16(__float_as_uint(v.x), c);
      o.y = F32BitsToF16(__float_as_uint(v.y), c);
      o.z = F32BitsToF16(__float_as_uint(v.z), c);
      o.w = F32BitsToF16(__float_as_uint(v.w), c);
    } else {
      o.x = F32BitsToBF16(__float_as_uint(v.x), c);
      o.y = F32BitsToBF16(__float_as_uint(v.y), c);
      o.z = F32BitsToBF16(__float_as_uint(v.z), c);
      o.w = F32BitsToBF16(__float_as_uint(v.w), c);
    }
    dst4[i] = o;
  }
  for (size_t i = groups * 4 + tid; i < n; i += stride) {
    const uint32_t x = __float_as_uint(src[i]);
    dst[i] = kF16 ? F32BitsToF16(x, c) : F32BitsToBF16(x, c);
  }
  if (counters != nullptr) Publish(c, counters);
}

template <bool kF16>
__device__ __forceinline__ float Widen(uint16_t h, float scale, Counts& c) {
  const uint32_t x = kF16 ? F16ToF32Bits(h, c) : BF16ToF32Bits(h, c);
  return __uint_as_float(scale == 1.0f ? x : ScaleBits(x, scale));
}

template <bool kF16>
__global__ void __launch_bounds__(kThreads)
    WidenKernel(const uint16_t* __restrict__ src, float* __restrict__ dst, size_t n, float scale,
                bool vec, unsigned long long* counters) {
  Counts c;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t groups = vec ? n / 4 : 0;
  const ushort4* src4 = reinterpret_cast<const ushort4*>(src);
  float4* dst4 = reinterpret_cast<float4*>(dst);
  const bool store = dst != nullptr;  // null: only count (the NaN/Inf of a wire result)
  for (size_t i = tid; i < groups; i += stride) {
    const ushort4 v = src4[i];
    float4 o;
    o.x = Widen<kF16>(v.x, scale, c);
    o.y = Widen<kF16>(v.y, scale, c);
    o.z = Widen<kF16>(v.z, scale, c);
    o.w = Widen<kF16>(v.w, scale, c);
    if (store) dst4[i] = o;
  }
  for (size_t i = groups * 4 + tid; i < n; i += stride) {
    const float f = Widen<kF16>(src[i], scale, c);
    if (store) dst[i] = f;
  }
  if (counters != nullptr) Publish(c, counters);
}

// dst = src * scale with the CPU's NaN results; src may equal dst (no __restrict__).
__global__ void __launch_bounds__(kThreads)
    ScaleKernel(const float* src, float* dst, size_t n, float scale, bool vec,
                unsigned long long* counters) {
  Counts c;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t groups = vec ? n / 4 : 0;
  auto one = [&](float f) {
    const uint32_t x = __float_as_uint(f);
    c.nonfinite += (x & kF32AbsMask) >= kF32Inf;
    return __uint_as_float(scale == 1.0f ? x : ScaleBits(x, scale));
  };
  for (size_t i = tid; i < groups; i += stride) {
    float4 v = reinterpret_cast<const float4*>(src)[i];
    v.x = one(v.x);
    v.y = one(v.y);
    v.z = one(v.z);
    v.w = one(v.w);
    reinterpret_cast<float4*>(dst)[i] = v;
  }
  for (size_t i = groups * 4 + tid; i < n; i += stride) dst[i] = one(src[i]);
  if (counters != nullptr) Publish(c, counters);
}

bool Aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

int LaunchCastKernel(int direction, const void* src, void* dst, size_t count, float scale,
                     void* stream, unsigned long long* counters) {
  if (count == 0) return cudaSuccess;
  const bool narrow = direction == kCastF32ToBF16 || direction == kCastF32ToF16;
  const bool vec = direction == kCastF32ToF32 ? Aligned(src, 16) && Aligned(dst, 16)
                   : narrow                   ? Aligned(src, 16) && Aligned(dst, 8)
                                              : Aligned(src, 8) && Aligned(dst, 16);
  const size_t units = vec ? (count + 3) / 4 : count;
  const size_t want = (units + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(want < kMaxBlocks ? want : kMaxBlocks);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const auto* f32 = static_cast<const float*>(src);
  const auto* h16 = static_cast<const uint16_t*>(src);
  switch (direction) {
    case kCastF32ToBF16:
      NarrowKernel<false>
          <<<blocks, kThreads, 0, s>>>(f32, static_cast<uint16_t*>(dst), count, vec, counters);
      break;
    case kCastF32ToF16:
      NarrowKernel<true>
          <<<blocks, kThreads, 0, s>>>(f32, static_cast<uint16_t*>(dst), count, vec, counters);
      break;
    case kCastBF16ToF32:
      WidenKernel<false>
          <<<blocks, kThreads, 0, s>>>(h16, static_cast<float*>(dst), count, scale, vec, counters);
      break;
    case kCastF16ToF32:
      WidenKernel<true>
          <<<blocks, kThreads, 0, s>>>(h16, static_cast<float*>(dst), count, scale, vec, counters);
      break;
    case kCastF32ToF32:
      ScaleKernel<<<blocks, kThreads, 0, s>>>(f32, static_cast<float*>(dst), count, scale, vec,
                                              counters);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace adaptcomm::cuda::kernels

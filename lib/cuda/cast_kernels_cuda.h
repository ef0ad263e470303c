// The CUDA cast kernels (cast_kernels.cu), declared in plain C++ so that cuda_api_runtime.cc calls
// them without nvcc. Only built when nvcc works (ADAPTCOMM_HAVE_CAST_KERNELS).
#ifndef ADAPTCOMM_LIB_CUDA_CAST_KERNELS_CUDA_H_
#define ADAPTCOMM_LIB_CUDA_CAST_KERNELS_CUDA_H_

#include <cstddef>

namespace adaptcomm::cuda::kernels {

// Values of cuda::CastDirection (static_asserts in cuda_api_runtime.cc keep them equal).
inline constexpr int kCastF32ToBF16 = 0;
inline constexpr int kCastF32ToF16 = 1;
inline constexpr int kCastBF16ToF32 = 2;
inline constexpr int kCastF16ToF32 = 3;
inline constexpr int kCastF32ToF32 = 4;  // dst = src * scale (in place allowed)

// Queues the cast on `stream` (a cudaStream_t) on the current device; returns a cudaError_t
// (launch errors only: the kernel runs asynchronously). `counters`: null or 2 device counters
// (overflow, nonfinite inputs) that the kernel adds to. A widening cast with dst == nullptr only
// counts.
int LaunchCastKernel(int direction, const void* src, void* dst, size_t count, float scale,
                     void* stream, unsigned long long* counters);

}  // namespace adaptcomm::cuda::kernels

#endif  // ADAPTCOMM_LIB_CUDA_CAST_KERNELS_CUDA_H_

// bench/gpu_check_abort's kernels (see bench/gpu_check_abort.h).
#include <cuda_runtime.h>

#include "bench/gpu_check_abort.h"

namespace adaptcomm::gpu_check_abort {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

unsigned Blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < kMaxBlocks ? (b == 0 ? 1 : b) : kMaxBlocks);
}

__global__ void FillKernel(float* buf, size_t n, int rank, int step) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    buf[i] = Input(rank, step, i);
  }
}

__global__ void ConsumeKernel(const float* buf, float* seen, size_t n, int world, int step,
                              unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = buf[i];
    seen[i] = v;
    if (v != Sum(world, step, i)) ++bad;
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

}  // namespace

int LaunchFill(float* buf, size_t n, int rank, int step, void* stream) {
  FillKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(buf, n, rank, step);
  return static_cast<int>(cudaGetLastError());
}

int LaunchConsume(const float* buf, float* seen, size_t n, int world, int step,
                  unsigned long long* mismatches, void* stream) {
  ConsumeKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(buf, seen, n, world,
                                                                               step, mismatches);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace adaptcomm::gpu_check_abort

// bench/gpu_check_abort: the two-rank abort check's device side (bench/gpu_check_abort.cu): the
// inputs every rank writes, the sum every rank must see, and the two kernels, launched on the
// trainer's stream. Plain C++ types only: bench/gpu_check_abort.cc includes this without any CUDA
// header.
#ifndef ADAPTCOMM_BENCH_GPU_CHECK_ABORT_H_
#define ADAPTCOMM_BENCH_GPU_CHECK_ABORT_H_

#include <cstddef>

#if defined(__CUDACC__)
#define ADAPTCOMM_ABORT_CHECK_HD __host__ __device__
#else
#define ADAPTCOMM_ABORT_CHECK_HD
#endif

namespace adaptcomm::gpu_check_abort {

// Element i of `rank`'s input at `step`: an integer below 2^16, so that every sum over a few ranks
// is exact in float32 whatever the reduction order (the fault-free result is known bit for bit).
// Rank-dependent (a rank's own input is never the sum) and step-dependent (a stale result of an
// earlier step is never the sum either).
ADAPTCOMM_ABORT_CHECK_HD inline float Input(int rank, int step, size_t i) {
  return static_cast<float>((rank + 1) * 8192 +
                            static_cast<int>((static_cast<size_t>(step) * 131 + i) % 4093));
}
// The allreduce sum over `world` ranks of element i at `step`.
ADAPTCOMM_ABORT_CHECK_HD inline float Sum(int world, int step, size_t i) {
  float s = 0;
  for (int r = 0; r < world; ++r) s += Input(r, step, i);
  return s;
}

// The calls return a cudaError_t (0: queued). `stream` is a cudaStream_t; the current device must
// be the buffers'.
// Writes Input(rank, step, i) into buf[0..n).
int LaunchFill(float* buf, size_t n, int rank, int step, void* stream);
// The consumer: what a trainer's kernel after Work::Wait() does with the result. Copies buf into
// `seen` and adds to *mismatches the number of elements that differ from Sum(world, step, i).
int LaunchConsume(const float* buf, float* seen, size_t n, int world, int step,
                  unsigned long long* mismatches, void* stream);

}  // namespace adaptcomm::gpu_check_abort

#endif  // ADAPTCOMM_BENCH_GPU_CHECK_ABORT_H_

#include "lib/nccl/device_timing.h"

#include <cmath>

namespace adaptcomm::nccl {

bool DeviceTimingSampled(uint64_t seq, int every) {
  if (every <= 1) return every == 1;
  // splitmix64's finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom number
  // generators", OOPSLA 2014): consecutive seqs land on unrelated residues.
  uint64_t z = seq + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return z % static_cast<uint64_t>(every) == 0;
}

std::optional<absl::Duration> ReadDeviceTime(cuda::CudaApi& api, cuda::CudaEvent start,
                                             cuda::CudaEvent end) {
  if (start == nullptr || end == nullptr) return std::nullopt;
  cuda::ScopedCaptureModeThreadLocal mode(api);
  // The end first: recorded after the start on the same stream, so once it is complete the start
  // is too (asked all the same: cudaEventElapsedTime must not be the call that finds out).
  if (api.EventQuery(end) != cuda::kCudaSuccess || api.EventQuery(start) != cuda::kCudaSuccess) {
    return std::nullopt;
  }
  float ms = 0;
  if (api.EventElapsedTime(&ms, start, end) != cuda::kCudaSuccess || !std::isfinite(ms) || ms < 0) {
    return std::nullopt;
  }
  return absl::Nanoseconds(std::llround(static_cast<double>(ms) * 1e6));
}

}  // namespace adaptcomm::nccl

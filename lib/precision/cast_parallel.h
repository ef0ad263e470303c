// Multi-threaded casts: a buffer is split into chunks that a process-wide pool of worker threads
// (and the caller, when it joins) convert. A CastJob can be started and joined later, which is
// how the mixed collectives place their host barrier between the cast and the collective.
#ifndef ADAPTCOMM_LIB_PRECISION_CAST_PARALLEL_H_
#define ADAPTCOMM_LIB_PRECISION_CAST_PARALLEL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adaptcomm/precision.h"
#include "lib/base/cast_kernels.h"

namespace adaptcomm::precision {

enum class CastKind : uint8_t {
  kF32ToBF16,
  kF32ToF16,
  kBF16ToF32,
  kF16ToF32,
  // dst (fp32, count) = sum over b < blocks of widen(src + b * block_stride), in block order.
  kAccumulateBF16,
  kAccumulateF16,
};

struct CastRequest {
  CastKind kind = CastKind::kF32ToBF16;
  const void* src = nullptr;
  void* dst = nullptr;
  size_t count = 0;
  float scale = 1.0f;          // widening only
  bool stream_stores = false;  // casts: non-temporal stores (F32ToBF16Stream, BF16ToF32Stream...)
  int blocks = 1;              // accumulate only
  size_t block_stride = 0;     // accumulate only, in elements
  // Inputs of at least this many bytes are split into up to `threads` chunks (0: one per core).
  size_t parallel_min_bytes = size_t{4} << 20;
  int threads = 0;
  absl::Duration debug_delay = absl::ZeroDuration();  // each chunk sleeps first (tests)
  // The kernels' instruction set; unset: ActiveCastPath(). REQUIRES: CastPathSupported(*path).
  std::optional<CastPath> path = std::nullopt;
};

class CastJob {
 public:
  CastJob(const CastRequest& request, int chunks);
  CastJob(const CastJob&) = delete;
  CastJob& operator=(const CastJob&) = delete;

  // Converts unclaimed chunks on the calling thread, then waits for the ones other threads hold.
  // DeadlineExceeded if they are not done within `bound` (the job then still owns the buffers).
  [[nodiscard]] absl::Status Join(absl::Duration bound = absl::Seconds(120));
  // Waits for every chunk without converting any on this thread.
  [[nodiscard]] absl::Status Wait(absl::Duration bound = absl::Seconds(120));
  // Whether every chunk has finished (no wait).
  bool done() const;
  // Totals; meaningful once Join/Wait returned OK.
  CastStats stats() const;
  int chunks() const { return chunks_; }

  // Claims and converts one chunk; false when none was left to claim. Used by the pool workers.
  bool RunOne();

 private:
  const CastRequest request_;
  const int chunks_;
  std::atomic<int> next_{0};
  mutable absl::Mutex mu_;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  CastStats totals_ ABSL_GUARDED_BY(mu_);
};

// Splits `request` into chunks and hands them to the pool; returns at once.
std::shared_ptr<CastJob> StartCast(const CastRequest& request);
// Converts `request` in one chunk on the calling thread (no pool round trip, no wake-ups) and
// returns the finished job: for a caller that would only wait for a single-threaded cast anyway.
std::shared_ptr<CastJob> RunOnCaller(const CastRequest& request);
// StartCast + Join. The public Cast* functions are this with the default threshold.
CastStats RunCast(const CastRequest& request);
// Worker threads of the process-wide pool (created on first use; again after a fork).
int CastPoolWorkers();

}  // namespace adaptcomm::precision

#endif  // ADAPTCOMM_LIB_PRECISION_CAST_PARALLEL_H_

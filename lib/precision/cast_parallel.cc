// The worker pool and the public cast functions (the kernels and their run-time choice are in
// lib/base/cast_dispatch.cc).
#include "lib/precision/cast_parallel.h"

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <thread>

#include "lib/base/cast_kernels.h"

namespace adaptcomm::precision {
namespace {

// Chunks are multiples of this many elements, so every chunk but the last is whole vectors.
constexpr size_t kChunkAlign = 256;

class CastPool {
 public:
  explicit CastPool(int workers) {
    threads_.reserve(workers);
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { Loop(); });
  }
  // Never destroyed (see Global): workers stay blocked on the empty queue until exit, harmlessly.

  static CastPool& Global() {
    static absl::Mutex mu(absl::kConstInit);
    static CastPool* pool = nullptr;
    static pid_t owner = 0;
    absl::MutexLock lock(&mu);
    // A forked child inherits the object but not the threads: make a new pool there.
    if (pool == nullptr || owner != getpid()) {
      const unsigned hw = std::max(2u, std::thread::hardware_concurrency());
      pool = new CastPool(static_cast<int>(std::min(hw, 16u)));
      owner = getpid();
    }
    return *pool;
  }

  int workers() const { return static_cast<int>(threads_.size()); }

  void Post(const std::shared_ptr<CastJob>& job, int entries) {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < entries; ++i) queue_.push_back(job);
  }

 private:
  void Loop() {
    for (;;) {
      std::shared_ptr<CastJob> job;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](std::deque<std::shared_ptr<CastJob>>* q) { return !q->empty(); }, &queue_));
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      while (job->RunOne()) {
      }
    }
  }

  absl::Mutex mu_;
  std::deque<std::shared_ptr<CastJob>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

CastStats RunKernel(CastPath path, const CastRequest& r, size_t begin, size_t end) {
  const size_t n = end - begin;
  switch (r.kind) {
    case CastKind::kF32ToBF16:
      return (r.stream_stores ? F32ToBF16Stream : F32ToBF16)(
          path, static_cast<const float*>(r.src) + begin, static_cast<uint16_t*>(r.dst) + begin, n);
    case CastKind::kF32ToF16:
      return (r.stream_stores ? F32ToF16Stream : F32ToF16)(
          path, static_cast<const float*>(r.src) + begin, static_cast<uint16_t*>(r.dst) + begin, n);
    case CastKind::kBF16ToF32:
      return (r.stream_stores ? BF16ToF32Stream : BF16ToF32)(
          path, static_cast<const uint16_t*>(r.src) + begin, static_cast<float*>(r.dst) + begin, n,
          r.scale);
    case CastKind::kF16ToF32:
      return (r.stream_stores ? F16ToF32Stream : F16ToF32)(
          path, static_cast<const uint16_t*>(r.src) + begin, static_cast<float*>(r.dst) + begin, n,
          r.scale);
    case CastKind::kAccumulateBF16:
    case CastKind::kAccumulateF16: {
      const bool f16 = r.kind == CastKind::kAccumulateF16;
      for (int b = 0; b < r.blocks; ++b) {
        const uint16_t* src = static_cast<const uint16_t*>(r.src) + b * r.block_stride + begin;
        float* acc = static_cast<float*>(r.dst) + begin;
        if (b == 0) {
          // The first block initializes the accumulator (exact widening).
          f16 ? F16ToF32(path, src, acc, n) : BF16ToF32(path, src, acc, n);
        } else {
          f16 ? AccumulateF16(path, src, acc, n) : AccumulateBF16(path, src, acc, n);
        }
      }
      CastStats s;
      s.count = n;
      return s;
    }
  }
  return {};
}

size_t InputBytes(const CastRequest& r) {
  switch (r.kind) {
    case CastKind::kF32ToBF16:
    case CastKind::kF32ToF16:
      return r.count * 4;
    case CastKind::kAccumulateBF16:
    case CastKind::kAccumulateF16:
      return r.count * 2 * static_cast<size_t>(r.blocks);
    default:
      return r.count * 2;
  }
}

}  // namespace

// ---- CastJob ----

CastJob::CastJob(const CastRequest& request, int chunks) : request_(request), chunks_(chunks) {}

bool CastJob::RunOne() {
  const int index = next_.fetch_add(1, std::memory_order_relaxed);
  if (index >= chunks_) return false;
  if (request_.debug_delay > absl::ZeroDuration()) absl::SleepFor(request_.debug_delay);
  // Chunk boundaries: equal shares rounded to kChunkAlign elements.
  const size_t per = (request_.count / chunks_ + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  const size_t begin = std::min(request_.count, per * index);
  const size_t end = index == chunks_ - 1 ? request_.count : std::min(request_.count, begin + per);
  const CastStats part = RunKernel(request_.path.value_or(ActiveCastPath()), request_, begin, end);
  absl::MutexLock lock(&mu_);
  Accumulate(totals_, part);
  ++finished_;
  return true;
}

absl::Status CastJob::Join(absl::Duration bound) {
  while (RunOne()) {
  }
  return Wait(bound);
}

absl::Status CastJob::Wait(absl::Duration bound) {
  absl::MutexLock lock(&mu_);
  auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ == chunks_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&all_done), bound)) {
    return absl::DeadlineExceededError(
        absl::StrCat("cast of ", request_.count, " elements: ", chunks_ - finished_, " of ",
                     chunks_, " chunks unfinished after ", absl::FormatDuration(bound)));
  }
  return absl::OkStatus();
}

bool CastJob::done() const {
  absl::MutexLock lock(&mu_);
  return finished_ == chunks_;
}

CastStats CastJob::stats() const {
  absl::MutexLock lock(&mu_);
  return totals_;
}

std::shared_ptr<CastJob> StartCast(const CastRequest& request) {
  CastPool& pool = CastPool::Global();
  int chunks = 1;
  if (InputBytes(request) >= request.parallel_min_bytes && request.count >= 2 * kChunkAlign) {
    const int want = request.threads > 0
                         ? request.threads
                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    chunks = static_cast<int>(std::min<size_t>(std::min(want, 64), request.count / kChunkAlign));
  }
  auto job = std::make_shared<CastJob>(request, std::max(chunks, 1));
  pool.Post(job, std::min(job->chunks(), pool.workers()));
  return job;
}

std::shared_ptr<CastJob> RunOnCaller(const CastRequest& request) {
  auto job = std::make_shared<CastJob>(request, 1);
  job->RunOne();
  return job;
}

CastStats RunCast(const CastRequest& request) {
  if (InputBytes(request) < request.parallel_min_bytes) {
    // Small: no pool round trip.
    return RunKernel(request.path.value_or(ActiveCastPath()), request, 0, request.count);
  }
  std::shared_ptr<CastJob> job = StartCast(request);
  // The pool never loses a chunk, and the caller converts whatever is unclaimed, so the only way
  // this bound trips is a machine stalled for minutes; the stats are then partial.
  (void)job->Join(absl::Hours(1));
  return job->stats();
}

int CastPoolWorkers() { return CastPool::Global().workers(); }

}  // namespace adaptcomm::precision

namespace adaptcomm {

CastStats CastF32ToBF16(const float* src, uint16_t* dst, size_t count) {
  return precision::RunCast({precision::CastKind::kF32ToBF16, src, dst, count});
}
CastStats CastF32ToF16(const float* src, uint16_t* dst, size_t count) {
  return precision::RunCast({precision::CastKind::kF32ToF16, src, dst, count});
}
CastStats CastBF16ToF32(const uint16_t* src, float* dst, size_t count) {
  return precision::RunCast({precision::CastKind::kBF16ToF32, src, dst, count});
}
CastStats CastF16ToF32(const uint16_t* src, float* dst, size_t count) {
  return precision::RunCast({precision::CastKind::kF16ToF32, src, dst, count});
}
const char* CastImplementationName() {
  return precision::CastPathName(precision::ActiveCastPath());
}

}  // namespace adaptcomm

// Run-time kernel choice, the worker pool, and the public cast functions.
#include "lib/precision/cast_parallel.h"

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <thread>

#include "lib/base/cast_kernels.h"

namespace adaptcomm::precision {
namespace {

// -1: no override. Relaxed is enough: tests set it before casting.
std::atomic<int> g_forced_path{-1};

CastPath DetectBestPath() {
  if (x86::HasAvx512Bf16()) return CastPath::kAvx512Bf16;
  if (x86::HasAvx512()) return CastPath::kAvx512;
  if (x86::HasAvx2F16c()) return CastPath::kAvx2;
  return CastPath::kScalar;
}

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
  const int forced = g_forced_path.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<CastPath>(forced) : best;
}

void SetCastPathForTesting(CastPath path) {
  g_forced_path.store(CastPathSupported(path) ? static_cast<int>(path) : 0,
                      std::memory_order_relaxed);
}
void ResetCastPathForTesting() { g_forced_path.store(-1, std::memory_order_relaxed); }

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
  const CastStats part = RunKernel(ActiveCastPath(), request_, begin, end);
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
    return RunKernel(ActiveCastPath(), request, 0, request.count);
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

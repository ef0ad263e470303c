// CommMetrics: one communicator's counters, fed by the executor's observer callbacks (queued,
// started, ended) and by the runtime's hooks (retries, fallbacks, membership changes), and the
// process-wide registry that renders every live communicator's metrics as Prometheus or
// OpenMetrics text (served by lib/trace/metrics_export.h).
//
// Per op: count, message bytes, bus bytes (nccl-tests' factors), execution time (start to end)
// into a histogram, and time queued (enqueue to start), per collective, size band and backend. A
// device op its backend timed on the device (OnDeviceTime) counts that time as its execution, and
// as the data phase of the fail-slow sampler (it started moving data that long before it was
// found done); the rest of its time on the host counts as queued.
// Recording an op takes one SpinLock hold and no allocation: the executor's per-op path must not
// get measurably slower with metrics on.
#ifndef ADAPTCOMM_LIB_TRACE_METRICS_H_
#define ADAPTCOMM_LIB_TRACE_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/spin_lock.h"
#include "lib/trace/op_observer.h"
#include "lib/trace/slow_sampler.h"

namespace adaptcomm::trace {

// The message_size label's bands: upper bounds in bytes (inclusive), the last one open.
inline constexpr int kMetricSizeBands = 6;
// The execution-time histogram's bucket bounds in microseconds (Prometheus `le`), +Inf implied.
inline constexpr std::array<double, 20> kExecTimeBucketsUs = {
    5,     10,    20,    50,     100,    200,    500,     1000,    2000,    5000,
    10000, 20000, 50000, 100000, 200000, 500000, 1000000, 2000000, 5000000, 10000000};
// The label of size band `band` ("<=4KiB", ..., ">256MiB").
const char* SizeBandLabel(int band);
int SizeBandOf(uint64_t bytes);
// nccl-tests' bus-bandwidth factor of `kind` on `nranks` ranks (allreduce 2(n-1)/n, ...).
double BusFactor(OpKind kind, int nranks);

struct CommMetricsOptions {
  std::string comm_name;
  int rank = 0;
  int nranks = 1;
  std::string backend;  // the first generation's
  // Keep the samples of a fail-slow detector (slow_sampler()) from the same per-op times.
  bool slow_samples = false;
};

class CommMetrics final : public OpObserver {
 public:
  explicit CommMetrics(CommMetricsOptions options);

  void OnEnqueue(const OpDesc& op, absl::Time when) override;
  void OnStart(const OpDesc& op, absl::Time when) override;
  void OnEnqueueAndStart(const OpDesc& op, absl::Time when) override;
  void OnEnd(const OpDesc& op, const absl::Status& status, absl::Time when) override;
  void OnDeviceTime(const OpDesc& op, absl::Duration executed) override;

  // A rebuilt backend (a retry, a degrade, a membership change): later ops count under its name
  // and world size.
  void SetBackend(const std::string& backend, int nranks);
  // A coordinated retry this rank took part in, by the status that caused it here.
  void AddRetry(absl::StatusCode cause);
  void AddFallback() { fallbacks_.fetch_add(1, std::memory_order_relaxed); }
  void AddMembershipChange() { membership_changes_.fetch_add(1, std::memory_order_relaxed); }
  // The straggler detector's score of this rank (0: not slow, or no detector); exported as is.
  void SetSlownessScore(double score) { slowness_.store(score, std::memory_order_relaxed); }
  // Read at each render: ops that ran without retry protection (the executor counts them).
  void SetUnprotectedOpsSource(std::function<uint64_t()> source);

  // This communicator's samples, appended per metric family to `families` (see RenderMetrics).
  struct Families;
  void AppendTo(Families& families) const;

  // Ops ended so far (all series); for tests and the status record.
  uint64_t ops_ended() const;

  double slowness_score() const { return slowness_.load(std::memory_order_relaxed); }
  // Null unless the options asked for slow_samples.
  const SlowSampler* slow_sampler() const { return sampler_.get(); }

 private:
  static constexpr int kKinds = 9;
  static constexpr int kBackends = 4;  // names past the fourth count under the fourth
  static constexpr int kBuckets = static_cast<int>(kExecTimeBucketsUs.size()) + 1;
  struct Series {
    uint64_t ops = 0;
    uint64_t errors = 0;
    uint64_t timeouts = 0;
    uint64_t bytes = 0;
    double bus_bytes = 0;
    int64_t exec_ns = 0;
    int64_t queue_ns = 0;
    std::array<uint64_t, kBuckets> buckets{};  // not cumulative
  };
  // When the ops in flight were queued and started, by seq (the executor keeps at most 1024
  // device ops in flight, and one host op).
  struct Times {
    std::atomic<uint64_t> seq{0};
    std::atomic<int64_t> enqueue_ns{0};
    std::atomic<int64_t> start_ns{0};
    std::atomic<int64_t> device_ns{-1};  // OnDeviceTime's; -1: not timed on the device
  };
  static constexpr size_t kTimes = 2048;

  const CommMetricsOptions options_;
  std::array<Times, kTimes> times_;
  mutable SpinLock mu_;
  std::array<Series, kKinds * kMetricSizeBands * kBackends> series_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> backends_ ABSL_GUARDED_BY(mu_);
  int backend_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<int, kBackends> backend_nranks_ ABSL_GUARDED_BY(mu_){};
  // BusFactor of each kind on the current backend's world: no division per op.
  std::array<double, kKinds> bus_factor_ ABSL_GUARDED_BY(mu_){};
  static constexpr int kCodes = 17;  // absl::StatusCode values 0..16
  std::array<std::atomic<uint64_t>, kCodes> retries_{};
  std::atomic<uint64_t> fallbacks_{0};
  std::atomic<uint64_t> membership_changes_{0};
  std::atomic<double> slowness_{0};
  const std::unique_ptr<SlowSampler> sampler_;
  mutable absl::Mutex source_mu_;
  std::function<uint64_t()> unprotected_ ABSL_GUARDED_BY(source_mu_);
};

// Every live CommMetrics of the process (weakly held: a destroyed communicator drops out).
void RegisterMetrics(const std::shared_ptr<CommMetrics>& metrics);
// The exposition text of every registered communicator. `openmetrics`: OpenMetrics 1.0.0 (counter
// families named without _total, `# EOF`), else Prometheus text 0.0.4.
std::string RenderMetrics(bool openmetrics);

}  // namespace adaptcomm::trace

#endif  // ADAPTCOMM_LIB_TRACE_METRICS_H_

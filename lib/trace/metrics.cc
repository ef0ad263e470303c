#include "lib/trace/metrics.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "lib/base/op_views.h"

namespace adaptcomm::trace {

namespace {

constexpr const char* kBandLabels[kMetricSizeBands] = {"<=4KiB",  "<=64KiB",  "<=1MiB",
                                                       "<=16MiB", "<=256MiB", ">256MiB"};

// The bytes an op moves as nccl-tests counts its "size": the larger of its two views (an
// allgather's whole output, a reduce-scatter's whole input).
uint64_t MessageBytes(const OpDesc& op) {
  return std::max<uint64_t>(op.input.bytes(), op.output.bytes());
}

int64_t Nanos(absl::Time t) { return absl::ToUnixNanos(t); }

// kExecTimeBucketsUs in nanoseconds: an integer comparison per bucket on the op path.
constexpr std::array<int64_t, kExecTimeBucketsUs.size()> BucketNs() {
  std::array<int64_t, kExecTimeBucketsUs.size()> ns{};
  for (size_t i = 0; i < ns.size(); ++i) ns[i] = static_cast<int64_t>(kExecTimeBucketsUs[i] * 1000);
  return ns;
}
constexpr std::array<int64_t, kExecTimeBucketsUs.size()> kBucketNs = BucketNs();

std::string Escape(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string Number(double v) {
  // Integers print without a fraction; Prometheus parses both.
  if (v == static_cast<double>(static_cast<int64_t>(v)))
    return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

struct Family {
  const char* name;  // without _total
  const char* type;  // counter, gauge, histogram
  const char* help;
  std::string samples;
};

}  // namespace

// Indexes into CommMetrics::Families::all.
struct CommMetrics::Families {
  enum Id {
    kOps,
    kErrors,
    kTimeouts,
    kBytes,
    kBusBytes,
    kBusBw,
    kExecTime,
    kQueueTime,
    kRetries,
    kFallbacks,
    kMembership,
    kUnprotected,
    kSlowness,
    kCount
  };
  std::array<Family, kCount> all = {{
      {"adaptcomm_ops", "counter", "Ops that completed successfully.", {}},
      {"adaptcomm_op_errors", "counter", "Ops that ended with an error.", {}},
      {"adaptcomm_timeouts", "counter", "Ops that ended past their timeout.", {}},
      {"adaptcomm_bytes", "counter", "Message bytes of completed ops (nccl-tests size).", {}},
      {"adaptcomm_bus_bytes",
       "counter",
       "Bus bytes of completed ops (message bytes times nccl-tests' bus factor).",
       {}},
      {"adaptcomm_bus_bandwidth_gbs",
       "gauge",
       "Bus bandwidth in GB/s: bus bytes over execution time of the completed ops so far.",
       {}},
      {"adaptcomm_collective_exec_time_microseconds",
       "histogram",
       "Execution time of completed ops, from start to completion.",
       {}},
      {"adaptcomm_collective_queue_time_microseconds",
       "counter",
       "Time completed ops waited between entering the communicator and starting.",
       {}},
      {"adaptcomm_retries",
       "counter",
       "Coordinated retries this rank took part in, by the status that caused each here.",
       {}},
      {"adaptcomm_fallbacks", "counter", "Backend fallbacks (NCCL degraded to Gloo).", {}},
      {"adaptcomm_membership_changes", "counter", "Agreed membership changes (elastic).", {}},
      {"adaptcomm_unprotected_ops",
       "counter",
       "Ops outside a step that ran with retries on but without a replay record.",
       {}},
      {"adaptcomm_slowness_score",
       "gauge",
       "How much this rank holds the others back (0: not at all, or no detector).",
       {}},
  }};
};

const char* SizeBandLabel(int band) {
  return kBandLabels[std::clamp(band, 0, kMetricSizeBands - 1)];
}

int SizeBandOf(uint64_t bytes) {
  // Bands grow by 16x from 4 KiB.
  int band = 0;
  for (uint64_t edge = 4096; band < kMetricSizeBands - 1 && bytes > edge; edge <<= 4) ++band;
  return band;
}

double BusFactor(OpKind kind, int nranks) { return BusBandwidthFactor(kind, nranks); }

CommMetrics::CommMetrics(CommMetricsOptions options)
    : options_(std::move(options)),
      sampler_(options_.slow_samples ? std::make_unique<SlowSampler>() : nullptr) {
  backends_.push_back(options_.backend);
  backend_nranks_.fill(options_.nranks);
  for (size_t k = 0; k < kKinds; ++k) {
    bus_factor_[k] = BusFactor(static_cast<OpKind>(k), options_.nranks);
  }
}

void CommMetrics::OnEnqueue(const OpDesc& op, absl::Time when) {
  Times& t = times_[op.seq % kTimes];
  t.seq.store(op.seq, std::memory_order_relaxed);
  t.enqueue_ns.store(Nanos(when), std::memory_order_relaxed);
  t.start_ns.store(0, std::memory_order_relaxed);
  t.device_ns.store(-1, std::memory_order_relaxed);
}

void CommMetrics::OnStart(const OpDesc& op, absl::Time when) {
  Times& t = times_[op.seq % kTimes];
  if (t.seq.load(std::memory_order_relaxed) != op.seq) {
    // Started without a recorded enqueue (a retry's re-run of an old op): entered when started.
    t.seq.store(op.seq, std::memory_order_relaxed);
    t.enqueue_ns.store(Nanos(when), std::memory_order_relaxed);
  }
  t.start_ns.store(Nanos(when), std::memory_order_relaxed);
  t.device_ns.store(-1, std::memory_order_relaxed);
}

void CommMetrics::OnEnqueueAndStart(const OpDesc& op, absl::Time when) {
  Times& t = times_[op.seq % kTimes];
  const int64_t ns = Nanos(when);
  t.seq.store(op.seq, std::memory_order_relaxed);
  t.enqueue_ns.store(ns, std::memory_order_relaxed);
  t.start_ns.store(ns, std::memory_order_relaxed);
  t.device_ns.store(-1, std::memory_order_relaxed);
}

void CommMetrics::OnDeviceTime(const OpDesc& op, absl::Duration executed) {
  Times& t = times_[op.seq % kTimes];
  if (t.seq.load(std::memory_order_relaxed) != op.seq) return;  // its entry was reused
  t.device_ns.store(std::max<int64_t>(absl::ToInt64Nanoseconds(executed), 0),
                    std::memory_order_relaxed);
}

void CommMetrics::OnEnd(const OpDesc& op, const absl::Status& status, absl::Time when) {
  const int64_t end = Nanos(when);
  int64_t enqueue = end, start = end, device = -1;
  if (const Times& t = times_[op.seq % kTimes]; t.seq.load(std::memory_order_relaxed) == op.seq) {
    enqueue = t.enqueue_ns.load(std::memory_order_relaxed);
    start = t.start_ns.load(std::memory_order_relaxed);
    device = t.device_ns.load(std::memory_order_relaxed);
    if (start == 0) start = end;  // failed while queued (an abort): it never ran
  }
  if (device >= 0) {
    // Timed on the device: it moved data for that long before it was found done; the host's
    // launch-to-found span also held its wait on the stream (never before it was entered).
    start = std::max(enqueue, end - device);
  }
  if (sampler_ != nullptr) {
    // Point-to-point ops are not matched across ranks: they count only for the next op's gap.
    const bool collective = op.kind != OpKind::kSend && op.kind != OpKind::kRecv;
    sampler_->End(op.seq, status.ok() && collective, enqueue, start, end);
  }
  const int64_t exec_ns = device >= 0 ? device : std::max<int64_t>(end - start, 0);
  const uint64_t bytes = MessageBytes(op);
  int bucket = 0;
  while (bucket < kBuckets - 1 && exec_ns > kBucketNs[static_cast<size_t>(bucket)]) ++bucket;
  const size_t kind = std::min<size_t>(static_cast<size_t>(op.kind), kKinds - 1);
  const size_t band = static_cast<size_t>(SizeBandOf(bytes));
  SpinLockHold hold(&mu_);
  Series& s = series_[(kind * kMetricSizeBands + band) * kBackends + backend_];
  if (!status.ok()) {
    ++s.errors;
    if (absl::IsDeadlineExceeded(status)) ++s.timeouts;
    return;
  }
  ++s.ops;
  s.bytes += bytes;
  s.bus_bytes += static_cast<double>(bytes) * bus_factor_[kind];
  s.exec_ns += exec_ns;
  s.queue_ns += std::max<int64_t>(start - enqueue, 0);
  ++s.buckets[bucket];
}

void CommMetrics::SetBackend(const std::string& backend, int nranks) {
  SpinLockHold hold(&mu_);
  auto known = std::find(backends_.begin(), backends_.end(), backend);
  if (known == backends_.end() && backends_.size() < kBackends) {
    backends_.push_back(backend);
    known = backends_.end() - 1;
  }
  backend_ = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(known - backends_.begin()), kBackends - 1));
  backend_nranks_[backend_] = nranks;
  for (size_t k = 0; k < kKinds; ++k) bus_factor_[k] = BusFactor(static_cast<OpKind>(k), nranks);
}

void CommMetrics::AddRetry(absl::StatusCode cause) {
  const int code = static_cast<int>(cause);
  retries_[static_cast<size_t>(code >= 0 && code < kCodes ? code : 2)].fetch_add(
      1, std::memory_order_relaxed);
}

void CommMetrics::SetUnprotectedOpsSource(std::function<uint64_t()> source) {
  absl::MutexLock lock(&source_mu_);
  unprotected_ = std::move(source);
}

uint64_t CommMetrics::ops_ended() const {
  SpinLockHold hold(&mu_);
  uint64_t n = 0;
  for (const Series& s : series_) n += s.ops + s.errors;
  return n;
}

void CommMetrics::AppendTo(Families& f) const {
  // Copied under the lock, formatted without it: a scrape holds up the op path for a copy only.
  std::array<Series, kKinds * kMetricSizeBands * kBackends> series;
  std::vector<std::string> backends;
  std::array<int, kBackends> nranks;
  {
    SpinLockHold hold(&mu_);
    series = series_;
    backends = backends_;
    nranks = backend_nranks_;
  }
  const std::string comm =
      absl::StrCat("comm_name=\"", Escape(options_.comm_name), "\",rank=\"", options_.rank, "\"");
  const std::string base = absl::StrCat(comm, ",nranks=\"", options_.nranks, "\"");
  for (size_t kind = 0; kind < kKinds; ++kind) {
    for (size_t band = 0; band < kMetricSizeBands; ++band) {
      for (size_t b = 0; b < backends.size(); ++b) {
        const Series& s = series[(kind * kMetricSizeBands + band) * kBackends + b];
        if (s.ops == 0 && s.errors == 0) continue;
        const std::string labels =
            absl::StrCat(comm, ",nranks=\"", nranks[b], "\",collective=\"",
                         OpKindName(static_cast<OpKind>(kind)), "\",message_size=\"",
                         kBandLabels[band], "\",backend=\"", Escape(backends[b]), "\"");
        auto add = [&](Families::Id id, const char* suffix, double v) {
          absl::StrAppend(&f.all[id].samples, f.all[id].name, suffix, "{", labels, "} ", Number(v),
                          "\n");
        };
        add(Families::kOps, "_total", static_cast<double>(s.ops));
        add(Families::kErrors, "_total", static_cast<double>(s.errors));
        add(Families::kTimeouts, "_total", static_cast<double>(s.timeouts));
        add(Families::kBytes, "_total", static_cast<double>(s.bytes));
        add(Families::kBusBytes, "_total", s.bus_bytes);
        add(Families::kBusBw, "", s.exec_ns > 0 ? s.bus_bytes / static_cast<double>(s.exec_ns) : 0);
        add(Families::kQueueTime, "_total", static_cast<double>(s.queue_ns) / 1e3);
        std::string& h = f.all[Families::kExecTime].samples;
        const char* name = f.all[Families::kExecTime].name;
        uint64_t cumulative = 0;
        for (int i = 0; i < kBuckets; ++i) {
          cumulative += s.buckets[static_cast<size_t>(i)];
          absl::StrAppend(&h, name, "_bucket{", labels, ",le=\"",
                          i + 1 < kBuckets ? Number(kExecTimeBucketsUs[static_cast<size_t>(i)])
                                           : std::string("+Inf"),
                          "\"} ", cumulative, "\n");
        }
        absl::StrAppend(&h, name, "_sum{", labels, "} ",
                        Number(static_cast<double>(s.exec_ns) / 1e3), "\n");
        absl::StrAppend(&h, name, "_count{", labels, "} ", s.ops, "\n");
      }
    }
  }
  uint64_t unprotected = 0;
  {
    absl::MutexLock lock(&source_mu_);
    if (unprotected_) unprotected = unprotected_();
  }
  auto add = [&](Families::Id id, const char* suffix, double v) {
    absl::StrAppend(&f.all[id].samples, f.all[id].name, suffix, "{", base, "} ", Number(v), "\n");
  };
  for (int code = 0; code < kCodes; ++code) {
    const uint64_t n = retries_[static_cast<size_t>(code)].load(std::memory_order_relaxed);
    const auto c = static_cast<absl::StatusCode>(code);
    // The causes the default profile retries are always there (0 until one happens), so that a
    // dashboard's rate() has a series to work on; others once they happen.
    if (n == 0 && c != absl::StatusCode::kDeadlineExceeded && c != absl::StatusCode::kUnavailable &&
        c != absl::StatusCode::kAborted) {
      continue;
    }
    absl::StrAppend(&f.all[Families::kRetries].samples, f.all[Families::kRetries].name, "_total{",
                    base, ",cause=\"", absl::AsciiStrToLower(absl::StatusCodeToString(c)), "\"} ",
                    n, "\n");
  }
  add(Families::kFallbacks, "_total", static_cast<double>(fallbacks_.load()));
  add(Families::kMembership, "_total", static_cast<double>(membership_changes_.load()));
  add(Families::kUnprotected, "_total", static_cast<double>(unprotected));
  add(Families::kSlowness, "", slowness_.load());
}

namespace {

absl::Mutex registry_mu(absl::kConstInit);
std::vector<std::weak_ptr<CommMetrics>>& Registry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu) {
  static auto* registry = new std::vector<std::weak_ptr<CommMetrics>>();
  return *registry;
}

}  // namespace

void RegisterMetrics(const std::shared_ptr<CommMetrics>& metrics) {
  absl::MutexLock lock(&registry_mu);
  auto& r = Registry();
  r.erase(std::remove_if(r.begin(), r.end(), [](const auto& w) { return w.expired(); }), r.end());
  r.push_back(metrics);
}

std::string RenderMetrics(bool openmetrics) {
  std::vector<std::shared_ptr<CommMetrics>> live;
  {
    absl::MutexLock lock(&registry_mu);
    for (const auto& w : Registry()) {
      if (auto m = w.lock()) live.push_back(std::move(m));
    }
  }
  CommMetrics::Families families;
  for (const auto& m : live) m->AppendTo(families);
  std::string out;
  for (const Family& f : families.all) {
    const bool counter = std::string(f.type) == "counter";
    // Prometheus text names a counter family by its samples (_total); OpenMetrics without it.
    const std::string name = counter && !openmetrics ? absl::StrCat(f.name, "_total") : f.name;
    absl::StrAppend(&out, "# HELP ", name, " ", f.help, "\n# TYPE ", name, " ", f.type, "\n",
                    f.samples);
  }
  if (openmetrics) out += "# EOF\n";
  return out;
}

}  // namespace adaptcomm::trace

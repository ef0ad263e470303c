#include "lib/diag/rank_checks.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/diag/collective_timing.h"
#include "lib/diag/gpu_probe.h"
#include "lib/diag/library_probe.h"

namespace adaptcomm::diag {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kFingerprintBytes = 256;

// Times `iters` allreduces of `count` floats after one warm-up; returns this rank's durations
// in ms (the injected delay, if any, comes before the clock starts: a late arrival).
absl::StatusOr<std::vector<double>> TimeAllreduce(Communicator& comm, size_t count, int iters,
                                                  const RankCheckOptions& o) {
  std::vector<float> buf(count, 1.0f);
  std::vector<double> ms;
  for (int i = -1; i < iters; ++i) {
    if (comm.rank() == o.inject_rank && i >= 0) {
      std::this_thread::sleep_for(absl::ToChronoMicroseconds(o.inject_delay));
    }
    const auto t0 = Clock::now();
    if (absl::Status s = comm.Allreduce(HostView(buf.data(), buf.size())).Wait(); !s.ok()) {
      return s;
    }
    if (i >= 0) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return ms;
}

// Every rank's `mine` (same length everywhere), rank-major.
absl::StatusOr<std::vector<double>> AllgatherDoubles(Communicator& comm, std::vector<double> mine) {
  std::vector<double> all(mine.size() * static_cast<size_t>(comm.size()));
  if (absl::Status s =
          comm.Allgather(HostView(mine.data(), mine.size()), HostView(all.data(), all.size()))
              .Wait();
      !s.ok()) {
    return s;
  }
  return all;
}

}  // namespace

std::string LocalVersionFingerprint() {
  char host[128] = {};
  gethostname(host, sizeof(host) - 1);
  const GpuProbe gpus = ProbeGpus();
  const LibraryVersion runtime = ProbeCudaRuntime();
  const LibraryVersion nccl = ProbeNccl();
  return absl::StrCat(host, "|driver ", gpus.driver_version.empty() ? "none" : gpus.driver_version,
                      "|cudart ", runtime.found ? runtime.version : "none", "|nccl ",
                      nccl.found ? nccl.version : "none");
}

BusbwThreshold ResolveBusbwThreshold(std::optional<double> flag, const ProfileRequest& request) {
  BusbwThreshold t;
  if (flag.has_value()) {
    t.gbps = *flag;
    t.source = "--min-busbw";
    return t;
  }
  auto cfg = ResolveProfile(request);
  if (!cfg.ok()) {
    t.source = absl::StrCat("built-in default (profile not loaded: ", cfg.status().message(), ")");
    return t;
  }
  for (const SettingRecord& s : cfg->settings) {
    if (s.key != "diagnose.min_busbw_gbps") continue;
    if (!absl::SimpleAtod(s.value, &t.gbps)) break;
    t.source = s.source == "default"
                   ? absl::StrCat("built-in default (profile tier ", cfg->tier, " sets none)")
                   : absl::StrCat("profile tier ", cfg->tier, " (", s.source, ")");
    return t;
  }
  t.source = "built-in default";
  return t;
}

namespace {

void Add(std::vector<CheckResult>& out, std::string check, CheckStatus st, std::string detail,
         std::string fix = "") {
  out.push_back({std::move(check), st, std::move(detail), std::move(fix)});
}

// Versions: a fixed-size record per rank, compared without the host name. False: the allgather
// failed (the checks stop).
bool CheckVersions(Communicator& comm, const RankCheckOptions& o, std::vector<CheckResult>& out) {
  const int n = comm.size();
  std::vector<uint8_t> mine(kFingerprintBytes, 0);
  std::memcpy(mine.data(), o.versions.data(), std::min(o.versions.size(), kFingerprintBytes - 1));
  std::vector<uint8_t> all(kFingerprintBytes * static_cast<size_t>(n));
  if (absl::Status s =
          comm.Allgather(HostView(mine.data(), mine.size()), HostView(all.data(), all.size()))
              .Wait();
      !s.ok()) {
    Add(out, "ranks.versions", CheckStatus::kFail, absl::StrCat("allgather failed: ", s.ToString()),
        "see ranks.store; a rank died or the network dropped");
    return false;
  }
  std::map<std::string, std::vector<int>> by_versions;  // without the host name
  for (int r = 0; r < n; ++r) {
    std::string fp(reinterpret_cast<const char*>(all.data() + r * kFingerprintBytes));
    const size_t bar = fp.find('|');
    by_versions[bar == std::string::npos ? fp : fp.substr(bar + 1)].push_back(r);
  }
  if (by_versions.size() == 1) {
    Add(out, "ranks.versions", CheckStatus::kPass,
        absl::StrCat("all ranks: ", by_versions.begin()->first));
  } else {
    std::vector<std::string> groups;
    for (const auto& [v, ranks] : by_versions) {
      groups.push_back(absl::StrCat("ranks ", absl::StrJoin(ranks, ","), ": ", v));
    }
    Add(out, "ranks.versions", CheckStatus::kFail,
        absl::StrCat("versions differ: ", absl::StrJoin(groups, "; ")),
        "install the same driver, CUDA runtime and NCCL on every node (mixed NCCL versions refuse "
        "to form a communicator or hang)");
  }
  return true;
}

// Small allreduce: latency, and who arrives late. False: an allreduce failed (the checks stop).
bool CheckLatency(Communicator& comm, const RankCheckOptions& o, std::vector<CheckResult>& out) {
  const int n = comm.size();
  auto small = TimeAllreduce(comm, std::max<size_t>(1, o.small_bytes / 4), o.small_iters, o);
  if (!small.ok()) {
    Add(out, "ranks.latency", CheckStatus::kFail, small.status().ToString(),
        "a rank failed mid-check: read its output");
    return false;
  }
  auto small_all = AllgatherDoubles(comm, *small);
  if (!small_all.ok()) {
    Add(out, "ranks.latency", CheckStatus::kFail, small_all.status().ToString(), "");
    return false;
  }
  const int iters = o.small_iters;
  auto d = [&](int r, int i) { return (*small_all)[static_cast<size_t>(r) * iters + i]; };
  // The rank that arrives last waits least; everyone else waits for it. Per iteration, the
  // fastest duration is the pure collective cost and (max - own) is how late a rank was.
  std::vector<double> per_iter_min;
  std::vector<double> lag_sum(n, 0);
  std::vector<int> last_count(n, 0);
  for (int i = 0; i < iters; ++i) {
    double lo = d(0, i), hi = d(0, i);
    int last = 0;
    for (int r = 1; r < n; ++r) {
      if (d(r, i) < lo) {
        lo = d(r, i);
        last = r;
      }
      hi = std::max(hi, d(r, i));
    }
    per_iter_min.push_back(lo);
    for (int r = 0; r < n; ++r) lag_sum[r] += hi - d(r, i);
    ++last_count[last];
  }
  const double latency = Median(per_iter_min);
  Add(out, "ranks.latency",
      latency > o.max_small_latency_ms ? CheckStatus::kWarn : CheckStatus::kPass,
      absl::StrFormat("%zu-byte allreduce: median %.3f ms over %d iterations (threshold %.0f ms)",
                      o.small_bytes, latency, iters, o.max_small_latency_ms),
      latency > o.max_small_latency_ms
          ? "check the interface in use (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME) and the network"
          : "");
  int slow = 0;
  for (int r = 1; r < n; ++r) {
    if (lag_sum[r] > lag_sum[slow]) slow = r;
  }
  const double slow_lag = iters > 0 ? lag_sum[slow] / iters : 0;
  if (n > 1 && slow_lag > o.slow_rank_ms) {
    Add(out, "ranks.slow_rank", CheckStatus::kFail,
        absl::StrFormat("rank %d arrives %.1f ms late on average (last in %d of %d collectives); "
                        "every other rank waits for it",
                        slow, slow_lag, last_count[slow], iters),
        absl::StrFormat("look at rank %d's node: CPU contention, a slow GPU, data loading or "
                        "unbalanced work (adaptcomm::BalancePartitions for sequence lengths)",
                        slow));
  } else {
    Add(out, "ranks.slow_rank", CheckStatus::kPass,
        absl::StrFormat("no straggler: the latest rank arrives %.2f ms late on average "
                        "(threshold %.0f ms)",
                        slow_lag, o.slow_rank_ms));
  }
  return true;
}

// Large allreduce: bus bandwidth as nccl-tests defines it.
void CheckBusBandwidth(Communicator& comm, const RankCheckOptions& o,
                       std::vector<CheckResult>& out) {
  const int n = comm.size();
  auto large = TimeAllreduce(comm, std::max<size_t>(1, o.large_bytes / 4), o.large_iters, o);
  if (!large.ok()) {
    Add(out, "ranks.busbw", CheckStatus::kFail, large.status().ToString(), "");
    return;
  }
  auto large_all = AllgatherDoubles(comm, *large);
  if (!large_all.ok()) {
    Add(out, "ranks.busbw", CheckStatus::kFail, large_all.status().ToString(), "");
    return;
  }
  std::vector<double> large_min;
  for (int i = 0; i < o.large_iters; ++i) {
    double lo = (*large_all)[i];
    for (int r = 1; r < n; ++r)
      lo = std::min(lo, (*large_all)[static_cast<size_t>(r) * o.large_iters + i]);
    large_min.push_back(lo);
  }
  const double t_s = Median(large_min) / 1e3;
  const double algbw = BandwidthGBps(static_cast<double>(o.large_bytes), t_s);
  const double busbw = n > 1 ? algbw * BusBandwidthFactor(OpKind::kAllreduce, n) : algbw;
  Add(out, "ranks.busbw", busbw < o.min_busbw_gbps ? CheckStatus::kWarn : CheckStatus::kPass,
      absl::StrFormat("%.0f MiB allreduce: %.2f GB/s bus bandwidth (algbw %.2f GB/s, %.1f ms; "
                      "threshold %.2f GB/s from %s)",
                      o.large_bytes / 1048576.0, busbw, algbw, t_s * 1e3, o.min_busbw_gbps,
                      o.min_busbw_source),
      busbw < o.min_busbw_gbps ? "check link speed and the transport in use (NCCL_DEBUG=INFO "
                                 "shows NET/IB vs NET/Socket); the threshold is the profile's "
                                 "diagnose.min_busbw_gbps (or --min-busbw)"
                               : "");
}

}  // namespace

std::vector<CheckResult> RunRankChecks(const RankCheckOptions& o) {
  std::vector<CheckResult> out;
  const auto start = Clock::now();
  auto created = Communicator::Create(o.comm);
  if (!created.ok()) {
    Add(out, "ranks.store", CheckStatus::kFail,
        absl::StrCat("rendezvous failed: ", std::string(created.status().message())),
        "start every rank (adaptcomm launch -n N -- ...); check MASTER_ADDR/MASTER_PORT are the "
        "same and reachable from every node");
    return out;
  }
  Communicator& comm = **created;
  Add(out, "ranks.store", CheckStatus::kPass,
      absl::StrFormat("all %d rank(s) joined in %.0f ms (backend %s)", comm.size(),
                      std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
                      comm.backend_name()));
  if (CheckVersions(comm, o, out) && CheckLatency(comm, o, out)) CheckBusBandwidth(comm, o, out);
  return out;
}

}  // namespace adaptcomm::diag

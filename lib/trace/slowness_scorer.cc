#include "lib/trace/slowness_scorer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace adaptcomm::trace {

namespace {

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double m = v[static_cast<size_t>(mid)];
  if (v.size() % 2 == 0) m = (m + *std::max_element(v.begin(), v.begin() + mid)) / 2;
  return m;
}

}  // namespace

SlownessScorer::SlownessScorer(SlownessScorerOptions options)
    : options_(std::move(options)),
      last_seq_(static_cast<size_t>(std::max(options_.world_size, 1)), 0),
      sums_(last_seq_.size()),
      history_(last_seq_.size()),
      slow_(last_seq_.size(), false) {}

void SlownessScorer::Add(int rank, const std::vector<SlowSample>& samples) {
  if (rank < 0 || rank >= options_.world_size) return;
  const auto r = static_cast<size_t>(rank);
  const size_t world = last_seq_.size();
  for (const SlowSample& s : samples) {
    if (s.seq <= last_seq_[r]) continue;
    last_seq_[r] = s.seq;
    Pending& p = pending_[s.seq];
    if (p.by_rank.empty()) {
      p.by_rank.resize(world);
      p.got.resize(world, false);
    }
    if (p.got[r]) continue;
    p.got[r] = true;
    p.by_rank[r] = s;
    if (++p.have == options_.world_size) {
      Match(p);
      pending_.erase(s.seq);
    }
  }
  // A seq below every rank's last one will never be complete (a rank sampled at a coarser level).
  const uint64_t floor = *std::min_element(last_seq_.begin(), last_seq_.end());
  pending_.erase(pending_.begin(), pending_.lower_bound(floor));
  while (pending_.size() > options_.max_pending) pending_.erase(pending_.begin());
}

void SlownessScorer::Match(const Pending& p) {
  int64_t max_wait = 0, max_data = 0, min_data = p.by_rank[0].data_ns;
  for (const SlowSample& s : p.by_rank) {
    if (s.gap_ns <= 0) return;  // a rank's first op: no op-to-op time yet
    max_wait = std::max(max_wait, s.wait_ns);
    max_data = std::max(max_data, s.data_ns);
    min_data = std::min(min_data, s.data_ns);
  }
  for (size_t r = 0; r < p.by_rank.size(); ++r) {
    const SlowSample& s = p.by_rank[r];
    Sums& sum = sums_[r];
    sum.idle += static_cast<double>(s.idle_ns);
    sum.gap += static_cast<double>(s.gap_ns);
    sum.data_lag +=
        static_cast<double>(std::max<int64_t>((max_data - s.data_ns) - (max_wait - s.wait_ns), 0));
    sum.transfer += static_cast<double>(min_data);
  }
  ++tick_ops_;
  ++matched_;
}

std::vector<RankSlowness> SlownessScorer::Tick(absl::Time now) {
  const size_t world = sums_.size();
  if (tick_ops_ > 0) {
    double min_idle = sums_[0].idle;
    for (const Sums& s : sums_) min_idle = std::min(min_idle, s.idle);
    const auto n = static_cast<double>(tick_ops_);
    for (size_t r = 0; r < world; ++r) {
      const Sums& s = sums_[r];
      const double extra = s.idle - min_idle;
      // Ops queued back to back are entered microseconds apart: the job's time per op is then
      // their transfer, which bounds the denominator from below (ops run one at a time, so the
      // op-to-op time of ops that are not queued is at least the transfer too).
      const double den = std::max({s.gap - extra - s.data_lag, s.transfer, 0.05 * s.gap, 1.0});
      TickScore t;
      t.at = now;
      t.compute = extra / den;
      t.comm = s.data_lag / den;
      t.work_ns = s.idle / n;
      t.min_work_ns = min_idle / n;
      t.data_lag_ns = s.data_lag / n;
      t.gap_ns = s.gap / n;
      t.transfer_ns = s.transfer / n;
      t.ops = tick_ops_;
      history_[r].push_back(t);
    }
  }
  sums_.assign(world, Sums{});
  tick_ops_ = 0;
  std::vector<RankSlowness> out(world);
  for (size_t r = 0; r < world; ++r) {
    std::deque<TickScore>& h = history_[r];
    while (!h.empty() && h.front().at <= now - options_.window) h.pop_front();
    RankSlowness& v = out[r];
    v.rank = static_cast<int>(r);
    v.ticks = static_cast<int>(h.size());
    for (const TickScore& t : h) v.ops += t.ops;
    auto median = [&h](auto field) {
      std::vector<double> values;
      values.reserve(h.size());
      for (const TickScore& t : h) values.push_back(field(t));
      return MedianOf(std::move(values));
    };
    v.score = median([](const TickScore& t) { return t.compute + t.comm; });
    v.compute = median([](const TickScore& t) { return t.compute; });
    v.comm = median([](const TickScore& t) { return t.comm; });
    v.work_ms = median([](const TickScore& t) { return t.work_ns; }) / 1e6;
    v.min_work_ms = median([](const TickScore& t) { return t.min_work_ns; }) / 1e6;
    v.data_lag_ms = median([](const TickScore& t) { return t.data_lag_ns; }) / 1e6;
    v.interval_ms = median([](const TickScore& t) { return t.gap_ns; }) / 1e6;
    v.transfer_ms = median([](const TickScore& t) { return t.transfer_ns; }) / 1e6;
    const bool enough = v.ticks >= options_.min_ticks;
    if (!slow_[r] && enough && v.score > options_.threshold) {
      slow_[r] = true;
      v.changed = true;
    } else if (slow_[r] && v.score < options_.threshold / 2) {
      slow_[r] = false;
      v.changed = true;
    }
    v.slow = slow_[r];
  }
  return out;
}

std::string SlownessEvidence(const RankSlowness& r, absl::Duration window) {
  return absl::StrFormat(
      "works %.1f ms between collectives where the fastest rank works %.1f ms, op-to-op time "
      "%.1f ms, starts moving data %.1f ms late, transfer %.2f ms (medians over %s, %d ops)",
      r.work_ms, r.min_work_ms, r.interval_ms, r.data_lag_ms, r.transfer_ms,
      absl::FormatDuration(window), r.ops);
}

}  // namespace adaptcomm::trace

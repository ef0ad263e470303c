#include "lib/core/communicator/slowness_monitor.h"

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/log.h"
#include "lib/core/communicator/observability.h"
#include "lib/trace/slowness_scorer.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::internal {

std::string MonitorKey(const std::string& leaf) { return absl::StrCat("monitor/", leaf); }

namespace {

// Samples a rank publishes per look (it re-sends the previous look's too, in case the detector
// missed that one): enough for a median over a few seconds, small enough for a store value of a
// few KiB whatever the op rate.
constexpr uint64_t kSamplesPerLook = 64;

}  // namespace

struct SlownessMonitor::State {
  std::shared_ptr<Store> store;
  SlownessMonitorOptions o;
  std::atomic<bool> stopping{false};  // the destructor began: no new callback

  // The thread's own.
  int rank = -1;
  int world = 0;
  std::unique_ptr<trace::SlownessScorer> scorer;  // the detector's (rank 0)
  std::vector<std::string> hosts;
  std::vector<bool> known_slow;  // what the last verdict applied said of each rank
  uint64_t published_through = 0;
  uint64_t published_before = 0;  // published_through one look earlier
  uint64_t serial = 0;
  std::string last_verdict;
  bool warned = false;

  void Look();
  // Resets what a membership change invalidates (ranks renumbered, another detector).
  void Join(const OpExecutor::MembershipSnapshot& m);
  std::vector<trace::SlowSample> OwnSamples();
  std::string Detect(const std::vector<trace::SlowSample>& own);
  void Apply(const std::string& verdict_text);
  void Notify(const SlowRankEvent& event);
  void Warn(const absl::Status& s);
};

void SlownessMonitor::State::Join(const OpExecutor::MembershipSnapshot& m) {
  rank = m.rank;
  world = m.world_size;
  hosts.assign(static_cast<size_t>(world), "?");
  known_slow.assign(static_cast<size_t>(world), false);
  last_verdict.clear();
  scorer.reset();
  if (rank != 0) return;
  trace::SlownessScorerOptions so;
  so.world_size = world;
  so.window = o.settings.window;
  so.threshold = o.settings.slow_threshold;
  const auto looks = static_cast<int>(o.settings.window / o.settings.interval);
  so.min_ticks = std::max(3, looks / 2);
  scorer = std::make_unique<trace::SlownessScorer>(so);
}

std::vector<trace::SlowSample> SlownessMonitor::State::OwnSamples() {
  const trace::SlowSampler& sampler = *o.metrics->slow_sampler();
  const uint64_t last = sampler.last_seq();
  const int level = trace::SamplingLevelFor(last > published_through ? last - published_through : 0,
                                            kSamplesPerLook);
  std::vector<trace::SlowSample> samples = sampler.Collect(level, published_before);
  if (samples.size() > 2 * kSamplesPerLook) {
    samples.erase(samples.begin(), samples.end() - 2 * kSamplesPerLook);
  }
  published_before = published_through;
  published_through = last;
  return samples;
}

std::string SlownessMonitor::State::Detect(const std::vector<trace::SlowSample>& own) {
  hosts[static_cast<size_t>(rank)] = ThisHost();
  scorer->Add(rank, own);
  for (int q = 0; q < world; ++q) {
    if (q == rank) continue;
    absl::StatusOr<std::string> text =
        store->Get(MonitorKey(absl::StrCat("samples", q)), absl::ZeroDuration());
    if (!text.ok()) continue;  // not published yet
    absl::StatusOr<trace::DecodedSlowSamples> d = trace::DecodeSlowSamples(*text);
    if (!d.ok()) {
      Warn(d.status());
      continue;
    }
    hosts[static_cast<size_t>(q)] = d->host;
    scorer->Add(q, d->samples);
  }
  nlohmann::json v;
  v["serial"] = ++serial;
  v["world"] = world;
  v["threshold"] = o.settings.slow_threshold;
  v["window_ms"] = absl::ToInt64Milliseconds(o.settings.window);
  v["ranks"] = nlohmann::json::array();
  for (const trace::RankSlowness& r : scorer->Tick(absl::Now())) {
    v["ranks"].push_back({{"rank", r.rank},
                          {"host", hosts[static_cast<size_t>(r.rank)]},
                          {"score", r.score},
                          {"compute", r.compute},
                          {"comm", r.comm},
                          {"slow", r.slow},
                          {"evidence", trace::SlownessEvidence(r, o.settings.window)}});
  }
  return v.dump();
}

void SlownessMonitor::State::Apply(const std::string& verdict_text) {
  if (verdict_text == last_verdict) return;
  last_verdict = verdict_text;
  const nlohmann::json v = nlohmann::json::parse(verdict_text, nullptr, false);
  if (v.is_discarded() || !v.is_object() || v.value("world", -1) != world || !v.contains("ranks") ||
      !v["ranks"].is_array()) {
    return;  // another world's verdict (a membership change in progress), or not ours
  }
  for (const nlohmann::json& r : v["ranks"]) {
    const int q = r.value("rank", -1);
    if (q < 0 || q >= world) continue;
    SlowRankEvent e;
    e.rank = q;
    e.host = r.value("host", "?");
    e.slow = r.value("slow", false);
    e.score = r.value("score", 0.0);
    e.compute = r.value("compute", 0.0);
    e.comm = r.value("comm", 0.0);
    e.kind = e.comm > e.compute ? SlowKind::kComm : SlowKind::kCompute;
    e.threshold = v.value("threshold", 0.0);
    e.evidence = r.value("evidence", "");
    if (q == rank) o.metrics->SetSlownessScore(e.score);
    if (e.slow == known_slow[static_cast<size_t>(q)]) continue;
    known_slow[static_cast<size_t>(q)] = e.slow;
    const std::string line = absl::StrFormat(
        "%s: communicator '%s' rank %d on host %s, score %.3f (%s-slow; threshold %.3f, "
        "window %s): %s",
        e.slow ? "slow rank" : "slow rank recovered", o.comm, q, e.host, e.score,
        e.kind == SlowKind::kComm ? "comm" : "compute", e.threshold,
        absl::FormatDuration(o.settings.window), e.evidence);
    if (rank == 0) {
      // One line for the job: the detector's.
      if (e.slow) {
        ADAPTCOMM_LOG(kWarning, line);
      } else {
        ADAPTCOMM_LOG(kInfo, line);
      }
    }
    o.recorder->AddEvent(line);
    Notify(e);
  }
}

void SlownessMonitor::State::Notify(const SlowRankEvent& event) {
  if (o.on_slow_rank && !stopping.load()) o.on_slow_rank(event);
}

void SlownessMonitor::State::Warn(const absl::Status& s) {
  if (warned) return;
  warned = true;  // the store going away ends the job elsewhere; say it once here
  ADAPTCOMM_LOG(kDebug, "fail-slow monitor of communicator '", o.comm, "': ", s.ToString());
}

void SlownessMonitor::State::Look() {
  const OpExecutor::MembershipSnapshot m = o.membership();
  if (m.world_size < 2) return;
  if (m.rank != rank || m.world_size != world) Join(m);
  const std::vector<trace::SlowSample> own = OwnSamples();
  if (absl::Status w = store->Set(MonitorKey(absl::StrCat("samples", rank)),
                                  trace::EncodeSlowSamples(ThisHost(), own));
      !w.ok()) {
    Warn(w);
  }
  std::string verdict;
  if (scorer != nullptr) {
    verdict = Detect(own);
    if (absl::Status w = store->Set(MonitorKey("verdict"), verdict); !w.ok()) Warn(w);
  } else {
    absl::StatusOr<std::string> got = store->Get(MonitorKey("verdict"), absl::ZeroDuration());
    if (got.ok()) verdict = *std::move(got);
  }
  if (!verdict.empty()) Apply(verdict);
}

SlownessMonitor::SlownessMonitor(std::shared_ptr<Store> store, SlownessMonitorOptions options)
    : state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->o = std::move(options);
  thread_ = std::make_unique<PeriodicThread>(
      state_->o.settings.interval, [s = state_](bool) { s->Look(); }, /*last_look=*/false);
}

SlownessMonitor::~SlownessMonitor() {
  state_->stopping.store(true);
  thread_.reset();
}

}  // namespace adaptcomm::internal

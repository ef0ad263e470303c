// Online fail-slow detection, end to end: 4 ranks as threads over Gloo, one or two of them
// working 30% longer per step, are named by every rank's callback, the detector's log line, the
// state record's slowness and every rank's flight record; a clean run names nobody. Short windows
// (monitor.interval 200ms, window 4s) keep each test to a few seconds; the 20-run sweeps with the
// default window are in failslow_soak.cc. The scorer's arithmetic is tested on its own below.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/trace/slow_sampler.h"
#include "lib/trace/slowness_scorer.h"
#include "tests/slow_job.h"

namespace adaptcomm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::RunSlowJob;
using testing::SlowJobResult;
using testing::SlowJobSpec;

// The collective's own time lowers a slow rank's score (it costs the job less): on a loaded CI
// host Gloo's 4 KiB allreduce among 4 threads can take a third of the step, so the threshold is
// low. A 2 s window named a clean rank whose thread the loaded host starved for over a second.
constexpr double kThreshold = 0.1;
constexpr const char* kFastMonitor =
    "    interval: 200ms\n    window: 4s\n    slow_threshold: 0.1\n";

void ExpectNamed(const SlowJobResult& result, const std::vector<int>& slowed,
                 const std::string& comm) {
  EXPECT_TRUE(result.values_ok);
  EXPECT_LE(testing::TimeAllTold(result, slowed), absl::Seconds(30));
  EXPECT_THAT(testing::WronglyNamed(result, slowed), ::testing::IsEmpty());
  for (size_t r = 0; r < result.events.size(); ++r) {
    for (int s : slowed) {
      bool seen = false;
      for (const testing::TimedEvent& t : result.events[r]) {
        if (t.event.rank != s || !t.event.slow) continue;
        seen = true;
        EXPECT_EQ(t.event.kind, SlowKind::kCompute) << "rank " << r << " told of " << s;
        // 30% more work per step with the allreduce far shorter than the step: about 0.3.
        EXPECT_GT(t.event.score, kThreshold) << "rank " << r << " told of " << s;
        EXPECT_LT(t.event.score, 0.6) << "rank " << r << " told of " << s;
        EXPECT_FALSE(t.event.host.empty());
        EXPECT_THAT(t.event.evidence, HasSubstr("between collectives"));
      }
      EXPECT_TRUE(seen) << "rank " << r << " was not told of rank " << s;
      bool recorded = false;
      for (const std::string& e : result.flight_events[r]) {
        recorded |= e.find(absl::StrCat("slow rank: communicator '", comm, "' rank ", s)) == 0;
      }
      EXPECT_TRUE(recorded) << "rank " << r << "'s flight record has no event for rank " << s;
    }
  }
  for (int s : slowed) {
    EXPECT_GT(result.status_slowness[static_cast<size_t>(s)], kThreshold / 2) << "rank " << s;
  }
}

TEST(FailSlow, OneRankThirtyPercentSlowIsNamedByEveryRank) {
  SlowJobSpec spec;
  spec.name = "failslow_one";
  spec.slowdown = {0, 0, 0.3, 0};
  spec.monitor_yaml = kFastMonitor;
  ::testing::internal::CaptureStderr();
  const SlowJobResult result = RunSlowJob(spec);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ExpectNamed(result, {2}, spec.name);
  // The detector's one line, with the rank, its host, the score and the evidence.
  size_t lines = 0;
  for (size_t at = log.find("slow rank: communicator 'failslow_one' rank 2 on host ");
       at != std::string::npos;
       at = log.find("slow rank: communicator 'failslow_one' rank 2 on host ", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << log;
  EXPECT_THAT(log, HasSubstr("compute-slow; threshold 0.100"));
  EXPECT_THAT(log, HasSubstr("where the fastest rank works"));
  EXPECT_LT(result.status_slowness[0], kThreshold);
}

TEST(FailSlow, TwoSlowRanksAreBothNamed) {
  SlowJobSpec spec;
  spec.name = "failslow_two";
  spec.slowdown = {0, 0.3, 0, 0.3};
  spec.monitor_yaml = kFastMonitor;
  ExpectNamed(RunSlowJob(spec), {1, 3}, spec.name);
}

TEST(FailSlow, CleanRunNamesNobody) {
  SlowJobSpec spec;
  spec.name = "failslow_clean";
  spec.monitor_yaml = kFastMonitor;
  spec.bound = absl::Seconds(10);
  spec.keep_running = true;
  const SlowJobResult result = RunSlowJob(spec);
  EXPECT_TRUE(result.values_ok);
  EXPECT_GE(result.ran, absl::Seconds(10));
  for (size_t r = 0; r < result.events.size(); ++r) {
    std::printf("clean run: rank %zu scores %.3f\n", r, result.status_slowness[r]);
    EXPECT_TRUE(result.events[r].empty())
        << "rank " << r << " told of rank " << result.events[r][0].event.rank << ": "
        << result.events[r][0].event.evidence;
    EXPECT_GE(result.status_slowness[r], 0.0) << "rank " << r << " has no state record";
    EXPECT_LT(result.status_slowness[r], kThreshold) << "rank " << r;
  }
}

// Out-of-range monitor settings are refused when the profile loads, naming the file and line.
TEST(FailSlowProfile, OutOfRangeRefusedAtLoadWithFileAndLine) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/failslow_range.yaml");
  auto load = [&path](const std::string& monitor) {
    std::ofstream(path) << "schema: 1\ndefaults:\n  monitor:\n"
                        << monitor << "tiers:\n  - name: only\n";
    ProfileRequest req;
    req.file = path;
    return ResolveProfile(req);
  };
  absl::StatusOr<EffectiveConfig> cfg = load("    enabled: true\n    slow_threshold: 20\n");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr(path + ":5"));
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("monitor.slow_threshold"));
  cfg = load("    interval: 1s\n    window: 2s\n");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("monitor.window 2s (" + path + ":5"));
  cfg = load("    interval: 50ms\n");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("monitor.interval"));
  cfg = load("    interval: 500ms\n    window: 30s\n    slow_threshold: 0.05\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->monitor.window, absl::Seconds(30));
  EXPECT_EQ(cfg->monitor.slow_threshold, 0.05);
}

// ---- the parts ----

TEST(SlowSampler, KeepsTheSameSeqsAtEveryLevelOnEveryRankAndCountsIdleTime) {
  trace::SlowSampler a;
  // Op n entered at 10n ms, started 1 ms later, done at 10n + 4 ms.
  constexpr int64_t kMs = 1000000;
  for (uint64_t seq = 1; seq <= 5000; ++seq) {
    const auto t = static_cast<int64_t>(seq) * 10 * kMs;
    a.End(seq, true, t, t + kMs, t + 4 * kMs);
  }
  EXPECT_EQ(a.last_seq(), 5000u);
  const std::vector<trace::SlowSample> all = a.Collect(0, 4990);
  ASSERT_EQ(all.size(), 10u);
  EXPECT_EQ(all[0].seq, 4991u);
  EXPECT_EQ(all[0].wait_ns, 4 * kMs);
  EXPECT_EQ(all[0].data_ns, 3 * kMs);
  EXPECT_EQ(all[0].gap_ns, 10 * kMs);
  EXPECT_EQ(all[0].idle_ns, 6 * kMs);  // the previous op completed 6 ms before this one began
  // Level 1 holds about 1 op in 16, chosen by seq alone.
  const std::vector<trace::SlowSample> coarse = a.Collect(1, 0);
  EXPECT_GT(coarse.size(), 200u);
  EXPECT_LE(coarse.size(), trace::SlowSampler::kSlots);
  for (const trace::SlowSample& s : coarse) EXPECT_GE(trace::SlowSampler::LevelOf(s.seq), 1);
  EXPECT_EQ(trace::SamplingLevelFor(50, 64), 0);
  EXPECT_EQ(trace::SamplingLevelFor(1000, 64), 1);
  EXPECT_EQ(trace::SamplingLevelFor(uint64_t{1} << 40, 64), trace::SlowSampler::kLevels - 1);
  // A failed op or a send is not kept, but moves the next op's gap and idle time.
  trace::SlowSampler b;
  b.End(1, true, 0 + 1, 1, 2 * kMs);
  b.End(2, false, 5 * kMs, 5 * kMs, 6 * kMs);
  b.End(3, true, 7 * kMs, 7 * kMs, 8 * kMs);
  const std::vector<trace::SlowSample> kept = b.Collect(0, 0);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[1].seq, 3u);
  EXPECT_EQ(kept[1].gap_ns, 2 * kMs);
  EXPECT_EQ(kept[1].idle_ns, 1 * kMs);
  const std::string text = trace::EncodeSlowSamples("h1", kept);
  absl::StatusOr<trace::DecodedSlowSamples> back = trace::DecodeSlowSamples(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->host, "h1");
  ASSERT_EQ(back->samples.size(), 2u);
  EXPECT_EQ(back->samples[1].idle_ns, 1 * kMs);
  EXPECT_FALSE(trace::DecodeSlowSamples("1 2 3 4 5\n").ok());
  EXPECT_FALSE(trace::DecodeSlowSamples("host h\n1 2 x 4 5\n").ok());
}

// Rank r works `work[r]` ms between collectives; the collective takes 1 ms once all are in.
std::vector<trace::SlowSample> Lockstep(const std::vector<double>& work, int rank, uint64_t from,
                                        int ops) {
  double slowest = 0;
  for (double w : work) slowest = std::max(slowest, w);
  constexpr double kMs = 1e6;
  std::vector<trace::SlowSample> out;
  for (int i = 0; i < ops; ++i) {
    trace::SlowSample s;
    s.seq = from + static_cast<uint64_t>(i);
    s.idle_ns = static_cast<int64_t>(work[static_cast<size_t>(rank)] * kMs);
    s.wait_ns = static_cast<int64_t>((slowest - work[static_cast<size_t>(rank)] + 1) * kMs);
    s.data_ns = s.wait_ns;  // a host op starts when it is entered
    s.gap_ns = static_cast<int64_t>((slowest + 1) * kMs);
    out.push_back(s);
  }
  return out;
}

TEST(SlownessScorer, ScoresTheExtraWorkOverTheOthersOpToOpTimeAndNeedsASustainedWindow) {
  trace::SlownessScorerOptions o;
  o.world_size = 4;
  o.window = absl::Seconds(5);
  o.threshold = 0.15;
  o.min_ticks = 3;
  trace::SlownessScorer scorer(o);
  const std::vector<double> work = {10, 10, 13, 10};  // rank 2: 30% more work
  absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  uint64_t seq = 1;
  std::vector<trace::RankSlowness> v;
  for (int tick = 0; tick < 3; ++tick) {
    for (int r = 0; r < 4; ++r) scorer.Add(r, Lockstep(work, r, seq, 20));
    seq += 20;
    now += absl::Seconds(1);
    v = scorer.Tick(now);
    ASSERT_EQ(v.size(), 4u);
    // Named on the third tick with samples, not before.
    EXPECT_EQ(v[2].slow, tick == 2) << "tick " << tick;
    EXPECT_EQ(v[2].changed, tick == 2) << "tick " << tick;
  }
  // 3 ms more work over the 11 ms the others' op-to-op time would be without it.
  EXPECT_NEAR(v[2].score, 3.0 / 11.0, 1e-9);
  EXPECT_NEAR(v[2].compute, 3.0 / 11.0, 1e-9);
  EXPECT_EQ(v[2].comm, 0.0);
  EXPECT_NEAR(v[2].work_ms, 13, 1e-9);
  EXPECT_NEAR(v[2].min_work_ms, 10, 1e-9);
  EXPECT_EQ(v[2].ops, 60u);
  for (int r : {0, 1, 3}) EXPECT_FALSE(v[static_cast<size_t>(r)].slow) << r;
  EXPECT_EQ(scorer.matched(), 60u);
  // Samples sent again (a rank re-publishes its previous look) are not counted twice; one rank
  // missing an op leaves it unmatched.
  scorer.Add(0, Lockstep(work, 0, 1, 20));
  for (int r = 0; r < 3; ++r) scorer.Add(r, Lockstep(work, r, seq, 5));
  EXPECT_EQ(scorer.matched(), 60u);
  // Back to even work: cleared once the window's median falls below half the threshold.
  const std::vector<double> even = {10, 10, 10, 10};
  bool cleared = false;
  for (int tick = 0; tick < 6 && !cleared; ++tick) {
    seq += 20;
    for (int r = 0; r < 4; ++r) scorer.Add(r, Lockstep(even, r, seq, 20));
    now += absl::Seconds(1);
    v = scorer.Tick(now);
    cleared = !v[2].slow;
    if (cleared) {
      EXPECT_TRUE(v[2].changed);
    }
  }
  EXPECT_TRUE(cleared);
  EXPECT_THAT(trace::SlownessEvidence(v[2], o.window),
              HasSubstr("where the fastest rank works 10.0 ms"));
}

TEST(SlownessScorer, OneLongPauseDoesNotNameARank) {
  trace::SlownessScorerOptions o;
  o.world_size = 2;
  o.window = absl::Seconds(5);
  o.min_ticks = 3;
  trace::SlownessScorer scorer(o);
  absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  uint64_t seq = 1;
  for (int tick = 0; tick < 5; ++tick) {
    // Tick 2: rank 1 pauses 2 s once (a checkpoint, a page-cache flush).
    const std::vector<double> work = {10, tick == 2 ? 2000.0 : 10.0};
    for (int r = 0; r < 2; ++r) scorer.Add(r, Lockstep(work, r, seq, tick == 2 ? 1 : 20));
    seq += 20;
    now += absl::Seconds(1);
    const std::vector<trace::RankSlowness> v = scorer.Tick(now);
    EXPECT_FALSE(v[1].slow) << "tick " << tick;
  }
}

TEST(SlownessScorer, StartingDataLateIsCommSlow) {
  trace::SlownessScorerOptions o;
  o.world_size = 2;
  o.min_ticks = 1;
  trace::SlownessScorer scorer(o);
  constexpr int64_t kMs = 1000000;
  // Both enter at once and wait 5 ms; rank 1 starts moving data 3 ms after it entered.
  for (int r = 0; r < 2; ++r) {
    std::vector<trace::SlowSample> s;
    for (uint64_t seq = 1; seq <= 10; ++seq) {
      s.push_back({seq, 5 * kMs, r == 1 ? 2 * kMs : 5 * kMs, 15 * kMs, 10 * kMs});
    }
    scorer.Add(r, s);
  }
  const std::vector<trace::RankSlowness> v = scorer.Tick(absl::UnixEpoch() + absl::Hours(1));
  EXPECT_EQ(v[1].compute, 0.0);
  EXPECT_NEAR(v[1].comm, 3.0 / 12.0, 1e-9);
  EXPECT_TRUE(v[1].slow);
  EXPECT_FALSE(v[0].slow);
  EXPECT_THAT(std::vector<bool>({v[0].changed, v[1].changed}), ElementsAre(false, true));
}

// Ops queued back to back (a bucketer's allreduces, a trainer that waits once per step): every
// rank enters them microseconds apart, and each one's data phase starts when the previous op
// completes on that rank, a few microseconds apart between ranks. The job's time per op is the
// transfer, not the microseconds between entries: a few microseconds of lag are no slowness.
TEST(SlownessScorer, QueuedOpsScoreLagAgainstTheTransferNotTheIssueGap) {
  trace::SlownessScorerOptions o;
  o.world_size = 2;
  o.min_ticks = 1;
  constexpr int64_t kUs = 1000;
  auto queued = [&](int64_t lag_us) {
    trace::SlownessScorer scorer(o);
    for (int r = 0; r < 2; ++r) {
      std::vector<trace::SlowSample> s;
      for (uint64_t seq = 1; seq <= 100; ++seq) {
        // Entered 2 us after the previous op; queued for seq ms behind it; a 2 ms data phase,
        // rank 1's starting lag_us later (both leave together).
        const int64_t wait = static_cast<int64_t>(seq) * 2000 * kUs;
        const int64_t data = (2000 - (r == 1 ? lag_us : 0)) * kUs;
        s.push_back({seq, wait, data, 2 * kUs, 0});
      }
      scorer.Add(r, s);
    }
    return scorer.Tick(absl::UnixEpoch() + absl::Hours(1));
  };
  std::vector<trace::RankSlowness> v = queued(5);
  EXPECT_FALSE(v[1].slow) << v[1].score;
  EXPECT_NEAR(v[1].comm, 5.0 / 1995.0, 1e-9);  // against the 1,995 us transfer once both were in
  EXPECT_FALSE(v[0].slow);
  // A rank that starts every queued transfer 1 ms late is slow: 1 ms lost per 1 ms transfer.
  v = queued(1000);
  EXPECT_TRUE(v[1].slow);
  EXPECT_NEAR(v[1].comm, 1000.0 / 1000.0, 1e-9);
}

}  // namespace
}  // namespace adaptcomm

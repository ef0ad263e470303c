// The timeline writer (Chrome trace per rank) and the clock-offset estimate, checked against the
// format `adaptcomm trace merge/heatmap` read (lib/diag), and end to end on 4 ranks with a slowed
// rank that the heatmap must rank first.
#include <stdlib.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/store.h"
#include "gtest/gtest.h"
#include "lib/diag/heatmap.h"
#include "lib/diag/trace_merge.h"
#include "lib/trace/clock_sync.h"
#include "lib/trace/timeline_writer.h"
#include "nlohmann/json.hpp"
#include "tests/harness.h"
#include "tests/sanitizer_build.h"

namespace adaptcomm::trace {
namespace {

std::string MakeTempDir(const std::string& tag) {
  std::string dir = ::testing::TempDir() + "/timeline_" + tag + "_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) return "";
  return dir;
}

// Removes its directory at the end of the test (the end-to-end tests keep theirs to look at).
class ScopedDir {
 public:
  explicit ScopedDir(const std::string& tag) : path_(MakeTempDir(tag)) {}
  ~ScopedDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json ParseFile(const std::string& path) {
  return nlohmann::json::parse(ReadAll(path), nullptr, /*allow_exceptions=*/false);
}

OpDesc Allreduce(uint64_t seq, float* data, size_t count) {
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.input = HostView(data, count);
  op.output = op.input;
  op.seq = seq;
  return op;
}

// Feeds the writer one op lasting `dur`, starting `late` after its enqueue.
void Feed(TimelineWriter& w, const OpDesc& op, absl::Time enq, absl::Duration late,
          absl::Duration dur, const absl::Status& status = absl::OkStatus()) {
  w.OnEnqueue(op, enq);
  w.OnStart(op, enq + late);
  w.OnEnd(op, status, enq + late + dur);
}

std::vector<nlohmann::json> OpEvents(const nlohmann::json& trace) {
  std::vector<nlohmann::json> out;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "X") out.push_back(e);
  }
  return out;
}

// ---------------------------------------------------------------- clock sync

TEST(ClockSyncTest, SameClockGivesNearZeroOffset) {
  constexpr int kWorld = 4;
  auto store = CreateHashStore();
  std::vector<ClockOffsetEstimate> est(kWorld);
  std::vector<absl::Status> st(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      auto e = EstimateClockOffset(*store, r, kWorld, absl::Seconds(10), ClockSyncOptions{});
      st[r] = e.status();
      if (e.ok()) est[r] = *e;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    // The estimate's error is at most half the round trip it was taken from.
    EXPECT_LE(std::abs(est[r].offset_us), est[r].rtt_us / 2 + 1) << "rank " << r;
    EXPECT_LT(std::abs(est[r].offset_us), 2000) << "rank " << r;
  }
  EXPECT_EQ(est[0].offset_us, 0);
  // Every key was deleted by its reader: nothing of the protocol is left in the store.
  for (int r = 1; r < kWorld; ++r) {
    for (int i = 0; i < ClockSyncOptions{}.rounds; ++i) {
      EXPECT_TRUE(absl::IsNotFound(
          store->Get(absl::StrCat("clock_sync/req/", r, "/", i), absl::ZeroDuration()).status()));
      EXPECT_TRUE(absl::IsNotFound(
          store->Get(absl::StrCat("clock_sync/resp/", r, "/", i), absl::ZeroDuration()).status()));
    }
  }
}

TEST(ClockSyncTest, InjectedSkewIsEstimatedWithinMilliseconds) {
  constexpr int kWorld = 3;
  const absl::Duration skew[kWorld] = {absl::ZeroDuration(), absl::Seconds(5),
                                       -absl::Milliseconds(3250)};
  auto store = CreateHashStore();
  std::vector<double> offset(kWorld, 1e18);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      ClockSyncOptions o;
      o.clock = [d = skew[r]] { return absl::Now() + d; };
      auto e = EstimateClockOffset(*store, r, kWorld, absl::Seconds(10), o);
      if (e.ok()) offset[r] = e->offset_us;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NEAR(offset[0], 0, 1);
  EXPECT_NEAR(offset[1], 5e6, 3000);
  EXPECT_NEAR(offset[2], -3.25e6, 3000);
}

TEST(ClockSyncTest, WorksOverTheTcpStore) {
  TcpStoreOptions so;
  so.port = 0;
  auto server = StartTcpStoreServer(so);
  ASSERT_TRUE(server.ok()) << server.status();
  so.port = (*server)->port();
  std::vector<double> offset(2, 1e18);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto store = ConnectTcpStore(so);
      if (!store.ok()) return;
      ClockSyncOptions o;
      if (r == 1) o.clock = [] { return absl::Now() + absl::Seconds(5); };
      auto e = EstimateClockOffset(**store, r, 2, absl::Seconds(10), o);
      if (e.ok()) offset[r] = e->offset_us;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NEAR(offset[1], 5e6, 3000);
}

TEST(ClockSyncTest, AbsentRankFailsWithinTheBound) {
  auto store = CreateHashStore();
  const absl::Time t0 = absl::Now();
  auto e = EstimateClockOffset(*store, 0, 2, absl::Milliseconds(200));  // rank 1 never comes
  EXPECT_TRUE(absl::IsDeadlineExceeded(e.status())) << e.status();
  EXPECT_NE(e.status().message().find("rank 1"), std::string::npos) << e.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  EXPECT_TRUE(
      absl::IsInvalidArgument(EstimateClockOffset(*store, 2, 2, absl::Seconds(1)).status()));
}

// ---------------------------------------------------------------- writer format

TEST(TimelineWriterTest, WritesTheFormatMergeAndHeatmapRead) {
  const ScopedDir scoped("format");
  const std::string& dir = scoped.path();
  ASSERT_FALSE(dir.empty());
  std::vector<float> data(256);
  const absl::Time base = absl::FromUnixMicros(1700000000000000);
  for (int rank = 0; rank < 2; ++rank) {
    TimelineOptions o;
    o.rank = rank;
    o.world_size = 2;
    o.dir = dir;
    o.clock_offset_us = rank == 1 ? 5e6 : 0;  // rank 1's clock reads 5 s ahead
    o.communicator = "comm \"x\"";
    auto w = OpenTimeline(o);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->path(), absl::StrCat(dir, "/trace.rank", rank, ".json"));
    for (uint64_t s = 1; s <= 5; ++s) {
      const absl::Time enq =
          base + absl::Milliseconds(10 * s) +
          (rank == 1 ? absl::Seconds(5) + absl::Milliseconds(4) : absl::ZeroDuration());
      Feed(**w, Allreduce(s, data.data(), data.size()), enq, absl::Microseconds(250),
           absl::Microseconds(1500));
    }
    ASSERT_TRUE((*w)->Close().ok());
    EXPECT_TRUE((*w)->Close().ok());  // idempotent
  }
  const nlohmann::json t = ParseFile(dir + "/trace.rank1.json");
  ASSERT_FALSE(t.is_discarded());
  const auto events = OpEvents(t);
  ASSERT_EQ(events.size(), 5u);
  const nlohmann::json& e = events[0];
  EXPECT_EQ(e["name"], "allreduce");
  EXPECT_EQ(e["cat"], "collective");
  EXPECT_EQ(e["pid"], 1);
  EXPECT_EQ(e["tid"], 0);
  EXPECT_EQ(e["ts"].get<int64_t>(), 1700000000000000 + 5000000 + 4000 + 10000 + 250);
  EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 1500);
  EXPECT_EQ(e["args"]["seq"], 1);
  EXPECT_EQ(e["args"]["dtype"], "f32");
  EXPECT_EQ(e["args"]["count"], 256);
  EXPECT_EQ(e["args"]["bytes"], 1024);
  EXPECT_EQ(e["args"]["enqueue_ts"].get<int64_t>(), 1700000000000000 + 5000000 + 4000 + 10000);
  EXPECT_EQ(e["args"]["status"], "ok");
  const nlohmann::json& other = t["otherData"];
  EXPECT_EQ(other["rank"], 1);
  EXPECT_EQ(other["world_size"], 2);
  EXPECT_DOUBLE_EQ(other["clock_offset_us"].get<double>(), 5e6);
  EXPECT_EQ(other["truncated"], false);
  EXPECT_EQ(other["communicator"], "comm \"x\"");
  EXPECT_EQ(other["events_written"], 5);
  EXPECT_EQ(other["ops_seen"], 5);

  // Through lib/diag: onto rank 0's clock, rank 1 starts each op 4 ms late.
  auto files = diag::ListRankTraces(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  auto merged = diag::MergeTraces(*files);
  ASSERT_TRUE(merged.ok()) << merged.status();
  auto table = diag::ComputeLateness(*merged);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->seqs.size(), 5u);
  ASSERT_EQ(table->ranking.size(), 2u);
  EXPECT_EQ(table->ranking[0].rank, 1);
  EXPECT_NEAR(table->ranking[0].mean_us, 4000, 1);
  for (size_t s = 0; s < table->seqs.size(); ++s) EXPECT_NEAR(table->late_us[1][s], 4000, 1);
}

TEST(TimelineWriterTest, SamplingKeepsTheSameSeqsOnEveryRankAndEveryFailure) {
  const ScopedDir scoped("sample");
  const std::string& dir = scoped.path();
  TimelineOptions o;
  o.dir = dir;
  o.sample_every = 4;
  auto w = OpenTimeline(o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> data(8);
  const absl::Time base = absl::Now();
  for (uint64_t s = 1; s <= 20; ++s) {
    const absl::Status st =
        s == 6 || s == 9 ? absl::DeadlineExceededError("timed out after 1s") : absl::OkStatus();
    Feed(**w, Allreduce(s, data.data(), data.size()), base + absl::Milliseconds(s),
         absl::Microseconds(10), absl::Microseconds(100), st);
  }
  ASSERT_TRUE((*w)->Close().ok());
  const nlohmann::json t = ParseFile((*w)->path());
  ASSERT_FALSE(t.is_discarded());
  std::set<int> seqs;
  for (const auto& e : OpEvents(t)) {
    const int seq = e["args"]["seq"].get<int>();
    seqs.insert(seq);
    if (seq == 6 || seq == 9) {
      EXPECT_EQ(e["args"]["status"], "failed");
      EXPECT_NE(e["args"]["error"].get<std::string>().find("timed out"), std::string::npos);
      EXPECT_EQ(e["cname"], "terrible");
    } else {
      EXPECT_EQ(e["args"]["status"], "ok");
    }
  }
  EXPECT_EQ(seqs, (std::set<int>{1, 5, 6, 9, 13, 17}));
  EXPECT_EQ(t["otherData"]["ops_seen"], 20);
  EXPECT_EQ(t["otherData"]["failed_ops"], 2);
  EXPECT_EQ(t["otherData"]["sample_every"], 4);
}

TEST(TimelineWriterTest, ByteCapStopsWritingAndSaysTruncated) {
  const ScopedDir scoped("cap");
  const std::string& dir = scoped.path();
  TimelineOptions o;
  o.dir = dir;
  o.max_bytes = 8192;
  o.flush_every_events = 16;  // several flushes, so the cap is crossed between them too
  auto w = OpenTimeline(o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> data(8);
  const absl::Time base = absl::Now();
  for (uint64_t s = 1; s <= 1000; ++s) {
    Feed(**w, Allreduce(s, data.data(), data.size()), base + absl::Microseconds(s),
         absl::ZeroDuration(), absl::Microseconds(1));
  }
  ASSERT_TRUE((*w)->Close().ok());
  const TimelineWriter::Stats st = (*w)->stats();
  struct stat sb;
  ASSERT_EQ(stat((*w)->path().c_str(), &sb), 0);
  EXPECT_LE(static_cast<size_t>(sb.st_size), o.max_bytes);
  EXPECT_EQ(static_cast<uint64_t>(sb.st_size), st.bytes);
  EXPECT_GT(sb.st_size, 4096);  // it filled most of the cap rather than stopping early
  const nlohmann::json t = ParseFile((*w)->path());
  ASSERT_FALSE(t.is_discarded());
  EXPECT_EQ(t["otherData"]["truncated"], true);
  EXPECT_TRUE(st.truncated);
  const size_t events = OpEvents(t).size();
  EXPECT_GT(events, 10u);
  EXPECT_LT(events, 1000u);
  EXPECT_EQ(st.events_written, events);
  EXPECT_EQ(st.events_written + st.dropped, 1000u);
  EXPECT_EQ(t["otherData"]["dropped"].get<uint64_t>(), st.dropped);
  // The kept events are the first ones, in order: the start of the run survives.
  EXPECT_EQ(OpEvents(t).front()["args"]["seq"], 1);
  EXPECT_EQ(OpEvents(t).back()["args"]["seq"].get<size_t>(), events);
}

TEST(TimelineWriterTest, FlushesPeriodicallyWithoutClose) {
  const ScopedDir scoped("periodic");
  const std::string& dir = scoped.path();
  TimelineOptions o;
  o.dir = dir;
  o.flush_interval = absl::Milliseconds(20);
  auto w = OpenTimeline(o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> data(8);
  for (uint64_t s = 1; s <= 3; ++s) {
    Feed(**w, Allreduce(s, data.data(), data.size()), absl::Now(), absl::ZeroDuration(),
         absl::Microseconds(5));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  size_t found = 0;
  while (absl::Now() < deadline) {
    const std::string text = ReadAll((*w)->path());
    found = 0;
    for (size_t p = text.find("\"ph\":\"X\""); p != std::string::npos;
         p = text.find("\"ph\":\"X\"", p + 1)) {
      ++found;
    }
    if (found == 3) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(found, 3u) << "the writer thread did not flush within 5 s";
}

TEST(TimelineWriterTest, CrashedRankFileCanBeRecoveredAndMerged) {
  const ScopedDir scoped("crash");
  const std::string& dir = scoped.path();
  TimelineOptions o;
  o.rank = 3;
  o.world_size = 4;
  o.dir = dir;
  o.clock_offset_us = -1234.5;
  auto w = OpenTimeline(o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> data(8);
  for (uint64_t s = 1; s <= 7; ++s) {
    Feed(**w, Allreduce(s, data.data(), data.size()), absl::Now(), absl::ZeroDuration(),
         absl::Microseconds(5));
  }
  ASSERT_TRUE((*w)->Flush().ok());
  // The file as a killed process leaves it, plus a torn last event.
  const std::string crashed = dir + "/crashed/trace.rank3.json";
  ASSERT_EQ(mkdir((dir + "/crashed").c_str(), 0755), 0);
  {
    std::ofstream out(crashed, std::ios::binary);
    out << ReadAll((*w)->path()) << ",\n{\"name\":\"allreduce\",\"cat\":\"coll";
  }
  EXPECT_TRUE(ParseFile(crashed).is_discarded());
  ASSERT_TRUE(RecoverTimeline(crashed).ok());
  const nlohmann::json t = ParseFile(crashed);
  ASSERT_FALSE(t.is_discarded());
  EXPECT_EQ(OpEvents(t).size(), 7u);
  EXPECT_EQ(t["otherData"]["rank"], 3);
  EXPECT_EQ(t["otherData"]["world_size"], 4);
  EXPECT_DOUBLE_EQ(t["otherData"]["clock_offset_us"].get<double>(), -1234.5);
  EXPECT_EQ(t["otherData"]["recovered"], true);
  EXPECT_TRUE(diag::MergeTraces({crashed}).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(RecoverTimeline(crashed)));  // complete now
  ASSERT_TRUE((*w)->Close().ok());
}

TEST(TimelineWriterTest, RejectsBadOptionsAndIgnoresOpsAfterClose) {
  TimelineOptions o;
  const ScopedDir bad("bad"), after("after_close");
  o.dir = bad.path();
  o.sample_every = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(OpenTimeline(o).status()));
  o.sample_every = 1;
  o.max_bytes = 100;
  EXPECT_TRUE(absl::IsInvalidArgument(OpenTimeline(o).status()));
  o.max_bytes = 1 << 20;
  o.rank = 4;
  o.world_size = 4;
  EXPECT_TRUE(absl::IsInvalidArgument(OpenTimeline(o).status()));
  o.rank = 0;
  o.dir = "/proc/no/such/dir";
  EXPECT_FALSE(OpenTimeline(o).ok());
  o.dir = after.path();
  auto w = OpenTimeline(o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Close().ok());
  std::vector<float> data(8);
  Feed(**w, Allreduce(1, data.data(), data.size()), absl::Now(), absl::ZeroDuration(),
       absl::Microseconds(5));
  const nlohmann::json t = ParseFile((*w)->path());
  ASSERT_FALSE(t.is_discarded());
  EXPECT_TRUE(OpEvents(t).empty());
}

// Guards the "tiny overhead" promise: the op thread only appends to memory.
TEST(TimelineWriterTest, PerOpCostStaysInMicroseconds) {
  TimelineOptions o;
  const ScopedDir scoped("cost");
  o.dir = scoped.path();
  auto w = OpenTimeline(o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> data(8);
  constexpr int kOps = 50000;
  const absl::Time t0 = absl::Now();
  for (uint64_t s = 1; s <= kOps; ++s) {
    const OpDesc op = Allreduce(s, data.data(), data.size());
    (*w)->OnEnqueue(op, t0);
    (*w)->OnStart(op, t0);
    (*w)->OnEnd(op, absl::OkStatus(), t0);
  }
  const double per_op_us = absl::ToDoubleMicroseconds(absl::Now() - t0) / kOps;
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ((*w)->stats().events_written, static_cast<uint64_t>(kOps));
  // Typically well under 1 us; the bound leaves room for a loaded 2-core machine. TSan's
  // instrumentation alone makes it 15 us on an idle one (22.5 us beside the rest of the suite).
  constexpr double kBoundUs = adaptcomm::testing::kUnderSanitizer ? 100.0 : 20.0;
  EXPECT_LT(per_op_us, kBoundUs);
  std::printf("timeline writer: %.3f us per op (enqueue+start+end, all sampled)\n", per_op_us);
}

// ---------------------------------------------------------------- end to end

// 4 ranks with real Gloo allreduces; rank 2 sleeps 30 ms before each one. The writer is fed
// around each collective the way the executor feeds its observers (enqueue, start, end).
TEST(TimelineEndToEndTest, SlowedRankIsRankedFirstInTheHeatmap) {
  constexpr int kWorld = 4;
  constexpr int kSlow = 2;
  constexpr int kOps = 12;
  const std::string dir = MakeTempDir("e2e");
  ASSERT_FALSE(dir.empty());
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions opts = env.options;
        opts.backend = BackendChoice::kGloo;
        opts.timeout = absl::Seconds(30);
        auto comm = Communicator::Create(opts);
        ASSERT_TRUE(comm.ok()) << comm.status();
        TimelineOptions to;
        to.rank = env.rank;
        to.world_size = kWorld;
        to.dir = dir;
        to.backend = (*comm)->backend_name();
        auto w = StartTimeline(CreatePrefixStore("timeline_e2e", env.options.store).get(), to,
                               absl::Seconds(20));
        ASSERT_TRUE(w.ok()) << w.status();
        std::vector<float> data(1024);
        for (int s = 1; s <= kOps; ++s) {
          for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(env.rank + s);
          if (env.rank == kSlow) absl::SleepFor(absl::Milliseconds(30));
          OpDesc op = Allreduce(static_cast<uint64_t>(s), data.data(), data.size());
          (*w)->OnEnqueue(op, absl::Now());
          (*w)->OnStart(op, absl::Now());
          absl::Status st = (*comm)->Allreduce(HostView(data.data(), data.size())).Wait();
          (*w)->OnEnd(op, st, absl::Now());
          ASSERT_TRUE(st.ok()) << st;
          const float want = static_cast<float>(0 + 1 + 2 + 3 + kWorld * s);
          for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], want) << i;
        }
        ASSERT_TRUE((*w)->Close().ok());
      },
      absl::Seconds(90));
  if (HasFatalFailure()) return;

  auto files = diag::ListRankTraces(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), static_cast<size_t>(kWorld));
  for (const std::string& f : *files) {
    const nlohmann::json t = ParseFile(f);
    ASSERT_FALSE(t.is_discarded()) << f;
    // Threads share one clock: the estimated offset is small.
    EXPECT_LT(std::abs(t["otherData"]["clock_offset_us"].get<double>()), 5000) << f;
  }
  auto merged = diag::MergeTraces(*files);
  ASSERT_TRUE(merged.ok()) << merged.status();
  auto table = diag::ComputeLateness(*merged);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->seqs.size(), static_cast<size_t>(kOps));
  ASSERT_EQ(table->ranking.size(), static_cast<size_t>(kWorld));
  EXPECT_EQ(table->ranking[0].rank, kSlow);
  EXPECT_GT(table->ranking[0].mean_us, 20000);
  EXPECT_GT(table->ranking[0].mean_us, 2 * table->ranking[1].mean_us);
  for (const auto& r : table->ranking) EXPECT_EQ(r.missing, 0) << "rank " << r.rank;

  const std::string svg = diag::RenderHeatmapSvg(*table);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("rank 2"), std::string::npos);
  for (const std::string& path :
       {dir + "/heatmap.svg", std::string("/tmp/adaptcomm_heatmap_example.svg")}) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << svg;
    EXPECT_TRUE(out.good()) << path;
  }
  std::ofstream(dir + "/heatmap.html") << diag::RenderHeatmapHtml(*table, svg);
  std::printf("heatmap: %s/heatmap.svg; ranking:", dir.c_str());
  for (const auto& r : table->ranking) std::printf(" rank %d %.1f ms;", r.rank, r.mean_us / 1e3);
  std::printf("\n");
}

// The communicator opens the timeline itself when ADAPTCOMM_TRACE=1: no hand-fed hooks here.
// Skipped (saying so) while lib/core does not wire the writer in.
TEST(TimelineEndToEndTest, CommunicatorTracesWhenEnabledByEnv) {
  constexpr int kWorld = 4;
  constexpr int kSlow = 2;
  constexpr int kOps = 10;
  const std::string dir = MakeTempDir("comm");
  ASSERT_FALSE(dir.empty());
  setenv("ADAPTCOMM_TRACE", "1", 1);
  setenv("ADAPTCOMM_TRACE_DIR", dir.c_str(), 1);
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions opts = env.options;
        opts.backend = BackendChoice::kGloo;
        opts.timeout = absl::Seconds(30);
        auto comm = Communicator::Create(opts);
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<float> data(256);
        for (int s = 1; s <= kOps; ++s) {
          for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(env.rank);
          if (env.rank == kSlow) absl::SleepFor(absl::Milliseconds(30));
          ASSERT_TRUE((*comm)->Allreduce(HostView(data.data(), data.size())).Wait().ok());
          ASSERT_EQ(data[0], 6.0f);
        }
      },
      absl::Seconds(90));
  unsetenv("ADAPTCOMM_TRACE");
  unsetenv("ADAPTCOMM_TRACE_DIR");
  if (HasFatalFailure()) return;
  auto files = diag::ListRankTraces(dir);
  if (absl::IsNotFound(files.status())) {
    GTEST_SKIP() << "the communicator does not open the timeline yet (lib/core wiring pending)";
  }
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), static_cast<size_t>(kWorld));
  for (const std::string& f : *files) {
    const nlohmann::json t = ParseFile(f);
    ASSERT_FALSE(t.is_discarded()) << f << " was not closed into valid JSON";
    EXPECT_EQ(t["otherData"]["complete"], true) << f;
    EXPECT_EQ(t["otherData"]["backend"], "gloo") << f;
    EXPECT_GE(OpEvents(t).size(), static_cast<size_t>(kOps)) << f;
  }
  auto merged = diag::MergeTraces(*files);
  ASSERT_TRUE(merged.ok()) << merged.status();
  auto table = diag::ComputeLateness(*merged);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->ranking.size(), static_cast<size_t>(kWorld));
  EXPECT_EQ(table->ranking[0].rank, kSlow);
  EXPECT_GT(table->ranking[0].mean_us, 2 * table->ranking[1].mean_us);
}

}  // namespace
}  // namespace adaptcomm::trace

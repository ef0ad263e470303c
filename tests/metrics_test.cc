// Metrics: what CommMetrics records per op (times, counts, bytes, histogram), the exposition
// text, the HTTP endpoint (Prometheus and OpenMetrics, a flood paced at the accept, a taken port
// that leaves the job running), the textfile, and the profile's refusals.
#include "lib/trace/metrics.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "adaptcomm/adaptcomm.h"
#include "adaptcomm/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/trace/metrics_export.h"
#include "tests/harness.h"
#include "tests/metric_sample.h"
#include "tests/scoped_env.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::ScopedEnv;

constexpr auto Sample = testing::MetricSample;

OpDesc Allreduce4KiB(uint64_t seq) {
  static float data[1024];
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.input = op.output = HostView(data, 1024);
  op.seq = seq;
  return op;
}

TEST(CommMetricsTest, RecordsEntryStartAndEndOfEachOp) {
  auto m = std::make_shared<trace::CommMetrics>(
      trace::CommMetricsOptions{"times", /*rank=*/1, /*nranks=*/4, "shm"});
  trace::RegisterMetrics(m);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // Queued 100 us, ran 600 us (the 1000 us bucket, not the 500 us one).
  m->OnEnqueue(Allreduce4KiB(1), t0);
  m->OnStart(Allreduce4KiB(1), t0 + absl::Microseconds(100));
  m->OnEnd(Allreduce4KiB(1), absl::OkStatus(), t0 + absl::Microseconds(700));
  // Launched by its issuer (queued and started at once), then a timeout.
  m->OnEnqueueAndStart(Allreduce4KiB(2), t0 + absl::Milliseconds(1));
  m->OnEnd(Allreduce4KiB(2), absl::DeadlineExceededError("late"), t0 + absl::Milliseconds(3));

  const std::string text = trace::RenderMetrics(false);
  const std::vector<std::string> series = {
      "comm_name=\"times\"",     "rank=\"1\"",     "nranks=\"4\"", "collective=\"allreduce\"",
      "message_size=\"<=4KiB\"", "backend=\"shm\""};
  EXPECT_EQ(Sample(text, "adaptcomm_ops_total", series), 1);
  EXPECT_EQ(Sample(text, "adaptcomm_op_errors_total", series), 1);
  EXPECT_EQ(Sample(text, "adaptcomm_timeouts_total", series), 1);
  EXPECT_EQ(Sample(text, "adaptcomm_bytes_total", series), 4096);
  EXPECT_EQ(Sample(text, "adaptcomm_bus_bytes_total", series), 4096 * 2 * 3 / 4);
  EXPECT_EQ(Sample(text, "adaptcomm_collective_queue_time_microseconds_total", series), 100);
  EXPECT_EQ(Sample(text, "adaptcomm_collective_exec_time_microseconds_sum", series), 600);
  auto bucket = [&](const std::string& le) {
    std::vector<std::string> l = series;
    l.push_back(absl::StrCat("le=\"", le, "\""));
    return Sample(text, "adaptcomm_collective_exec_time_microseconds_bucket", l);
  };
  EXPECT_EQ(bucket("500"), 0);
  EXPECT_EQ(bucket("1000"), 1);
  EXPECT_EQ(bucket("+Inf"), 1);
  // 6144 bus bytes in 600 us.
  EXPECT_NEAR(Sample(text, "adaptcomm_bus_bandwidth_gbs", series), 6144 / 600e3, 1e-9);
  EXPECT_EQ(Sample(text, "adaptcomm_slowness_score", {"comm_name=\"times\""}), 0);
  m->SetSlownessScore(2.5);
  m->AddRetry(absl::StatusCode::kDeadlineExceeded);
  const std::string after = trace::RenderMetrics(false);
  EXPECT_EQ(Sample(after, "adaptcomm_slowness_score", {"comm_name=\"times\""}), 2.5);
  EXPECT_EQ(Sample(after, "adaptcomm_retries_total",
                   {"comm_name=\"times\"", "cause=\"deadline_exceeded\""}),
            1);
  EXPECT_EQ(
      Sample(after, "adaptcomm_retries_total", {"comm_name=\"times\"", "cause=\"unavailable\""}),
      0);
  // Prometheus text names counter families with _total; OpenMetrics without, and ends in # EOF.
  EXPECT_THAT(text, HasSubstr("# TYPE adaptcomm_ops_total counter\n"));
  const std::string om = trace::RenderMetrics(true);
  EXPECT_THAT(om, HasSubstr("# TYPE adaptcomm_ops counter\n"));
  EXPECT_TRUE(absl::EndsWith(om, "# EOF\n"));
}

// A device op timed on the device (OnDeviceTime, before OnEnd): that time is its execution in the
// histogram and its data phase in the fail-slow samples; the rest of its host time counts as
// queued. An op not timed keeps its host times, and a later op reusing the slot starts untimed.
TEST(CommMetricsTest, DeviceTimeIsTheExecutionTimeAndTheDataPhase) {
  trace::CommMetricsOptions o{"device_times", /*rank=*/0, /*nranks=*/2, "nccl"};
  o.slow_samples = true;
  auto m = std::make_shared<trace::CommMetrics>(o);
  trace::RegisterMetrics(m);
  const absl::Time t0 = absl::FromUnixSeconds(2000);
  // Launched at t0, found done 900 us later, of which the device ran it 300 us.
  m->OnEnqueueAndStart(Allreduce4KiB(1), t0);
  m->OnDeviceTime(Allreduce4KiB(1), absl::Microseconds(300));
  m->OnEnd(Allreduce4KiB(1), absl::OkStatus(), t0 + absl::Microseconds(900));
  // Not timed: 1000 us from its start.
  m->OnEnqueueAndStart(Allreduce4KiB(2), t0 + absl::Milliseconds(2));
  m->OnEnd(Allreduce4KiB(2), absl::OkStatus(), t0 + absl::Milliseconds(3));
  // Same slot as op 1 (seq + 2048): a stale device time of op 1 must not count for it.
  m->OnEnqueueAndStart(Allreduce4KiB(2049), t0 + absl::Milliseconds(4));
  m->OnEnd(Allreduce4KiB(2049), absl::OkStatus(), t0 + absl::Milliseconds(6));

  const std::string text = trace::RenderMetrics(false);
  const std::vector<std::string> series = {"comm_name=\"device_times\"",
                                           "collective=\"allreduce\""};
  EXPECT_EQ(Sample(text, "adaptcomm_ops_total", series), 3);
  EXPECT_EQ(Sample(text, "adaptcomm_collective_exec_time_microseconds_sum", series),
            300 + 1000 + 2000);
  EXPECT_EQ(Sample(text, "adaptcomm_collective_queue_time_microseconds_total", series), 600);
  const std::vector<trace::SlowSample> samples = m->slow_sampler()->Collect(0, 0);
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].seq, 1u);
  EXPECT_EQ(samples[0].data_ns, 300000);
  EXPECT_EQ(samples[0].wait_ns, 900000);
  EXPECT_EQ(samples[1].data_ns, 1000000);
  EXPECT_EQ(samples[2].data_ns, 2000000);
}

TEST(CommMetricsTest, SizeBandsAndBusFactors) {
  EXPECT_EQ(trace::SizeBandOf(4096), 0);
  EXPECT_EQ(trace::SizeBandOf(4097), 1);
  EXPECT_EQ(trace::SizeBandOf(1 << 20), 2);
  EXPECT_EQ(trace::SizeBandOf(uint64_t{1} << 40), trace::kMetricSizeBands - 1);
  EXPECT_DOUBLE_EQ(trace::BusFactor(OpKind::kAllreduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(trace::BusFactor(OpKind::kAllgather, 4), 0.75);
  EXPECT_DOUBLE_EQ(trace::BusFactor(OpKind::kBroadcast, 4), 1);
}

TEST(MetricsExportTest, CommunicatorCountsItsOpsAndServesThemOverHttp) {
  const int port = testing::PickFreePort();
  ScopedEnv env("ADAPTCOMM_METRICS_PORT", absl::StrCat(port));
  testing::RunRanks(testing::RankMode::kThreads, 1, [port](const testing::RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.name = "served";
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> small(1024, 1.0f), large(64 * 1024, 1.0f);
    for (int i = 0; i < 10; ++i)
      ASSERT_TRUE((*comm)->Allreduce(HostView(small.data(), small.size())).Wait().ok());
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(
          (*comm)->Broadcast(HostView(large.data(), large.size()), BroadcastOptions{}).Wait().ok());
    EXPECT_EQ(trace::MetricsPort(), port);
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(5);
    client.set_read_timeout(5);
    auto res = client.Get("/metrics");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    ASSERT_EQ(res->status, 200);
    EXPECT_THAT(res->get_header_value("Content-Type"), HasSubstr("version=0.0.4"));
    const std::string backend = (*comm)->backend_name();
    EXPECT_EQ(Sample(res->body, "adaptcomm_ops_total",
                     {"comm_name=\"served\"", "collective=\"allreduce\"", "message_size=\"<=4KiB\"",
                      "backend=\"" + backend + "\""}),
              10);
    EXPECT_EQ(
        Sample(res->body, "adaptcomm_bytes_total",
               {"comm_name=\"served\"", "collective=\"broadcast\"", "message_size=\"<=1MiB\""}),
        3 * 256 * 1024);
    EXPECT_EQ(Sample(res->body, "adaptcomm_collective_exec_time_microseconds_count",
                     {"comm_name=\"served\"", "collective=\"allreduce\""}),
              10);
    EXPECT_GE(Sample(res->body, "adaptcomm_unprotected_ops_total", {"comm_name=\"served\""}), 0);
    auto om = client.Get("/metrics", {{"Accept", "application/openmetrics-text; version=1.0.0"}});
    ASSERT_TRUE(om);
    EXPECT_THAT(om->get_header_value("Content-Type"), HasSubstr("openmetrics-text"));
    EXPECT_TRUE(absl::EndsWith(om->body, "# EOF\n"));
    // Past metrics.max_scrapes_per_second (10): paced, not refused, and the job is unharmed.
    const absl::Time flood_start = absl::Now();
    for (int i = 0; i < 20; ++i) {
      auto r = client.Get("/metrics");
      ASSERT_TRUE(r) << "request " << i << ": " << httplib::to_string(r.error());
      ASSERT_EQ(r->status, 200) << "request " << i;
    }
    // 20 connections at 10 a second: at least 19 intervals of 100 ms (less a clock's slack).
    EXPECT_GE(absl::Now() - flood_start, absl::Milliseconds(1800));
    EXPECT_TRUE((*comm)->Allreduce(HostView(small.data(), small.size())).Wait().ok());
    // The straggler detector's hook shows in the gauge.
    ASSERT_TRUE(internal::SetSlownessScore(**comm, 1.5));
    auto after = client.Get("/metrics");
    ASSERT_TRUE(after);
    EXPECT_EQ(Sample(after->body, "adaptcomm_slowness_score", {"comm_name=\"served\""}), 1.5);
  });
  EXPECT_EQ(trace::MetricsPort(), 0);  // stopped with the last communicator
}

// A rank that stalls past the op timeout inside a step: every rank's coordinated retry is counted,
// the stalled-on rank's with its cause, a timeout.
TEST(MetricsExportTest, RetriesAreCountedByCause) {
  testing::RunRanks(testing::RankMode::kThreads, 2, [](const testing::RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.name = "retried";
    o.timeout = absl::Seconds(1);
    o.failure_report_window = absl::Seconds(2);
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> buf(1024, 1.0f);
    for (int attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 3);
      ASSERT_TRUE((*comm)->BeginStep().ok());
      if (env.rank == 1 && attempt == 0) absl::SleepFor(absl::Milliseconds(2500));
      (void)(*comm)->Allreduce(HostView(buf.data(), buf.size())).Wait();
      const absl::Status commit = (*comm)->CommitStep();
      if (IsStepRedo(commit)) continue;
      ASSERT_TRUE(commit.ok()) << commit;
      break;
    }
    // Both ranks are past the recovery: the counts are final.
    ASSERT_TRUE((*comm)->Barrier().Wait().ok());
    const std::string text = trace::RenderMetrics(false);
    const std::string rank = absl::StrCat("rank=\"", env.rank, "\"");
    double retries = 0;
    for (const char* cause : {"deadline_exceeded", "unavailable", "aborted"}) {
      retries += std::max(
          0.0, Sample(text, "adaptcomm_retries_total",
                      {"comm_name=\"retried\"", rank, absl::StrCat("cause=\"", cause, "\"")}));
    }
    EXPECT_GE(retries, 1) << text;
    if (env.rank == 0) {
      EXPECT_GE(Sample(text, "adaptcomm_retries_total",
                       {"comm_name=\"retried\"", rank, "cause=\"deadline_exceeded\""}),
                1)
          << text;
    }
    ASSERT_TRUE((*comm)->Barrier().Wait().ok());  // neither rank leaves while the other reads
  });
}

TEST(MetricsExportTest, TakenPortLeavesTheJobRunningWithoutMetrics) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ScopedEnv env("ADAPTCOMM_METRICS_PORT", absl::StrCat(ntohs(addr.sin_port)));
  testing::RunRanks(testing::RankMode::kThreads, 1, [](const testing::RankEnv& env) {
    auto comm = Communicator::Create(env.options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    float x = 1;
    EXPECT_TRUE((*comm)->Allreduce(HostView(&x, 1)).Wait().ok());
    EXPECT_EQ(trace::MetricsPort(), 0);
  });
  close(fd);
}

TEST(MetricsExportTest, TextfileHoldsTheRanksMetrics) {
  char dir[] = "/tmp/metrics_textfile.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ScopedEnv env("ADAPTCOMM_METRICS_TEXTFILE", absl::StrCat(dir, "/adaptcomm.{rank}.prom"));
  testing::RunRanks(testing::RankMode::kThreads, 1, [](const testing::RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.name = "textfile";
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    float x = 1;
    for (int i = 0; i < 4; ++i) ASSERT_TRUE((*comm)->Allreduce(HostView(&x, 1)).Wait().ok());
  });
  // Written again when the last communicator goes.
  std::ifstream in(absl::StrCat(dir, "/adaptcomm.0.prom"));
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(Sample(text.str(), "adaptcomm_ops_total",
                   {"comm_name=\"textfile\"", "collective=\"allreduce\""}),
            4);
  EXPECT_EQ(trace::MetricsTextfilePath("/x/m.prom", 3, 4), "/x/m.rank3.prom");
  EXPECT_EQ(trace::MetricsTextfilePath("/x/m.prom", 0, 1), "/x/m.prom");
}

std::string WriteProfile(const std::string& body) {
  char path[] = "/tmp/metrics_profile.XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << "schema: 1\ndefaults:\n" << body << "tiers:\n  - name: only\n";
  return path;
}

TEST(MetricsProfileTest, OutOfRangeRefusedAtLoadWithFileAndLine) {
  ProfileRequest req;
  req.file = WriteProfile("  metrics:\n    enabled: true\n    port: 70000\n");
  absl::StatusOr<EffectiveConfig> cfg = ResolveProfile(req);
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr(*req.file + ":5"));
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("metrics.port"));

  req.file = WriteProfile("  metrics:\n    textfile_interval: 100ms\n");
  cfg = ResolveProfile(req);
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr(*req.file + ":4"));

  req.file = WriteProfile("  metrics:\n    max_scrapes_per_second: 0\n");
  EXPECT_FALSE(ResolveProfile(req).ok());

  req.file = WriteProfile("  metrics:\n    device_timing_every: -1\n");
  cfg = ResolveProfile(req);
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr(*req.file + ":4"));
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("metrics.device_timing_every"));
  req.file = WriteProfile("  metrics:\n    device_timing_every: 4\n");
  cfg = ResolveProfile(req);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->metrics.device_timing_every, 4);

  req.file = WriteProfile("  metrics:\n    port: 9400\n");
  cfg = ResolveProfile(req);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->metrics.port, 9400);
  {
    ScopedEnv env("ADAPTCOMM_METRICS_PORT", "9500");
    cfg = ResolveProfile(req);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    EXPECT_EQ(cfg->metrics.port, 9500);
    EXPECT_EQ(cfg->metrics.port_source, "env ADAPTCOMM_METRICS_PORT");
  }
  {
    ScopedEnv env("ADAPTCOMM_METRICS_PORT", "65536");
    EXPECT_FALSE(ResolveProfile(req).ok());
  }
}

}  // namespace
}  // namespace adaptcomm

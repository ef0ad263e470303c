// The culprit verdict from real flight-recorder dumps of a few ranks: who is behind, who never
// started the op the others run, who left no dump, and mismatched collectives.
#include <stdlib.h>

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/trace/culprit.h"
#include "lib/trace/flight_recorder.h"

namespace adaptcomm::trace {
namespace {

using ::testing::HasSubstr;

std::string FreshDir() {
  char dir[] = "/tmp/adaptcomm_culprit_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return dir;
}

OpDesc Op(OpKind kind, uint64_t seq) {
  OpDesc op;
  op.kind = kind;
  op.seq = seq;
  return op;
}

// Rank `rank` completed ops 1..done (allreduce), then queued op done+1 and, if `started`, runs it.
void DumpRank(const std::string& dir, int rank, int world, uint64_t done, bool started,
              OpKind next = OpKind::kAllreduce) {
  FlightRecorderOptions o;
  o.rank = rank;
  o.world_size = world;
  o.communicator = "test";
  o.job = "job-1";
  o.dump_dir = dir;
  FlightRecorder fr(o);
  absl::Time t = absl::FromUnixSeconds(1000);
  for (uint64_t seq = 1; seq <= done; ++seq) {
    const OpDesc op = Op(OpKind::kAllreduce, seq);
    fr.OnEnqueue(op, t);
    fr.OnStart(op, t);
    fr.OnEnd(op, absl::OkStatus(), t + absl::Milliseconds(1));
    t += absl::Milliseconds(2);
  }
  const OpDesc op = Op(next, done + 1);
  fr.OnEnqueue(op, t);
  if (started) fr.OnStart(op, t);
  ASSERT_TRUE(fr.Dump("test").ok());
}

TEST(CulpritVerdict, RankThatQueuedButNeverStartedIsNamed) {
  const std::string dir = FreshDir();
  for (int r = 0; r < 4; ++r) DumpRank(dir, r, 4, 300, /*started=*/r != 1);
  absl::StatusOr<CulpritReport> report = AnalyzeFlightDumps(dir);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->verdict,
            "rank 1 queued allreduce #301 but never started it (stalled before it); ranks 0,2,3 "
            "were already running it");
}

TEST(CulpritVerdict, RankThatNeverEnteredIsNamed) {
  const std::string dir = FreshDir();
  for (int r = 0; r < 3; ++r) DumpRank(dir, r, 3, r == 2 ? 41 : 42, true);
  absl::StatusOr<CulpritReport> report = AnalyzeFlightDumps(dir);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->verdict, HasSubstr("rank 2 never entered allreduce #43"));
  EXPECT_THAT(report->verdict, HasSubstr("all others are waiting in it"));
}

TEST(CulpritVerdict, AllRunningIsATransportProblemAndMissingDumpsAreNamed) {
  const std::string dir = FreshDir();
  for (int r = 0; r < 2; ++r) DumpRank(dir, r, 2, 10, true);
  absl::StatusOr<CulpritReport> report = AnalyzeFlightDumps(dir);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->verdict, HasSubstr("none is behind"));

  const std::string partial = FreshDir();
  for (int r : {0, 1, 3}) DumpRank(partial, r, 4, 40, true);
  report = AnalyzeFlightDumps(partial);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->verdict,
            "rank 2 left no dump (killed, or hung beyond reach); the others stopped in allreduce "
            "#41");
}

TEST(CulpritVerdict, MismatchedCollectivesAreNamed) {
  const std::string dir = FreshDir();
  for (int r = 0; r < 3; ++r) {
    DumpRank(dir, r, 3, 1, true, r == 1 ? OpKind::kAllgather : OpKind::kAllreduce);
  }
  absl::StatusOr<CulpritReport> report = AnalyzeFlightDumps(dir);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->verdict,
            "mismatched collectives at #2: rank 1 in allgather; ranks 0,2 in allreduce");
}

}  // namespace
}  // namespace adaptcomm::trace

#include "lib/trace/flight_recorder.h"

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::trace {
namespace {

OpDesc Allreduce(uint64_t seq) {
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.seq = seq;
  op.input = op.output = TensorView{nullptr, 8, DType::kF32, Device::Cpu(), nullptr};
  return op;
}

// A recorder of `capacity` entries whose communicator starts on NCCL.
FlightRecorderOptions StartingOnNccl(size_t capacity) {
  FlightRecorderOptions options;
  options.backend = "nccl";
  options.capacity = capacity;
  return options;
}

// Where the rank is (its state record for `adaptcomm status`): the oldest op entered and not
// ended, with its kind, bytes and times, and the last ops entered, started and completed.
TEST(FlightRecorder, ProgressNamesTheOldestOpNotEnded) {
  FlightRecorder recorder(StartingOnNccl(16));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(recorder.progress().current, 0u);
  recorder.OnEnqueueAndStart(Allreduce(1), t0);
  recorder.OnEnd(Allreduce(1), absl::OkStatus(), t0 + absl::Milliseconds(1));
  recorder.OnEnqueue(Allreduce(2), t0 + absl::Milliseconds(2));
  recorder.OnStart(Allreduce(2), t0 + absl::Milliseconds(3));
  recorder.OnEnqueue(Allreduce(3), t0 + absl::Milliseconds(4));
  FlightRecorder::Progress p = recorder.progress();
  EXPECT_EQ(p.current, 2u);
  EXPECT_EQ(p.kind, OpKind::kAllreduce);
  EXPECT_EQ(p.bytes, 32u);
  EXPECT_EQ(p.entered, t0 + absl::Milliseconds(2));
  EXPECT_EQ(p.started, t0 + absl::Milliseconds(3));
  EXPECT_EQ(p.last_enqueued, 3u);
  EXPECT_EQ(p.last_started, 2u);
  EXPECT_EQ(p.last_completed, 1u);
  recorder.OnEnd(Allreduce(2), absl::OkStatus(), t0 + absl::Milliseconds(5));
  p = recorder.progress();
  EXPECT_EQ(p.current, 3u);
  EXPECT_EQ(p.started, absl::UnixEpoch());  // still queued
  recorder.OnStart(Allreduce(3), t0 + absl::Milliseconds(6));
  recorder.OnEnd(Allreduce(3), absl::DeadlineExceededError("late"), t0 + absl::Milliseconds(7));
  p = recorder.progress();
  EXPECT_EQ(p.current, 0u);  // failed ops end too
  EXPECT_EQ(p.last_completed, 2u);
}

// Each entry names the backend its op ran on, also after a rebuild changed the backend's kind
// (a degrade from NCCL to Gloo) and after one that kept it; the document names the current one.
TEST(FlightRecorder, EntriesNameTheBackendOfTheirGeneration) {
  FlightRecorder recorder(StartingOnNccl(4));
  const absl::Time now = absl::Now();
  recorder.OnEnqueueAndStart(Allreduce(1), now);
  recorder.OnEnd(Allreduce(1), absl::UnavailableError("link down"), now);
  recorder.SetGeneration(1, "gloo");
  recorder.OnEnqueue(Allreduce(2), now);
  recorder.SetGeneration(2, "gloo");
  recorder.OnStart(Allreduce(2), now);  // started on generation 2
  recorder.OnEnqueueAndStart(Allreduce(3), now);
  const nlohmann::json doc = nlohmann::json::parse(recorder.DumpJson("test"));
  EXPECT_EQ(doc["backend"], "gloo");
  EXPECT_EQ(doc["generation"], 2);
  ASSERT_EQ(doc["entries"].size(), 3u);
  EXPECT_EQ(doc["entries"][0]["backend"], "nccl");
  EXPECT_EQ(doc["entries"][0]["generation"], 0);
  EXPECT_EQ(doc["entries"][0]["state"], "failed");
  EXPECT_EQ(doc["entries"][1]["backend"], "gloo");
  EXPECT_EQ(doc["entries"][1]["generation"], 2);
  EXPECT_EQ(doc["entries"][2]["backend"], "gloo");
  EXPECT_EQ(doc["entries"][2]["state"], "running");
}

// A job that goes back and forth between kinds (a degrade, then a rebuild on the first kind
// again, many times) names each op's backend right, and the document the current one.
TEST(FlightRecorder, BackendNamesStayRightAcrossManyChangesOfKind) {
  FlightRecorder recorder(StartingOnNccl(8));
  const absl::Time now = absl::Now();
  for (uint64_t seq = 1; seq <= 100; ++seq) {
    recorder.SetGeneration(static_cast<int>(seq), seq % 2 == 0 ? "gloo" : "nccl");
    recorder.OnEnqueueAndStart(Allreduce(seq), now);
  }
  const nlohmann::json doc = nlohmann::json::parse(recorder.DumpJson("test"));
  EXPECT_EQ(doc["backend"], "gloo");
  ASSERT_EQ(doc["entries"].size(), 8u);
  for (const nlohmann::json& e : doc["entries"]) {
    EXPECT_EQ(e["backend"], e["seq"].get<uint64_t>() % 2 == 0 ? "gloo" : "nccl") << e.dump();
  }
}

// Several threads dump one recorder at once (on a failure the failure coordinator, the heartbeat
// watch and the caller all do) while ops are recorded: every dump file a thread finds after its
// Dump returned is a whole document (two writers of one temporary file interleaved them).
TEST(FlightRecorder, ConcurrentDumpsEachLeaveAWholeDocument) {
  FlightRecorderOptions options = StartingOnNccl(2048);
  options.dump_dir = ::testing::TempDir() + "/flight_concurrent_dumps";
  FlightRecorder recorder(options);
  const absl::Time now = absl::Now();
  for (uint64_t seq = 1; seq <= 2048; ++seq) recorder.OnEnqueueAndStart(Allreduce(seq), now);
  constexpr int kDumpers = 3;
  constexpr int kDumpsEach = 15;
  std::vector<std::string> broken[kDumpers];
  std::vector<std::thread> dumpers;
  for (int d = 0; d < kDumpers; ++d) {
    dumpers.emplace_back([&, d] {
      for (int i = 0; i < kDumpsEach; ++i) {
        absl::StatusOr<std::string> path = recorder.Dump(absl::StrCat("dumper ", d, " #", i));
        if (!path.ok()) {
          broken[d].push_back(path.status().ToString());
          continue;
        }
        std::ifstream in(*path);
        const nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
        if (doc.is_discarded() || !doc.contains("entries") || doc["entries"].size() != 2048) {
          broken[d].push_back(absl::StrCat("dump ", i, " of dumper ", d, " is not whole"));
        }
      }
    });
  }
  std::thread recording([&] {
    for (uint64_t seq = 2049; seq <= 6000; ++seq) {
      recorder.OnEnqueueAndStart(Allreduce(seq), absl::Now());
      recorder.OnEnd(Allreduce(seq), absl::OkStatus(), absl::Now());
    }
  });
  for (std::thread& t : dumpers) t.join();
  recording.join();
  for (int d = 0; d < kDumpers; ++d) EXPECT_TRUE(broken[d].empty()) << broken[d].front();
}

}  // namespace
}  // namespace adaptcomm::trace

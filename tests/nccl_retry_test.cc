// Coordinated retry and degrade on the NCCL path, end to end through Communicator::Create's
// internal factory (internal::CreateCommunicatorWith) with each rank's fault-injecting fake CUDA
// runtime and NCCL injected (ranks are threads; "device" buffers are host memory the fake reports
// as CUDA memory). A rank's NCCL communicator fails asynchronously mid-stream; every rank agrees on
// the retry, rebuilds (on Gloo with staging after K failures, or on NCCL again when the policy
// forbids degrading), restores the failed op's device input from the replay log, and the stream of
// allreduces ends with every result exact.
#include <stdlib.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adaptcomm/communicator.h"
#include "gtest/gtest.h"
#include "lib/core/communicator_factory.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;

constexpr int kWorld = 2;
constexpr int kOps = 10;
constexpr int kFailingRank = 1;
// The failing rank's communicator breaks at its 6th launch. A rebuilt NCCL communicator counts
// launches afresh and runs only the 5 remaining ops: the fault does not recur.
constexpr int kFaultAtLaunch = 6;

std::string WriteProfile(const std::string& fallback) {
  char dir[] = "/tmp/adaptcomm_nccl_retry_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  const std::string path = absl::StrCat(dir, "/profile.yaml");
  std::ofstream(path) << "schema: 1\n"
                      << "defaults:\n"
                      << "  retry:\n"
                      << "    max_attempts: 3\n"
                      << "    initial_backoff: 100ms\n"
                      << "    max_backoff: 1s\n"
                      << "  backend:\n"
                      << "    fallback: " << fallback << "\n"
                      << "    degrade_after_failures: 1\n"
                      << "    degrade_window: 10min\n"
                      << "  flight_recorder:\n"
                      << "    dump_dir: " << dir << "\n"
                      << "tiers:\n"
                      << "  - name: test\n"
                      << "    params: any\n";
  return path;
}

float Input(int rank, int op, size_t i) {
  return static_cast<float>((rank + 1) * 1000 + op * 10 + static_cast<int>(i % 7));
}

// This rank's fake as its CUDA runtime and its NCCL, for creation and every rebuild.
internal::CommunicatorDeps Seams(const std::shared_ptr<FakeNcclApi>& fake) {
  internal::CommunicatorDeps deps;
  deps.use_given_apis = true;
  deps.cuda = fake;
  deps.nccl = fake;
  return deps;
}

struct StreamRun {
  std::vector<std::shared_ptr<FakeNcclApi>> apis;
  std::vector<std::string> final_backend = std::vector<std::string>(kWorld);
};

// Every rank runs kOps device allreduces and checks each result element by element.
StreamRun RunStream(const std::string& fallback) {
  StreamRun run;
  auto world = testing::MakeFakeNcclWorld();
  for (int r = 0; r < kWorld; ++r) {
    FakeNcclFaults f;
    if (r == kFailingRank) f.async_error_at_launch = kFaultAtLaunch;
    run.apis.push_back(std::make_shared<FakeNcclApi>(world, f));
  }
  const std::string profile = WriteProfile(fallback);
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.profile_file = profile;
        o.backend = BackendChoice::kAuto;
        o.timeout = absl::Seconds(10);
        o.failure_report_window = absl::Seconds(5);
        auto comm = internal::CreateCommunicatorWith(o, Seams(run.apis[env.rank]));
        ASSERT_TRUE(comm.ok()) << comm.status();
        ASSERT_STREQ((*comm)->backend_name(), "nccl");
        for (int op = 0; op < kOps; ++op) {
          std::vector<float> buf(1000 + 37 * static_cast<size_t>(op));
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = Input(env.rank, op, i);
          absl::Status s =
              (*comm)
                  ->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)})
                  .Synchronize();
          ASSERT_TRUE(s.ok()) << "rank " << env.rank << " op " << op << ": " << s;
          for (size_t i = 0; i < buf.size(); ++i) {
            float want = 0;
            for (int r = 0; r < kWorld; ++r) want += Input(r, op, i);
            ASSERT_EQ(buf[i], want) << "rank " << env.rank << " op " << op << " element " << i;
          }
        }
        run.final_backend[static_cast<size_t>(env.rank)] = (*comm)->backend_name();
      },
      absl::Seconds(60));
  return run;
}

TEST(NcclRetry, AgreedFailureDegradesEveryRankToStagedGlooWithExactResults) {
  StreamRun run = RunStream("allow");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(run.final_backend[static_cast<size_t>(r)], "gloo+staged") << "rank " << r;
    // The NCCL communicator of generation 0 was aborted, and none was made after it.
    EXPECT_GE(run.apis[static_cast<size_t>(r)]->abort_calls(), 1) << "rank " << r;
    EXPECT_EQ(run.apis[static_cast<size_t>(r)]->init_calls(), 1) << "rank " << r;
  }
}

TEST(NcclRetry, PolicyThatForbidsDegradingRebuildsOnNcclWithExactResults) {
  StreamRun run = RunStream("deny");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(run.final_backend[static_cast<size_t>(r)], "nccl") << "rank " << r;
    EXPECT_EQ(run.apis[static_cast<size_t>(r)]->init_calls(), 2) << "rank " << r;
  }
}

// NCCL init fails on rank 1 at the first attempt only; with fallback deny the whole creation
// fails there, and every rank retries it together. `inits`: each rank's NCCL init calls.
std::vector<absl::StatusOr<std::string>> CreateWithFlakyInit(int max_retry_attempts,
                                                             std::vector<int>* inits) {
  auto world = testing::MakeFakeNcclWorld();
  std::vector<std::shared_ptr<FakeNcclApi>> fakes;
  for (int r = 0; r < kWorld; ++r) {
    FakeNcclFaults f;
    if (r == kFailingRank) f.init_fails_first = 1;
    fakes.push_back(std::make_shared<FakeNcclApi>(world, f));
  }
  const std::string profile = WriteProfile("deny");
  std::vector<absl::StatusOr<std::string>> outcome(kWorld, absl::UnknownError("not run"));
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.profile_file = profile;
        o.backend = BackendChoice::kNccl;
        o.max_retry_attempts = max_retry_attempts;
        o.init_timeout = absl::Seconds(4);
        auto comm = internal::CreateCommunicatorWith(o, Seams(fakes[env.rank]));
        if (!comm.ok()) {
          outcome[static_cast<size_t>(env.rank)] = comm.status();
          return;
        }
        std::vector<float> buf(64, static_cast<float>(env.rank + 1));
        absl::Status s = (*comm)
                             ->Allreduce(TensorView{buf.data(), 64, DType::kF32, Device::Cuda(0)})
                             .Synchronize();
        ASSERT_TRUE(s.ok()) << s;
        for (float v : buf) ASSERT_EQ(v, 3.0f);
        outcome[static_cast<size_t>(env.rank)] = std::string((*comm)->backend_name());
      },
      absl::Seconds(60));
  inits->clear();
  for (const auto& fake : fakes) inits->push_back(fake->init_calls());
  return outcome;
}

TEST(NcclRetry, InitFailureOnOneRankIsRetriedByEveryRank) {
  std::vector<int> inits;
  std::vector<absl::StatusOr<std::string>> outcome = CreateWithFlakyInit(3, &inits);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(outcome[static_cast<size_t>(r)].ok()) << outcome[static_cast<size_t>(r)].status();
    EXPECT_EQ(*outcome[static_cast<size_t>(r)], "nccl");
    EXPECT_EQ(inits[static_cast<size_t>(r)], 2) << "rank " << r << " attempts";
  }
}

TEST(NcclRetry, InitFailureWithRetriesOffFailsEveryRankNamingTheRank) {
  std::vector<int> inits;
  std::vector<absl::StatusOr<std::string>> outcome = CreateWithFlakyInit(1, &inits);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_FALSE(outcome[static_cast<size_t>(r)].ok()) << "rank " << r;
    EXPECT_TRUE(absl::IsUnavailable(outcome[static_cast<size_t>(r)].status()));
    EXPECT_NE(outcome[static_cast<size_t>(r)].status().message().find("rank 1: "),
              absl::string_view::npos)
        << outcome[static_cast<size_t>(r)].status();
    EXPECT_EQ(inits[static_cast<size_t>(r)], 1);
  }
}

}  // namespace
}  // namespace adaptcomm

// Stream-ordered device collectives (adaptcomm/backend.h, StreamOrdered), end to end through
// Communicator::Create's internal factory (internal::CreateCommunicatorWith) with each rank's fake
// CUDA runtime and NCCL. HoldStreams(true) models a GPU that has not run
// anything yet: a collective issued and waited for must come back to the caller anyway (Wait only
// makes the caller's stream wait), in issue order on the communicator's stream, and the results
// appear once the "device" runs (Synchronize). The watchdog catches a collective the device
// never finishes; an abort fails Synchronize at once; a view whose stream is on another device
// is refused at the call.
#include <stdlib.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator_factory.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;

constexpr int kWorld = 2;

// One fake per rank, of one fake world; Create() builds a rank's communicator on its fake (which
// backend selection then finds NCCL-capable).
class FakeRanks {
 public:
  explicit FakeRanks(const std::vector<FakeNcclFaults>& faults) {
    auto world = testing::MakeFakeNcclWorld();
    for (const FakeNcclFaults& f : faults) apis_.push_back(std::make_shared<FakeNcclApi>(world, f));
  }
  FakeNcclApi& api(int rank) { return *apis_[static_cast<size_t>(rank)]; }
  absl::StatusOr<std::unique_ptr<Communicator>> Create(int rank, const CommunicatorOptions& o) {
    internal::CommunicatorDeps deps;
    deps.use_given_apis = true;
    deps.cuda = apis_[static_cast<size_t>(rank)];
    deps.nccl = apis_[static_cast<size_t>(rank)];
    return internal::CreateCommunicatorWith(o, deps);
  }

 private:
  std::vector<std::shared_ptr<FakeNcclApi>> apis_;
};

CommunicatorOptions Options(const testing::RankEnv& env, int retries, absl::Duration timeout) {
  CommunicatorOptions o = env.options;
  o.backend = BackendChoice::kAuto;
  o.max_retry_attempts = retries;
  o.timeout = timeout;
  o.failure_report_window = absl::Seconds(2);
  return o;
}

float Input(int rank, int op, size_t i) {
  return static_cast<float>((rank + 1) * 100000 + op * 8 + static_cast<int>(i));
}

// 1,000 allreduces issued back to back: every issue + Wait() returns before the device ran any of
// them, the calls reached the fake in stream order, and the results are exact once it runs.
TEST(StreamOrder, ThousandAllreducesReturnBeforeTheDeviceRunsAny) {
  constexpr int kOps = 1000;
  constexpr size_t kCount = 8;
  FakeRanks fakes{std::vector<FakeNcclFaults>(kWorld)};
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        FakeNcclApi& fake = fakes.api(env.rank);
        fake.HoldStreams(true);
        auto comm = fakes.Create(env.rank, Options(env, 1, absl::Seconds(30)));
        ASSERT_TRUE(comm.ok()) << comm.status();
        ASSERT_STREQ((*comm)->backend_name(), "nccl");
        cuda::CudaStream caller = nullptr;
        ASSERT_EQ(fake.StreamCreateNonBlocking(&caller), cuda::kCudaSuccess);
        fake.ClearCalls();

        std::vector<std::vector<float>> bufs(kOps, std::vector<float>(kCount));
        std::vector<Work> works;
        const absl::Time start = absl::Now();
        for (int op = 0; op < kOps; ++op) {
          std::vector<float>& buf = bufs[static_cast<size_t>(op)];
          for (size_t i = 0; i < kCount; ++i) buf[i] = Input(env.rank, op, i);
          works.push_back((*comm)->Allreduce(
              TensorView{buf.data(), kCount, DType::kF32, Device::Cuda(0), caller}));
          ASSERT_TRUE(works.back().Wait(absl::Seconds(5)).ok()) << "op " << op;
        }
        const absl::Duration issued = absl::Now() - start;
        EXPECT_EQ(fake.collectives_started(), 0);
        EXPECT_EQ(bufs[0][0], Input(env.rank, 0, 0));  // nothing ran
        EXPECT_FALSE(works.back().completed());
        // Issue bound: far below one host round trip per op (a blocking path needs the peers).
        EXPECT_LT(issued, absl::Seconds(10));

        // Per op, in order: the caller's position, the communicator's stream waiting for it, the
        // collective there, the event after it; Wait() then makes the caller's stream wait.
        std::vector<testing::FakeCall> calls = fake.calls();
        ASSERT_GE(calls.size(), 5u);
        EXPECT_EQ(calls[0].name, "EventRecord");
        EXPECT_EQ(calls[0].stream, caller);
        void* comm_stream = calls[1].stream;
        EXPECT_EQ(calls[1].name, "StreamWaitEvent");
        EXPECT_EQ(calls[1].event, calls[0].event);
        EXPECT_NE(comm_stream, caller);
        EXPECT_EQ(calls[2].name, "AllReduce");
        EXPECT_EQ(calls[2].stream, comm_stream);
        EXPECT_EQ(calls[3].name, "EventRecord");
        EXPECT_EQ(calls[3].stream, comm_stream);
        EXPECT_EQ(calls[4].name, "StreamWaitEvent");
        EXPECT_EQ(calls[4].stream, caller);
        EXPECT_EQ(calls[4].event, calls[3].event);
        int collectives = 0;
        for (const auto& c : calls) {
          if (c.name == "AllReduce") {
            EXPECT_EQ(c.stream, comm_stream);
            ++collectives;
          }
        }
        EXPECT_EQ(collectives, kOps);

        fake.HoldStreams(false);
        ASSERT_TRUE(works.back().Synchronize(absl::Seconds(30)).ok());
        for (int op = 0; op < kOps; ++op) {
          ASSERT_TRUE(works[static_cast<size_t>(op)].Synchronize(absl::Seconds(5)).ok());
          for (size_t i = 0; i < kCount; ++i) {
            float want = 0;
            for (int r = 0; r < kWorld; ++r) want += Input(r, op, i);
            ASSERT_EQ(bufs[static_cast<size_t>(op)][i], want)
                << "rank " << env.rank << " op " << op << " element " << i;
          }
        }
        EXPECT_EQ(fake.collectives_started(), kOps);
      },
      absl::Seconds(120));
}

// The device never finishes one of rank 0's collectives (its 4th launch, counting the one of
// creation): Wait() still returns for every op (they are queued), and the watchdog fails that op
// past its timeout (and the ops behind it), naming it; Synchronize returns that within its own
// bound.
TEST(StreamOrder, CollectiveTheDeviceNeverFinishesIsCaughtByTheWatchdog) {
  std::vector<FakeNcclFaults> faults(kWorld);
  faults[0].hang_at_launch = 4;
  FakeRanks fakes(faults);
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        auto comm = fakes.Create(env.rank, Options(env, 1, absl::Seconds(1)));
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<std::vector<float>> bufs(5, std::vector<float>(16, 1.0f));
        std::vector<Work> works;
        for (auto& buf : bufs) {
          works.push_back(
              (*comm)->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)}));
          ASSERT_TRUE(works.back().Wait(absl::Seconds(5)).ok());
        }
        ASSERT_TRUE(works[0].Synchronize(absl::Seconds(5)).ok());
        size_t hung = 1;
        absl::Status first;
        const absl::Time start = absl::Now();
        for (; hung < works.size(); ++hung) {
          first = works[hung].Synchronize(absl::Seconds(20));
          if (!first.ok()) break;
        }
        EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << first;
        ASSERT_LT(hung, works.size()) << "every op completed";
        EXPECT_GE(hung, 1u);
        if (env.rank == 0) {
          EXPECT_TRUE(absl::IsDeadlineExceeded(first)) << first;
          EXPECT_THAT(first.message(), HasSubstr(absl::StrCat("allreduce #", hung + 1)));
          EXPECT_THAT(first.message(), HasSubstr("did not complete on the device within"));
        }
        for (size_t k = hung + 1; k < works.size(); ++k) {
          EXPECT_FALSE(works[k].Synchronize(absl::Seconds(10)).ok()) << "op " << k + 1;
        }
      },
      absl::Seconds(60));
}

// After Abort(), Synchronize on ops still on the device returns the abort's status at once.
TEST(StreamOrder, SynchronizeAfterAbortReturnsTheAbortAtOnce) {
  FakeRanks fakes{std::vector<FakeNcclFaults>(kWorld)};
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        fakes.api(env.rank).HoldStreams(true);
        auto comm = fakes.Create(env.rank, Options(env, 1, absl::Seconds(30)));
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<float> buf(64, 1.0f);
        Work work =
            (*comm)->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)});
        ASSERT_TRUE(work.Wait(absl::Seconds(5)).ok());
        (*comm)->Abort(absl::CancelledError("trainer stopping"));
        const absl::Time start = absl::Now();
        absl::Status s = work.Synchronize(absl::Seconds(20));
        EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
        EXPECT_TRUE(absl::IsAborted(s) || absl::IsCancelled(s)) << s;
        EXPECT_THAT(s.message(), HasSubstr("trainer stopping"));
        fakes.api(env.rank).HoldStreams(false);
      },
      absl::Seconds(60));
}

// A CUDA view whose stream belongs to another device is refused at the call, naming the view.
TEST(StreamOrder, ViewWhoseStreamIsOnAnotherDeviceIsInvalidArgument) {
  std::vector<FakeNcclFaults> faults(kWorld);
  for (auto& f : faults) f.device_count = 2;
  FakeRanks fakes(faults);
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = Options(env, 1, absl::Seconds(10));
        auto comm = fakes.Create(env.rank, o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        FakeNcclApi& fake = fakes.api(env.rank);
        cuda::CudaStream other = nullptr;
        ASSERT_EQ(fake.SetDevice(1), cuda::kCudaSuccess);
        ASSERT_EQ(fake.StreamCreateNonBlocking(&other), cuda::kCudaSuccess);
        ASSERT_EQ(fake.SetDevice(0), cuda::kCudaSuccess);
        std::vector<float> buf(8, 1.0f);
        absl::Status s =
            (*comm)
                ->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0), other})
                .Wait(absl::Seconds(5));
        EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
        EXPECT_THAT(s.message(), HasSubstr("output view's stream belongs to cuda:1"));
        // The refusal took no sequence number: the next op still runs on every rank.
        Work ok =
            (*comm)->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0)});
        ASSERT_TRUE(ok.Synchronize(absl::Seconds(10)).ok());
        EXPECT_EQ(buf[0], static_cast<float>(kWorld));
      },
      absl::Seconds(60));
}

}  // namespace
}  // namespace adaptcomm

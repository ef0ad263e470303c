// Groups of device ops on NCCL are stream-ordered (StreamOrdered::LaunchGroup), through each rank's
// fake CUDA runtime and NCCL: GroupEnd takes every op's place in its stream and returns once the
// group is queued, the worker launches it as one unit, and Work::Wait on any of its ops makes the
// caller's stream wait for the whole group, never the caller. The hazards of a device op, each
// shown on the fake: a device that has not run the group yet, an abort while it is on the device,
// a stream under CUDA graph capture at GroupEnd, ops issued into the group by a second thread, and
// a device failure after a Wait let the caller's stream go on.
#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator/communicator_factory.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;

constexpr int kWorld = 2;
constexpr size_t kCount = 64;

// A rank of the fake world: its fake device, its communicator on NCCL and a stream of the caller's.
struct Rank {
  std::shared_ptr<FakeNcclApi> fake;
  std::unique_ptr<Communicator> comm;
  cuda::CudaStream caller = nullptr;
};

absl::StatusOr<Rank> StartRank(const std::shared_ptr<FakeNcclApi>& fake,
                               const testing::RankEnv& env, int retries, bool held) {
  Rank rank;
  rank.fake = fake;
  if (held) fake->HoldStreams(true);
  CommunicatorOptions o = env.options;
  o.backend = BackendChoice::kNccl;
  o.max_retry_attempts = retries;
  o.timeout = absl::Seconds(5);
  o.failure_report_window = absl::Seconds(2);
  auto comm = internal::CreateCommunicatorWith(o, testing::FakeSeams(fake));
  if (!comm.ok()) return comm.status();
  rank.comm = *std::move(comm);
  if (fake->StreamCreateNonBlocking(&rank.caller) != cuda::kCudaSuccess) {
    return absl::InternalError("the fake refused a stream");
  }
  fake->ClearCalls();
  return rank;
}

// Fakes of one world; rank `faulty` (if any) with `faults`.
std::vector<std::shared_ptr<FakeNcclApi>> Fakes(int faulty = -1,
                                                const FakeNcclFaults& faults = {}) {
  return testing::FakesWithFailingRank(kWorld, faulty, faults);
}

TensorView On(std::vector<float>& v, cuda::CudaStream stream) {
  return TensorView{v.data(), v.size(), DType::kF32, Device::Cuda(0), stream};
}

float Sent(int rank, size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i)); }

// One rank's buffers of the exchange below: a receive from the peer, an allreduce, a send. Each
// test declares them before its communicator, which may still write them while it is torn down.
struct Exchange {
  std::vector<float> out = std::vector<float>(kCount);
  std::vector<float> in = std::vector<float>(kCount, -1.0f);
  std::vector<float> sum = std::vector<float>(kCount);
  std::vector<Work> works;

  explicit Exchange(int rank) {
    for (size_t i = 0; i < kCount; ++i) {
      out[i] = Sent(rank, i);
      sum[i] = static_cast<float>(rank + 1);
    }
  }
  // The group's three ops, issued on `stream`; GroupEnd's status.
  absl::Status Issue(Communicator& comm, int peer, cuda::CudaStream stream) {
    if (absl::Status s = comm.GroupStart(); !s.ok()) return s;
    works.push_back(comm.Recv(On(in, stream), peer));
    works.push_back(comm.Allreduce(On(sum, stream)));
    works.push_back(comm.Send(On(out, stream), peer));
    return comm.GroupEnd();
  }
  void ExpectResults(int peer) const {
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(in[i], Sent(peer, i)) << "element " << i;
      ASSERT_EQ(sum[i], 3.0f) << "element " << i;  // ranks 0 and 1 gave 1 and 2
    }
  }
};

int Count(const std::vector<testing::FakeCall>& calls, const std::string& name, void* stream) {
  int n = 0;
  for (const testing::FakeCall& c : calls) n += c.name == name && c.stream == stream ? 1 : 0;
  return n;
}

// The group returns to the caller before the device ran any of it, Wait() on each op too (it only
// makes the caller's stream wait), and the device sees, in order: each op's issue event on the
// caller's stream, the communicator's stream waiting for them, the group's NCCL calls there, its
// done event, and the caller's stream waiting for that event once per Wait. Results are exact once
// the device runs. (A group that runs on the worker waits for the device: Wait would time out.)
TEST(NcclGroup, GroupReturnsBeforeTheDeviceRunsItAndWaitOrdersTheCallersStream) {
  const auto fakes = Fakes();
  testing::RunRanks(testing::RankMode::kThreads, kWorld, [&](const testing::RankEnv& env) {
    Exchange x(env.rank);
    absl::StatusOr<Rank> rank = StartRank(fakes[env.rank], env, 1, /*held=*/true);
    ASSERT_TRUE(rank.ok()) << rank.status();
    const int peer = 1 - env.rank;
    ASSERT_TRUE(x.Issue(*rank->comm, peer, rank->caller).ok());
    for (Work& w : x.works) {
      const absl::Status s = w.Wait(absl::Seconds(2));
      ASSERT_TRUE(s.ok()) << s;
    }
    EXPECT_EQ(rank->fake->collectives_started(), 0);
    EXPECT_EQ(x.in[0], -1.0f);  // nothing ran

    const std::vector<testing::FakeCall> calls = rank->fake->calls();
    ASSERT_GE(calls.size(), 3u);
    std::vector<void*> issue_events;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(calls[i].name, "EventRecord");
      EXPECT_EQ(calls[i].stream, rank->caller);
      issue_events.push_back(calls[i].event);
    }
    void* comm_stream = nullptr;
    void* done_event = nullptr;
    size_t i = 3;
    for (; i < calls.size() && calls[i].name == "StreamWaitEvent"; ++i) {
      comm_stream = calls[i].stream;
      EXPECT_NE(std::find(issue_events.begin(), issue_events.end(), calls[i].event),
                issue_events.end());
    }
    ASSERT_NE(comm_stream, nullptr);
    ASSERT_NE(comm_stream, static_cast<void*>(rank->caller));
    for (; i < calls.size() && calls[i].name != "EventRecord"; ++i) {
      EXPECT_EQ(calls[i].stream, comm_stream) << calls[i].name;
    }
    ASSERT_LT(i, calls.size());
    EXPECT_EQ(calls[i].stream, comm_stream);
    done_event = calls[i].event;
    int caller_waits = 0;
    for (++i; i < calls.size(); ++i) {
      if (calls[i].name != "StreamWaitEvent") continue;
      EXPECT_EQ(calls[i].stream, rank->caller);
      EXPECT_EQ(calls[i].event, done_event);
      ++caller_waits;
    }
    EXPECT_EQ(caller_waits, 3);  // one per Wait
    EXPECT_EQ(Count(calls, "AllReduce", comm_stream), 1);
    EXPECT_EQ(Count(calls, "Send", comm_stream), 1);
    EXPECT_EQ(Count(calls, "Recv", comm_stream), 1);

    rank->fake->HoldStreams(false);
    for (Work& w : x.works) ASSERT_TRUE(w.Synchronize(absl::Seconds(10)).ok()) << w.status();
    x.ExpectResults(peer);
  });
}

// Abort() while the group is on the device: every op of it fails with the abort's status at once,
// on every rank.
TEST(NcclGroup, AbortWhileTheGroupIsOnTheDeviceFailsEveryOp) {
  const auto fakes = Fakes();
  absl::Mutex mu;
  int issued = 0;
  testing::RunRanks(testing::RankMode::kThreads, kWorld, [&](const testing::RankEnv& env) {
    Exchange x(env.rank);
    absl::StatusOr<Rank> rank = StartRank(fakes[env.rank], env, 1, /*held=*/true);
    ASSERT_TRUE(rank.ok()) << rank.status();
    ASSERT_TRUE(x.Issue(*rank->comm, 1 - env.rank, rank->caller).ok());
    for (Work& w : x.works) ASSERT_TRUE(w.Wait(absl::Seconds(5)).ok());  // on the device now
    {
      // A rank's abort reaches its peer through the store: both groups are launched first.
      absl::MutexLock lock(&mu);
      ++issued;
      const auto all_issued = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return issued == kWorld; };
      ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_issued), absl::Seconds(10)));
    }
    rank->comm->Abort(absl::CancelledError("trainer stopping"));
    const absl::Time start = absl::Now();
    const absl::Status first = x.works[0].Synchronize(absl::Seconds(20));
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
    EXPECT_TRUE(absl::IsAborted(first) || absl::IsCancelled(first)) << first;
    for (Work& w : x.works) EXPECT_EQ(w.Synchronize(absl::Seconds(5)), first);
    rank->fake->HoldStreams(false);
  });
}

// A group issued on a stream under CUDA graph capture is refused at GroupEnd, before anything is
// recorded on the stream (the capture stays valid), takes no sequence number, and the next group
// runs on every rank.
TEST(NcclGroup, GroupOnACapturingStreamIsRefusedAtGroupEnd) {
  const auto fakes = Fakes();
  testing::RunRanks(testing::RankMode::kThreads, kWorld, [&](const testing::RankEnv& env) {
    Exchange captured(env.rank);
    Exchange x(env.rank);
    absl::StatusOr<Rank> rank = StartRank(fakes[env.rank], env, 1, /*held=*/false);
    ASSERT_TRUE(rank.ok()) << rank.status();
    const int peer = 1 - env.rank;
    rank->fake->BeginCapture(rank->caller);
    const absl::Status refused = captured.Issue(*rank->comm, peer, rank->caller);
    EXPECT_EQ(rank->fake->EndCapture(rank->caller), cuda::kCudaSuccess);
    EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr("captur"));
    for (Work& w : captured.works) {
      EXPECT_EQ(w.Wait(absl::Seconds(1)), refused);
      EXPECT_EQ(w.seq(), 0u);
    }
    EXPECT_EQ(rank->fake->collectives_started(), 0);

    ASSERT_TRUE(x.Issue(*rank->comm, peer, rank->caller).ok());
    for (Work& w : x.works) ASSERT_TRUE(w.Synchronize(absl::Seconds(10)).ok()) << w.status();
    x.ExpectResults(peer);
  });
}

// Ops that a second thread issues while the group is open join it: one launch, one sequence
// number for its send and receive, exact results.
TEST(NcclGroup, OpsIssuedByASecondThreadJoinTheOneLaunch) {
  const auto fakes = Fakes();
  testing::RunRanks(testing::RankMode::kThreads, kWorld, [&](const testing::RankEnv& env) {
    Exchange x(env.rank);
    absl::StatusOr<Rank> rank = StartRank(fakes[env.rank], env, 1, /*held=*/false);
    ASSERT_TRUE(rank.ok()) << rank.status();
    const int peer = 1 - env.rank;
    ASSERT_TRUE(rank->comm->GroupStart().ok());
    Work recv = rank->comm->Recv(On(x.in, rank->caller), peer);
    Work send;
    std::thread second([&] { send = rank->comm->Send(On(x.out, rank->caller), peer); });
    second.join();
    ASSERT_TRUE(rank->comm->GroupEnd().ok());
    EXPECT_NE(send.seq(), 0u);
    EXPECT_EQ(send.seq(), recv.seq());
    ASSERT_TRUE(send.Wait(absl::Seconds(5)).ok());
    ASSERT_TRUE(recv.Synchronize(absl::Seconds(10)).ok()) << recv.status();
    ASSERT_TRUE(send.Synchronize(absl::Seconds(10)).ok()) << send.status();
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(x.in[i], Sent(peer, i)) << "element " << i;
    const std::vector<testing::FakeCall> calls = rank->fake->calls();
    int records_on_comm_stream = 0;
    void* comm_stream = nullptr;
    for (const testing::FakeCall& c : calls) {
      if (c.name == "Send") comm_stream = c.stream;
    }
    for (const testing::FakeCall& c : calls) {
      records_on_comm_stream += c.name == "EventRecord" && c.stream == comm_stream ? 1 : 0;
    }
    EXPECT_EQ(records_on_comm_stream, 1);  // one done event: one launch
  });
}

// With coordinated retry on, a group that fails on the device after a Wait let the caller's stream
// go on cannot be redone in place outside a step: every op of it fails with DataLoss naming the op
// whose Wait released the stream, and the communicator is broken. The peer's group fails within
// its bounds.
TEST(NcclGroup, DeviceFailureAfterWaitReleasedTheStreamIsDataLoss) {
  // Rank 1's group, on its first NCCL communicator.
  const auto fakes = Fakes(1, FakeNcclFaults{.async_error_at_launch = 1, .async_error_on_comm = 1});
  testing::RunRanks(testing::RankMode::kThreads, kWorld, [&](const testing::RankEnv& env) {
    Exchange x(env.rank);
    absl::StatusOr<Rank> rank = StartRank(fakes[env.rank], env, 3, /*held=*/true);
    ASSERT_TRUE(rank.ok()) << rank.status();
    ASSERT_TRUE(x.Issue(*rank->comm, 1 - env.rank, rank->caller).ok());
    for (Work& w : x.works) ASSERT_TRUE(w.Wait(absl::Seconds(5)).ok());
    rank->fake->HoldStreams(false);  // the device runs the group (and fails it) only now
    const absl::Time start = absl::Now();
    const absl::Status first = x.works[0].Synchronize(absl::Seconds(60));
    EXPECT_LT(absl::Now() - start, absl::Seconds(30));
    EXPECT_FALSE(first.ok());
    for (Work& w : x.works) EXPECT_EQ(w.Synchronize(absl::Seconds(5)).code(), first.code());
    if (env.rank == 1) {
      EXPECT_TRUE(absl::IsDataLoss(first)) << first;
      EXPECT_THAT(std::string(first.message()), HasSubstr("let the caller's stream go on"));
      EXPECT_FALSE(rank->comm->health().ok());
    }
  });
}

}  // namespace
}  // namespace adaptcomm

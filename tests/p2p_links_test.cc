// Asynchronous sends and receives outside groups (P2POptions::async, lib/core/communicator/
// p2p_links.h): each direction between two ranks runs on a link of its own, beside the
// communicator's collectives and the other directions. What ordered sends and receives cannot do
// without a group: a ring shift where every rank sends first, and a send posted before a
// collective that its receiver runs first. Plus the order of one direction's tags, an abort and a
// link whose peer never comes, each bounded.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::RankEnv;
using testing::RankMode;
using testing::RunRanks;

constexpr P2POptions kAsync{.async = true};

struct Param {
  BackendChoice backend;
  int world;
};

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  return absl::StrCat(info.param.backend == BackendChoice::kShm ? "Shm" : "Gloo", info.param.world,
                      "Ranks");
}

std::unique_ptr<Communicator> MakeComm(const RankEnv& env, BackendChoice backend,
                                       absl::Duration init_timeout = absl::Seconds(60)) {
  CommunicatorOptions o = env.options;
  o.backend = backend;
  o.timeout = absl::Seconds(20);
  o.init_timeout = init_timeout;
  o.max_retry_attempts = 1;
  o.failure_report_window = absl::Seconds(1);  // a failed link waits this long for its peer's word
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::Create(o);
  if (!comm.ok()) {
    ADD_FAILURE() << comm.status();
    return nullptr;
  }
  return *std::move(comm);
}

float Payload(int src, int message, size_t j) {
  return static_cast<float>(src * 100000 + message * 1000 + static_cast<int>(j % 997));
}

class AsyncP2pTest : public ::testing::TestWithParam<Param> {};

// Every rank sends 4 MiB to the next rank, then receives from the previous one, and only then
// waits: ordered, every rank's send would wait for a receive its peer never reaches. Three rounds
// over the same links: the first queued while the links are made, the others straight on them.
TEST_P(AsyncP2pTest, RingShiftWithEveryRankSendingFirst) {
  const Param p = GetParam();
  RunRanks(RankMode::kThreads, p.world, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, p.backend);
    ASSERT_NE(comm, nullptr);
    const int r = env.rank, n = env.world_size;
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    const size_t count = size_t{1} << 20;
    for (int round = 0; round < 3; ++round) {
      std::vector<float> out(count), in(count, -1.0f);
      for (size_t j = 0; j < count; ++j) out[j] = Payload(r, round, j);
      Work send = comm->Send(HostView(out.data(), out.size()), next, kAsync);
      Work recv = comm->Recv(HostView(in.data(), in.size()), prev, kAsync);
      ASSERT_TRUE(send.Wait(absl::Seconds(30)).ok()) << send.status();
      ASSERT_TRUE(recv.Wait(absl::Seconds(30)).ok()) << recv.status();
      for (size_t j = 0; j < count; ++j) {
        ASSERT_EQ(in[j], Payload(prev, round, j)) << "round " << round << " element " << j;
      }
    }
    // The communicator's own ops go on, in its order.
    std::vector<float> sum(16, 1.0f);
    ASSERT_TRUE(comm->Allreduce(HostView(sum.data(), sum.size())).Wait().ok());
    EXPECT_EQ(sum[0], static_cast<float>(n));
  });
}

// Rank 0 posts a send, then joins an allreduce; rank 1 runs the allreduce first and only then
// receives. Ordered, rank 0's send would hold its allreduce behind a receive that comes after it.
TEST_P(AsyncP2pTest, SendPostedBeforeACollectiveTheReceiverRunsFirst) {
  const Param p = GetParam();
  RunRanks(RankMode::kThreads, p.world, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, p.backend);
    ASSERT_NE(comm, nullptr);
    const size_t count = size_t{1} << 20;
    std::vector<float> out(count), in(count, -1.0f), sum(64, 1.0f);
    for (size_t j = 0; j < count; ++j) out[j] = Payload(env.rank, 7, j);
    Work send;
    if (env.rank == 0) send = comm->Send(HostView(out.data(), out.size()), 1, kAsync);
    ASSERT_TRUE(comm->Allreduce(HostView(sum.data(), sum.size())).Wait().ok());
    EXPECT_EQ(sum[0], static_cast<float>(env.world_size));
    if (env.rank == 0) {
      ASSERT_TRUE(send.Wait(absl::Seconds(30)).ok()) << send.status();
    } else if (env.rank == 1) {
      ASSERT_TRUE(comm->Recv(HostView(in.data(), in.size()), 0, kAsync).Wait().ok());
      for (size_t j = 0; j < count; ++j) ASSERT_EQ(in[j], Payload(0, 7, j)) << j;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, AsyncP2pTest,
                         ::testing::Values(Param{BackendChoice::kShm, 2},
                                           Param{BackendChoice::kShm, 3},
                                           Param{BackendChoice::kGloo, 3}),
                         Name);

// One direction's messages are matched in issue order, each receive naming the send's tag; the
// two directions between a pair are independent (both ranks send first).
TEST(AsyncP2pOrderTest, TagsOfOneDirectionMatchInIssueOrder) {
  RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, BackendChoice::kShm);
    ASSERT_NE(comm, nullptr);
    const int peer = 1 - env.rank;
    std::vector<std::vector<float>> out(3), in(3);
    std::vector<Work> works;
    for (int m = 0; m < 3; ++m) {
      const size_t count = 100 + static_cast<size_t>(m) * 50000;
      out[m].resize(count);
      for (size_t j = 0; j < count; ++j) out[m][j] = Payload(env.rank, m, j);
      in[m].assign(count, -1.0f);
      works.push_back(comm->Send(HostView(out[m].data(), count), peer,
                                 {.tag = static_cast<uint32_t>(10 + m), .async = true}));
    }
    for (int m = 0; m < 3; ++m) {
      works.push_back(comm->Recv(HostView(in[m].data(), in[m].size()), peer,
                                 {.tag = static_cast<uint32_t>(10 + m), .async = true}));
    }
    for (Work& w : works) ASSERT_TRUE(w.Wait(absl::Seconds(30)).ok()) << w.status();
    for (int m = 0; m < 3; ++m) {
      for (size_t j = 0; j < in[m].size(); ++j) ASSERT_EQ(in[m][j], Payload(peer, m, j)) << m;
    }
  });
}

// Ordered by default (a send takes the communicator's sequence number); asynchronous when asked
// (no number of the communicator's: 0 while its link is being made).
TEST(AsyncP2pOrderTest, OrderedByDefaultAsynchronousWhenAsked) {
  RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, BackendChoice::kShm);
    ASSERT_NE(comm, nullptr);
    std::vector<float> v(8, 1.0f);
    for (const P2POptions& o : {P2POptions{}, kAsync}) {
      Work w = env.rank == 0 ? comm->Send(HostView(v.data(), v.size()), 1, o)
                             : comm->Recv(HostView(v.data(), v.size()), 0, o);
      ASSERT_TRUE(w.Wait().ok()) << w.status();
      EXPECT_EQ(w.seq(), o.async ? 0u : 1u);
    }
  });
}

// A receive that meets a send of another tag fails at once on shared memory, naming both tags,
// and the link fails its later ops with that status: never data in the wrong buffer, never a hang.
TEST(AsyncP2pFailureTest, ReceiveMeetingAnotherTagFailsNamingBoth) {
  RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, BackendChoice::kShm);
    ASSERT_NE(comm, nullptr);
    std::vector<float> v(8, static_cast<float>(env.rank + 1));
    if (env.rank == 0) {
      ASSERT_TRUE(comm->Send(HostView(v.data(), v.size()), 1, {.tag = 1, .async = true})
                      .Wait(absl::Seconds(20))
                      .ok());
      return;
    }
    const absl::Time start = absl::Now();
    const absl::Status s =
        comm->Recv(HostView(v.data(), v.size()), 0, {.tag = 2, .async = true}).Wait();
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr("expected tag 2"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("has tag 1"));
    for (float x : v) EXPECT_EQ(x, 2.0f);  // nothing landed
    const absl::Status later =
        comm->Recv(HostView(v.data(), v.size()), 0, {.tag = 1, .async = true}).Wait();
    EXPECT_FALSE(later.ok());
  });
}

// Abort() fails a receive that waits for a send that never comes, at once.
TEST(AsyncP2pFailureTest, AbortFailsAPendingReceivePromptly) {
  std::atomic<bool> done{false};
  RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, BackendChoice::kShm);
    ASSERT_NE(comm, nullptr);
    std::vector<float> v(1024, -1.0f);
    if (env.rank == 1) {
      // Makes the link (its first send, never followed), then stays until rank 0 is done.
      std::vector<float> first(1, 1.0f);
      ASSERT_TRUE(comm->Send(HostView(first.data(), 1), 0, kAsync).Wait().ok());
      const absl::Time give_up = absl::Now() + absl::Seconds(20);
      while (!done.load() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
      return;
    }
    ASSERT_TRUE(comm->Recv(HostView(v.data(), 1), 1, kAsync).Wait(absl::Seconds(20)).ok());
    Work pending = comm->Recv(HostView(v.data(), v.size()), 1, kAsync);
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_EQ(pending.state(), WorkState::kRunning);
    const absl::Time start = absl::Now();
    comm->Abort(absl::CancelledError("trainer stopping"));
    const absl::Status s = pending.Wait(absl::Seconds(10));
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    EXPECT_TRUE(absl::IsCancelled(s) || absl::IsAborted(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("trainer stopping"));
    done.store(true);
  });
}

// A receive from a rank that never uses the link fails once the link's making runs out of its
// bound (the init timeout), naming the link; it does not hang.
TEST(AsyncP2pFailureTest, LinkWhosePeerNeverComesFailsWithinTheInitTimeout) {
  std::atomic<bool> done{false};
  RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, BackendChoice::kShm, absl::Seconds(2));
    ASSERT_NE(comm, nullptr);
    if (env.rank == 1) {
      const absl::Time give_up = absl::Now() + absl::Seconds(20);
      while (!done.load() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
      return;
    }
    std::vector<float> v(16);
    const absl::Time start = absl::Now();
    const absl::Status s = comm->Recv(HostView(v.data(), v.size()), 1, kAsync).Wait();
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr("point-to-point link 1 -> 0"));
    done.store(true);
  });
}

}  // namespace
}  // namespace adaptcomm

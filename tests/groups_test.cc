// Groups of ops (Communicator::GroupStart/GroupEnd) on every backend: matching sends and receives
// complete whatever order each rank issued them in, collectives mixed in run in issue order, a
// failure fails every op of the group with one status, and misuse is an error, never a hang. Also
// the hierarchical backend's send/recv between any two ranks of different hosts, and NCCL's native
// all-to-all through the fake.
#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/core/selection/backend_selection.h"
#include "lib/core/selection/rendezvous.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;
using testing::RankEnv;
using testing::RankMode;
using testing::RunRanks;

// Each bound of a test: an op that would hang instead fails within it.
constexpr absl::Duration kOpTimeout = absl::Seconds(20);

enum class Kind { kGloo, kShm, kHier, kNccl };
std::string KindName(Kind k) {
  switch (k) {
    case Kind::kGloo:
      return "gloo";
    case Kind::kShm:
      return "shm";
    case Kind::kHier:
      return "hier";
    case Kind::kNccl:
      return "nccl";
  }
  return "?";
}

// One communicator per rank on `kind`. hier: two simulated hosts (ranks 0..n/2-1 on the first),
// shm inside each. nccl: `fakes[rank]` (one fake world).
std::unique_ptr<Communicator> MakeComm(const RankEnv& env, Kind kind,
                                       const std::vector<std::shared_ptr<FakeNcclApi>>& fakes = {},
                                       absl::Duration timeout = kOpTimeout) {
  CommunicatorOptions o = env.options;
  o.timeout = timeout;
  o.max_retry_attempts = 1;
  absl::StatusOr<std::unique_ptr<Communicator>> comm;
  switch (kind) {
    case Kind::kGloo:
      o.backend = BackendChoice::kGloo;
      comm = Communicator::Create(o);
      break;
    case Kind::kShm:
      o.backend = BackendChoice::kShm;
      comm = Communicator::Create(o);
      break;
    case Kind::kNccl: {
      o.backend = BackendChoice::kNccl;
      internal::CommunicatorDeps deps;
      deps.use_given_apis = true;
      deps.cuda = fakes[static_cast<size_t>(env.rank)];
      deps.nccl = fakes[static_cast<size_t>(env.rank)];
      comm = internal::CreateCommunicatorWith(o, deps);
      break;
    }
    case Kind::kHier: {
      internal::Rendezvous rv;
      rv.root_store = env.options.store;
      rv.store = CreatePrefixStore("hier-comm", env.options.store);
      rv.transport_host = "127.0.0.1";
      internal::selection::SelectionDeps deps;
      deps.use_given_apis = true;
      deps.host_identity = env.rank < env.world_size / 2 ? "host-a" : "host-b";
      o.backend = BackendChoice::kAuto;
      absl::StatusOr<internal::selection::SelectedBackend> selected =
          internal::selection::SelectBackendWith(o, rv, absl::Now() + absl::Seconds(60), deps);
      if (!selected.ok()) {
        ADD_FAILURE() << selected.status();
        return nullptr;
      }
      EXPECT_STREQ(selected->backend->name(), "hier") << selected->reason;
      comm = internal::CreateCommunicatorWithBackend(std::move(selected->backend), o,
                                                     internal::CommunicatorDeps{});
      break;
    }
  }
  if (!comm.ok()) {
    ADD_FAILURE() << KindName(kind) << ": " << comm.status();
    return nullptr;
  }
  return *std::move(comm);
}

std::vector<std::shared_ptr<FakeNcclApi>> Fakes(int world, const FakeNcclFaults& faults = {},
                                                int faulty_rank = -1) {
  auto fake_world = testing::MakeFakeNcclWorld();
  std::vector<std::shared_ptr<FakeNcclApi>> fakes;
  for (int r = 0; r < world; ++r) {
    fakes.push_back(
        std::make_shared<FakeNcclApi>(fake_world, r == faulty_rank ? faults : FakeNcclFaults{}));
  }
  return fakes;
}

TensorView ViewOf(std::vector<float>& v, Kind kind) {
  return TensorView{v.data(), v.size(), DType::kF32,
                    kind == Kind::kNccl ? Device::Cuda(0) : Device::Cpu(), nullptr};
}

// What rank `src` sends as message `m` (element `j`): unique per message and element.
float Payload(int src, int m, size_t j) {
  return static_cast<float>(src * 100000 + m * 1000 + static_cast<int>(j % 997));
}

// One p2p op of a group, issued later in some order.
struct P2p {
  bool send;
  int peer;
  int message;  // the payload's message number, and the tag (tag_of_message) it travels under
  uint32_t tag;
  std::vector<float>* buffer;
};

// Issues `ops` (in the order given) as one group; waits for all; checks every receive.
void RunGroupAndCheck(Communicator& comm, Kind kind, std::vector<P2p>& ops) {
  ASSERT_TRUE(comm.GroupStart().ok());
  std::vector<Work> works;
  for (P2p& p : ops) {
    TensorView v = ViewOf(*p.buffer, kind);
    works.push_back(p.send ? comm.Send(v, p.peer, {.tag = p.tag})
                           : comm.Recv(v, p.peer, {.tag = p.tag}));
  }
  ASSERT_TRUE(comm.GroupEnd().ok());
  // Synchronize: on NCCL a group is stream-ordered, and Wait() would only order the stream.
  for (size_t i = 0; i < works.size(); ++i) {
    ASSERT_TRUE(works[i].Synchronize(kOpTimeout).ok()) << works[i].status();
  }
  for (const P2p& p : ops) {
    if (p.send) continue;
    for (size_t j = 0; j < p.buffer->size(); ++j) {
      ASSERT_EQ((*p.buffer)[j], Payload(p.peer, p.message, j))
          << "message " << p.message << " from rank " << p.peer << ", element " << j;
    }
  }
}

struct Param {
  Kind kind;
  int world;
};

class GroupsTest : public ::testing::TestWithParam<Param> {};

// A ring shift of 64 messages per rank (to the next rank, from the previous one), messages of
// different sizes (a few larger than shm's chunk) and tags, each rank issuing its 128 ops in its
// own random order, three rounds; then a pairwise exchange (every rank sends one message to every
// other and receives one from each, all under one tag, so pairs match in issue order), also
// shuffled per rank.
TEST_P(GroupsTest, MatchingSendsAndReceivesCompleteInAnyIssueOrder) {
  const Param p = GetParam();
  const auto fakes = p.kind == Kind::kNccl ? Fakes(p.world) : decltype(Fakes(0)){};
  RunRanks(RankMode::kThreads, p.world, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, p.kind, fakes);
    ASSERT_NE(comm, nullptr);
    const int r = env.rank, n = env.world_size;
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    constexpr int kPairs = 64;
    for (int round = 0; round < 3; ++round) {
      std::mt19937 rng(static_cast<uint32_t>(1000 * round + 7 * r + 1));
      std::vector<std::vector<float>> out(kPairs), in(kPairs);
      std::vector<P2p> ops;
      for (int m = 0; m < kPairs; ++m) {
        // Mostly small (shm batches them into one chunk), some larger than a chunk, one empty.
        size_t count =
            m % 16 == 15 ? 200000 + static_cast<size_t>(m) : 16 + static_cast<size_t>(m) * 37;
        if (m == 7) count = 0;
        out[m].resize(count);
        for (size_t j = 0; j < count; ++j) out[m][j] = Payload(r, m, j);
        in[m].assign(count, -1.0f);
        // Tags are a permutation of the messages: the pairs match by tag, not by position.
        const uint32_t tag = static_cast<uint32_t>((m * 29 + round) % kPairs);
        ops.push_back(P2p{true, next, m, tag, &out[m]});
        ops.push_back(P2p{false, prev, m, tag, &in[m]});
      }
      std::shuffle(ops.begin(), ops.end(), rng);
      RunGroupAndCheck(*comm, p.kind, ops);
    }
    // Pairwise exchange: one tag, so each pair's messages go in issue order (one each way here).
    for (int round = 0; round < 2; ++round) {
      std::mt19937 rng(static_cast<uint32_t>(77 * round + r));
      std::vector<std::vector<float>> out(n), in(n);
      std::vector<P2p> ops;
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        out[q].resize(1000 + static_cast<size_t>(q) * 10);
        for (size_t j = 0; j < out[q].size(); ++j) out[q][j] = Payload(r, q + round, j);
        in[q].assign(1000 + static_cast<size_t>(r) * 10, -1.0f);
        ops.push_back(P2p{true, q, q + round, 5, &out[q]});
        ops.push_back(P2p{false, q, r + round, 5, &in[q]});
      }
      std::shuffle(ops.begin(), ops.end(), rng);
      RunGroupAndCheck(*comm, p.kind, ops);
    }
  });
}

// A group mixing collectives (same order on every rank) with sends and receives (in an order of
// each rank's own), and large messages (several chunks of shm's per-pair channel) that both ranks
// of a pair send before they receive: a deadlock outside a group.
TEST_P(GroupsTest, CollectivesMixWithSendsAndReceives) {
  const Param p = GetParam();
  const auto fakes = p.kind == Kind::kNccl ? Fakes(p.world) : decltype(Fakes(0)){};
  RunRanks(RankMode::kThreads, p.world, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, p.kind, fakes);
    ASSERT_NE(comm, nullptr);
    const int r = env.rank, n = env.world_size;
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    const size_t big = size_t{3} << 20;  // 12 MiB of floats
    std::vector<float> sum(1024, static_cast<float>(r + 1)), bcast(333, static_cast<float>(r));
    std::vector<float> out(big), in(big, -1.0f);
    for (size_t j = 0; j < big; ++j) out[j] = Payload(r, 0, j);
    Work send, recv, allreduce, broadcast;
    ASSERT_TRUE(comm->GroupStart().ok());
    if (r % 2 == 0) send = comm->Send(ViewOf(out, p.kind), next);
    allreduce = comm->Allreduce(ViewOf(sum, p.kind));
    if (r % 2 == 1) recv = comm->Recv(ViewOf(in, p.kind), prev);
    broadcast = comm->Broadcast(ViewOf(bcast, p.kind), {.root = n - 1});
    if (r % 2 == 1) send = comm->Send(ViewOf(out, p.kind), next);
    if (r % 2 == 0) recv = comm->Recv(ViewOf(in, p.kind), prev);
    ASSERT_TRUE(comm->GroupEnd().ok());
    for (Work* w : {&send, &recv, &allreduce, &broadcast}) {
      ASSERT_TRUE(w->Synchronize(kOpTimeout).ok()) << w->status();
    }
    // The group's number (its sends and receives), then one per collective in issue order: the
    // same on every rank whatever order it issued its ops in.
    EXPECT_EQ(recv.seq(), send.seq());
    EXPECT_EQ(allreduce.seq(), send.seq() + 1);
    EXPECT_EQ(broadcast.seq(), send.seq() + 2);
    const float total = static_cast<float>(n * (n + 1) / 2);
    for (float v : sum) ASSERT_EQ(v, total);
    for (float v : bcast) ASSERT_EQ(v, static_cast<float>(n - 1));
    for (size_t j = 0; j < big; ++j) ASSERT_EQ(in[j], Payload(prev, 0, j)) << j;
    // The communicator goes on with plain ops afterwards.
    std::vector<float> after(8, 1.0f);
    Work last = comm->Allreduce(ViewOf(after, p.kind));
    ASSERT_TRUE(last.Synchronize(kOpTimeout).ok()) << last.status();
    for (float v : after) ASSERT_EQ(v, static_cast<float>(n));
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, GroupsTest,
                         ::testing::Values(Param{Kind::kGloo, 2}, Param{Kind::kGloo, 3},
                                           Param{Kind::kShm, 2}, Param{Kind::kShm, 3},
                                           Param{Kind::kHier, 4}, Param{Kind::kNccl, 3}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return absl::StrCat(KindName(info.param.kind), info.param.world);
                         });

// Misuse is an error at once, never a hang.
TEST(GroupsMisuseTest, EndWithoutStartNestedStartAndEarlyWaitAreErrors) {
  RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, Kind::kShm);
    ASSERT_NE(comm, nullptr);
    absl::Status end = comm->GroupEnd();
    EXPECT_TRUE(absl::IsFailedPrecondition(end)) << end;
    EXPECT_THAT(std::string(end.message()), HasSubstr("without GroupStart"));
    ASSERT_TRUE(comm->GroupStart().ok());
    absl::Status step = comm->CommitStep();
    EXPECT_TRUE(absl::IsFailedPrecondition(step)) << step;
    EXPECT_THAT(std::string(step.message()), HasSubstr("inside a group"));
    absl::Status nested = comm->GroupStart();
    EXPECT_TRUE(absl::IsFailedPrecondition(nested)) << nested;
    EXPECT_THAT(std::string(nested.message()), HasSubstr("do not nest"));
    std::vector<float> data(4, 1.0f);
    Work w = comm->Allreduce(HostView(data.data(), data.size()));
    const absl::Time before = absl::Now();
    absl::Status early = w.Wait();  // unbounded, yet it returns at once
    EXPECT_LT(absl::Now() - before, absl::Seconds(1));
    EXPECT_TRUE(absl::IsFailedPrecondition(early)) << early;
    EXPECT_THAT(std::string(early.message()), HasSubstr("GroupEnd"));
    EXPECT_EQ(w.state(), WorkState::kPending);
    EXPECT_EQ(w.seq(), 0u);
    ASSERT_TRUE(comm->GroupEnd().ok());
    ASSERT_TRUE(w.Wait().ok()) << w.status();
    EXPECT_NE(w.seq(), 0u);
    for (float v : data) EXPECT_EQ(v, 2.0f);
    // Group(fn) is the same scope; an empty group is fine.
    EXPECT_TRUE(comm->Group([] {}).ok());
  });
}

// An op refused at issue (a peer out of range) fails every op of its group with one status, and
// GroupEnd returns it; the communicator is still usable (every rank refused alike).
TEST(GroupsMisuseTest, OpRefusedAtIssueFailsTheWholeGroup) {
  RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, Kind::kGloo);
    ASSERT_NE(comm, nullptr);
    std::vector<float> a(4, 1.0f), b(4, 0.0f);
    Work ok_op;
    Work bad_op;
    absl::Status end = comm->Group([&] {
      ok_op = comm->Allreduce(HostView(a.data(), a.size()));
      bad_op = comm->Send(HostView(b.data(), b.size()), /*peer=*/7);
    });
    EXPECT_TRUE(absl::IsInvalidArgument(end)) << end;
    EXPECT_EQ(ok_op.Wait(), end);
    EXPECT_EQ(bad_op.Wait(), end);
    EXPECT_THAT(std::string(end.message()), HasSubstr("peer 7"));
    ASSERT_TRUE(comm->Allreduce(HostView(a.data(), a.size())).Wait().ok());
    EXPECT_EQ(a[0], 2.0f);
  });
}

// A device failure inside a group (the fake's asynchronous error at the group's launch on rank 1)
// fails every op of the group with the same status there; the other rank's group fails within its
// timeout, every op with one status too.
TEST(GroupsFailureTest, DeviceFailureFailsEveryOpOfTheGroupAlike) {
  constexpr int kWorld = 2;
  // Launch 1: the first allreduce (below); launch 2: the group.
  const auto fakes = Fakes(kWorld, FakeNcclFaults{.async_error_at_launch = 2}, /*faulty_rank=*/1);
  RunRanks(RankMode::kThreads, kWorld, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, Kind::kNccl, fakes, absl::Seconds(2));
    ASSERT_NE(comm, nullptr);
    std::vector<float> warm(4, 1.0f);
    Work first_op = comm->Allreduce(ViewOf(warm, Kind::kNccl));
    ASSERT_TRUE(first_op.Synchronize(kOpTimeout).ok()) << first_op.status();
    const int peer = 1 - env.rank;
    std::vector<float> out(64, 1.0f), in(64), sum(16, 1.0f);
    std::vector<Work> works;
    ASSERT_TRUE(comm->GroupStart().ok());
    works.push_back(comm->Recv(ViewOf(in, Kind::kNccl), peer));
    works.push_back(comm->Allreduce(ViewOf(sum, Kind::kNccl)));
    works.push_back(comm->Send(ViewOf(out, Kind::kNccl), peer));
    ASSERT_TRUE(comm->GroupEnd().ok());
    // Stream-ordered: Wait() only orders the caller's stream; Synchronize() sees the device's end.
    const absl::Status first = works[0].Synchronize(kOpTimeout);
    EXPECT_FALSE(first.ok());
    for (Work& w : works) EXPECT_EQ(w.Synchronize(kOpTimeout), first);
    if (env.rank == 1) {
      EXPECT_THAT(std::string(first.message()), HasSubstr("injected")) << first;
    }
  });
}

// With coordinated retry on (the default profile's), a group that fails is never re-run alone:
// outside a step every rank votes and the group's ops fail with the redo status; inside a step
// CommitStep tells every rank to redo the step, and the redone step commits.
TEST(GroupsFailureTest, FailedGroupIsRedoneNeverReRunAlone) {
  constexpr int kWorld = 2;
  for (bool in_step : {false, true}) {
    SCOPED_TRACE(in_step ? "in a step" : "outside a step");
    // Launch 1: the group, on rank 1's first NCCL communicator only.
    const auto fakes =
        Fakes(kWorld, FakeNcclFaults{.async_error_at_launch = 1, .async_error_on_comm = 1}, 1);
    RunRanks(RankMode::kThreads, kWorld, [&](const RankEnv& env) {
      CommunicatorOptions o = env.options;
      o.backend = BackendChoice::kNccl;
      o.timeout = absl::Seconds(5);
      o.max_retry_attempts = 3;
      o.failure_report_window = absl::Seconds(2);
      internal::CommunicatorDeps deps;
      deps.use_given_apis = true;
      deps.cuda = fakes[static_cast<size_t>(env.rank)];
      deps.nccl = fakes[static_cast<size_t>(env.rank)];
      auto created = internal::CreateCommunicatorWith(o, deps);
      ASSERT_TRUE(created.ok()) << created.status();
      Communicator& comm = **created;
      const int peer = 1 - env.rank;
      std::vector<float> out(64, static_cast<float>(env.rank + 1)), in(64, -1.0f);
      auto exchange = [&](Work* s, Work* r) {
        return comm.Group([&] {
          *r = comm.Recv(ViewOf(in, Kind::kNccl), peer);
          *s = comm.Send(ViewOf(out, Kind::kNccl), peer);
        });
      };
      Work s, r;
      if (in_step) {
        ASSERT_TRUE(comm.BeginStep().ok());
      }
      ASSERT_TRUE(exchange(&s, &r).ok());
      // Synchronize, not Wait: a Wait would let the caller's stream past the group, which then
      // cannot be redone outside a step
      // (NcclGroup.DeviceFailureAfterWaitReleasedTheStreamIsDataLoss).
      const absl::Status failed = s.Synchronize(kOpTimeout);
      EXPECT_TRUE(IsStepRedo(failed)) << failed;
      if (!in_step) {
        EXPECT_THAT(std::string(failed.message()), HasSubstr("never re-run alone")) << failed;
      }
      EXPECT_EQ(r.Synchronize(kOpTimeout), failed);
      if (in_step) {
        absl::Status commit = comm.CommitStep();
        EXPECT_TRUE(IsStepRedo(commit)) << commit;
        ASSERT_TRUE(comm.BeginStep().ok());
      }
      // Redone on the rebuilt communicator.
      ASSERT_TRUE(exchange(&s, &r).ok());
      ASSERT_TRUE(s.Synchronize(kOpTimeout).ok()) << s.status();
      ASSERT_TRUE(r.Synchronize(kOpTimeout).ok()) << r.status();
      if (in_step) {
        ASSERT_TRUE(comm.CommitStep().ok());
      }
      for (float v : in) ASSERT_EQ(v, static_cast<float>(peer + 1));
    });
  }
}

// Abort while a group waits for a peer that never issues its part: every op of the group ends
// with the abort's status, promptly.
TEST(GroupsFailureTest, AbortFailsEveryOpOfAWaitingGroup) {
  std::atomic<bool> finished{false};
  RunRanks(RankMode::kThreads, 2, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, Kind::kGloo);
    ASSERT_NE(comm, nullptr);
    if (env.rank == 1) {
      // Never issues its part, and stays connected meanwhile (bounded).
      const absl::Time give_up = absl::Now() + absl::Seconds(15);
      while (!finished.load() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
      return;
    }
    std::vector<float> out(32, 1.0f), in(32);
    std::vector<Work> works;
    ASSERT_TRUE(comm->GroupStart().ok());
    works.push_back(comm->Send(HostView(out.data(), out.size()), 1));
    works.push_back(comm->Recv(HostView(in.data(), in.size()), 1));
    ASSERT_TRUE(comm->GroupEnd().ok());
    std::thread aborter([&] {
      absl::SleepFor(absl::Milliseconds(200));
      comm->Abort(absl::AbortedError("test aborts"));
    });
    const absl::Time before = absl::Now();
    const absl::Status first = works[0].Wait(absl::Seconds(10));
    aborter.join();
    EXPECT_LT(absl::Now() - before, absl::Seconds(5));
    EXPECT_TRUE(absl::IsAborted(first)) << first;
    EXPECT_EQ(works[1].Wait(absl::Seconds(10)), first);
    finished.store(true);
  });
}

// Inside a step, a group is part of the step: committed when every op of it succeeded, though
// the ranks' groups hold different numbers of sends and receives (rank 0 sends to both others,
// each of which receives once): the group takes the same sequence numbers on every rank, so the
// commit's count of the step's ops agrees.
TEST(GroupsStepTest, GroupInsideAStepCommits) {
  RunRanks(RankMode::kThreads, 3, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, Kind::kShm);
    ASSERT_NE(comm, nullptr);
    std::vector<float> out(100, 7.0f), in(100, -1.0f), sum(10, 1.0f);
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE(comm->BeginStep().ok());
      std::vector<Work> works;
      ASSERT_TRUE(comm->Group([&] {
                        if (env.rank == 0) {
                          works.push_back(comm->Send(HostView(out.data(), out.size()), 1));
                          works.push_back(comm->Send(HostView(out.data(), out.size()), 2));
                        } else {
                          works.push_back(comm->Recv(HostView(in.data(), in.size()), 0));
                        }
                        works.push_back(comm->Allreduce(HostView(sum.data(), sum.size())));
                      })
                      .ok());
      for (Work& w : works) ASSERT_TRUE(w.Wait().ok()) << w.status();
      absl::Status commit = comm->CommitStep();
      ASSERT_TRUE(commit.ok()) << commit;
    }
    if (env.rank != 0) {
      for (float v : in) EXPECT_EQ(v, 7.0f);
    }
    for (float v : sum) EXPECT_EQ(v, 9.0f);
  });
}

// The hierarchical backend (2 hosts x 2 ranks): plain send/recv between every pair of ranks,
// non-leaders of different hosts included (a pair link made on first use).
TEST(HierP2pTest, EveryPairTalksOutsideGroups) {
  RunRanks(RankMode::kThreads, 4, [&](const RankEnv& env) {
    std::unique_ptr<Communicator> comm = MakeComm(env, Kind::kHier);
    ASSERT_NE(comm, nullptr);
    EXPECT_TRUE(comm->capabilities().send_recv);
    const int r = env.rank;
    // Pairs in a fixed order; in each, the smaller rank sends first.
    for (int a = 0; a < 4; ++a) {
      for (int b = a + 1; b < 4; ++b) {
        if (r != a && r != b) continue;
        const int peer = r == a ? b : a;
        std::vector<float> out(500), in(500, -1.0f);
        for (size_t j = 0; j < out.size(); ++j) out[j] = Payload(r, a * 4 + b, j);
        if (r == a) {
          ASSERT_TRUE(comm->Send(HostView(out.data(), out.size()), peer).Wait().ok());
          ASSERT_TRUE(comm->Recv(HostView(in.data(), in.size()), peer).Wait().ok());
        } else {
          ASSERT_TRUE(comm->Recv(HostView(in.data(), in.size()), peer).Wait().ok());
          ASSERT_TRUE(comm->Send(HostView(out.data(), out.size()), peer).Wait().ok());
        }
        for (size_t j = 0; j < in.size(); ++j) {
          ASSERT_EQ(in[j], Payload(peer, a * 4 + b, j)) << a << "<->" << b;
        }
      }
    }
  });
}

// NCCL's Alltoall: ncclAlltoAll where the loaded NCCL has it, grouped send/recv otherwise; the
// same result either way.
TEST(NcclAlltoallTest, NativeWhereAvailableElseGroupedSendRecv) {
  constexpr int kWorld = 3;
  for (bool native : {true, false}) {
    SCOPED_TRACE(native ? "native" : "send/recv");
    // Every rank's fake offers it or none does.
    std::vector<std::shared_ptr<FakeNcclApi>> all;
    auto fake_world = testing::MakeFakeNcclWorld();
    for (int r = 0; r < kWorld; ++r) {
      all.push_back(
          std::make_shared<FakeNcclApi>(fake_world, FakeNcclFaults{.has_alltoall = native}));
    }
    RunRanks(RankMode::kThreads, kWorld, [&](const RankEnv& env) {
      std::unique_ptr<Communicator> comm = MakeComm(env, Kind::kNccl, all);
      ASSERT_NE(comm, nullptr);
      const size_t block = 5;
      std::vector<float> in(block * kWorld), out(block * kWorld, -1.0f);
      for (int dst = 0; dst < kWorld; ++dst) {
        for (size_t j = 0; j < block; ++j) in[dst * block + j] = Payload(env.rank, dst, j);
      }
      Work w = comm->Alltoall(ViewOf(in, Kind::kNccl), ViewOf(out, Kind::kNccl));
      ASSERT_TRUE(w.Synchronize(kOpTimeout).ok()) << w.status();
      for (int src = 0; src < kWorld; ++src) {
        for (size_t j = 0; j < block; ++j) {
          ASSERT_EQ(out[src * block + j], Payload(src, env.rank, j)) << src << " " << j;
        }
      }
      bool called = false;
      for (const testing::FakeCall& c : all[static_cast<size_t>(env.rank)]->calls()) {
        called |= c.name == "AlltoAll";
      }
      EXPECT_EQ(called, native);
    });
  }
}

}  // namespace
}  // namespace adaptcomm

// Elastic membership (#14): one of 4 ranks is killed (SIGKILL, real processes) mid-run and the
// survivors go on as a world of 3, on Gloo and on shared memory; rank 0 too, when the store is
// served apart from the ranks (ADAPTCOMM_STORE_EXTERNAL=1, as `adaptcomm launch --elastic` does).
// Every result after the loss is checked element by element against the sum over the ranks that
// are still members.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/adaptcomm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/build_info.h"
#include "lib/core/elastic/elastic_grow.h"
#include "lib/core/elastic/membership.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::RankEnv;

constexpr int kWorld = 4;
constexpr int kVictim = 2;

std::string FreshDir(const std::string& name) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/elastic_", name, "_", getpid());
  std::string cmd = absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

// The job's store served by a process of its own, as `adaptcomm launch --elastic` serves it from
// the launcher: the ranks forked while this lives get ADAPTCOMM_STORE_EXTERNAL=1, so rank 0 is a
// client like every other rank and may be lost. (A process rather than a thread of the test: the
// ranks are forked from here, and a fork copies no threads.)
class StoreServedApart {
 public:
  StoreServedApart() {
    int ready[2];
    if (pipe(ready) != 0) {
      ADD_FAILURE() << "pipe failed";
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      close(ready[0]);
      absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = StartTcpStoreServer({});
      const int port = server.ok() ? (*server)->port() : -1;
      (void)!write(ready[1], &port, sizeof(port));
      close(ready[1]);
      while (server.ok()) pause();  // until the test kills it
      _exit(1);
    }
    close(ready[1]);
    if (read(ready[0], &port_, sizeof(port_)) != static_cast<ssize_t>(sizeof(port_))) port_ = -1;
    close(ready[0]);
    EXPECT_GT(port_, 0) << "the store server did not start";
    setenv("ADAPTCOMM_STORE_EXTERNAL", "1", 1);
  }
  ~StoreServedApart() {
    unsetenv("ADAPTCOMM_STORE_EXTERNAL");
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
};

std::string ThisHost() {
  char host[256] = "unknown";
  gethostname(host, sizeof(host) - 1);
  return host;
}

int64_t ReadMicros(const std::string& path) {
  int64_t t = 0;
  std::ifstream(path) >> t;
  return t;
}

// Waits (bounded) until `path` holds a number, as a launcher waits for a death before restarting.
bool AwaitFile(const std::string& path, absl::Duration bound = absl::Seconds(60)) {
  const absl::Time until = absl::Now() + bound;
  while (ReadMicros(path) == 0) {
    if (absl::Now() >= until) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

// Writes `value` to `path` at once (a reader never sees it half-written).
void WriteAtomically(const std::string& path, int64_t value) {
  std::ofstream(path + ".tmp") << value;
  std::rename((path + ".tmp").c_str(), path.c_str());
}

// Input of the rank that was `initial` at creation, for step s, element i: small integers, so
// float sums are exact.
float Input(int initial, int step, size_t i) {
  return static_cast<float>((initial + 1) * ((step % 5) + 1) + static_cast<int>(i % 11));
}

CommunicatorOptions ElasticOptionsFor(const RankEnv& env, BackendChoice backend,
                                      const std::string& dir) {
  CommunicatorOptions o = env.options;
  o.backend = backend;
  o.fallback = Fallback::kDeny;
  o.timeout = absl::Seconds(10);
  o.failure_report_window = absl::Seconds(2);
  o.flight_recorder_dir = dir;
  o.elastic.on_loss = LossPolicy::kShrink;
  o.elastic.loss_window = absl::Seconds(1);
  o.elastic.min_world_size = 2;
  return o;
}

// Allreduces step after step; the victim dies (SIGKILL) before its op of `kill_step`. The
// survivors' op of that step completes on the 3 that are left, and so does every later one.
// `store_port`: the store is served apart (StoreServedApart) on that port; 0: rank 0 serves it.
void KillOneOfFourAllreduce(BackendChoice backend, int victim = kVictim, int store_port = 0) {
  const std::string dir = FreshDir(absl::StrCat(BackendChoiceName(backend), "_", victim));
  constexpr int kSteps = 80, kKillStep = 30;
  std::vector<int> survivors;
  for (int r = 0; r < kWorld; ++r) {
    if (r != victim) survivors.push_back(r);
  }
  std::vector<int> status = testing::RunRankProcesses(
      kWorld,
      [&](const RankEnv& env) {
        int changes_seen = 0;
        CommunicatorOptions o = ElasticOptionsFor(env, backend, dir);
        if (store_port != 0) o.master_port = store_port;
        o.elastic.on_change = [&](const Membership& m) {
          ++changes_seen;
          std::ofstream(absl::StrCat(dir, "/callback.", env.rank)) << m.world_size;
        };
        auto comm = Communicator::Create(o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        ASSERT_STREQ((*comm)->backend_name(), BackendChoiceName(backend));
        std::vector<float> buf;
        bool recovered = false;
        for (int step = 0; step < kSteps; ++step) {
          if (env.rank == victim && step == kKillStep) {
            WriteAtomically(dir + "/killed_at", NowMicros());
            raise(SIGKILL);
          }
          const size_t n = step % 3 == 0 ? 70000 : 1000 + step;  // both shm paths, Gloo's ring
          buf.resize(n);
          for (size_t i = 0; i < n; ++i) buf[i] = Input(env.rank, step, i);
          absl::Status s = (*comm)->Allreduce(HostView(buf.data(), n)).Wait();
          ASSERT_TRUE(s.ok()) << "rank " << env.rank << " step " << step << ": " << s;
          const Membership m = (*comm)->membership();
          if (step < kKillStep) {
            ASSERT_EQ(m.world_size, kWorld);
          } else {
            ASSERT_EQ(m.world_size, kWorld - 1) << "step " << step;
          }
          if (step >= kKillStep && !recovered) {
            recovered = true;
            const double seconds = (NowMicros() - ReadMicros(dir + "/killed_at")) / 1e6;
            std::ofstream(absl::StrCat(dir, "/recovered.", env.rank)) << seconds;
            EXPECT_THAT(m.lost_ranks, ElementsAre(victim));
            EXPECT_EQ(m.changes, 1);
            EXPECT_THAT(m.reason, HasSubstr(absl::StrCat("rank(s) ", victim, " of 4 lost")));
            EXPECT_EQ(m.initial_ranks, survivors);
            EXPECT_EQ(m.rank, env.rank < victim ? env.rank : env.rank - 1);
            EXPECT_EQ((*comm)->rank(), m.rank);
            EXPECT_EQ((*comm)->size(), 3);
            EXPECT_GE(m.generation, 1);
          }
          for (size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int initial : m.initial_ranks) want += Input(initial, step, i);
            ASSERT_EQ(buf[i], want) << "rank " << env.rank << " step " << step << " i " << i;
          }
        }
        EXPECT_EQ(changes_seen, 1);
        // World-size-shaped ops issued on the new membership work with its shapes.
        const Membership m = (*comm)->membership();
        std::vector<int32_t> mine(3, m.initial_ranks[m.rank]);
        std::vector<int32_t> all(3 * m.world_size, -1);
        ASSERT_TRUE(
            (*comm)
                ->Allgather(HostView(mine.data(), mine.size()), HostView(all.data(), all.size()))
                .Wait()
                .ok());
        for (int r = 0; r < m.world_size; ++r) {
          for (int k = 0; k < 3; ++k) ASSERT_EQ(all[r * 3 + k], m.initial_ranks[r]);
        }
        std::ofstream(absl::StrCat(dir, "/done.", env.rank)) << "ok";
      },
      absl::Seconds(90));
  ASSERT_EQ(status.size(), static_cast<size_t>(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    if (r == victim) {
      EXPECT_TRUE(WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL);
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
    double seconds = -1;
    std::ifstream(absl::StrCat(dir, "/recovered.", r)) >> seconds;
    std::printf(
        "%s, rank %d killed: rank %d's first successful allreduce on 3 ranks %.2f s after "
        "the kill\n",
        BackendChoiceName(backend), victim, r, seconds);
    // Op timeout 10 s; the target is at most timeout + 3 s. The loss window is 1 s.
    EXPECT_GT(seconds, 0);
    EXPECT_LT(seconds, 13);
  }
}

TEST(Elastic, KilledRankShrinksGlooToThree) { KillOneOfFourAllreduce(BackendChoice::kGloo); }

TEST(Elastic, KilledRankShrinksShmToThree) { KillOneOfFourAllreduce(BackendChoice::kShm); }

// Rank 0 is lost like any other when it does not serve the store: rank 1 at creation becomes rank
// 0 of the 3 survivors (the shm segment of the new world is its to create).
TEST(Elastic, KilledRankZeroShrinksGlooToThreeWithTheStoreServedApart) {
  StoreServedApart store;
  KillOneOfFourAllreduce(BackendChoice::kGloo, /*victim=*/0, store.port());
}

TEST(Elastic, KilledRankZeroShrinksShmToThreeWithTheStoreServedApart) {
  StoreServedApart store;
  KillOneOfFourAllreduce(BackendChoice::kShm, /*victim=*/0, store.port());
}

// Without a store served apart, rank 0 serves it: its loss ends the job. Every survivor's op fails
// (not a membership change) within a bound, naming rank 0 and the store, rather than hanging.
TEST(Elastic, LostRankZeroThatServesTheStoreFailsEverySurvivorNamingIt) {
  const std::string dir = FreshDir("rank0_store");
  std::vector<int> status = testing::RunRankProcesses(
      kWorld,
      [&](const RankEnv& env) {
        auto comm = Communicator::Create(ElasticOptionsFor(env, BackendChoice::kGloo, dir));
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<float> v(1000, 1.0f);
        ASSERT_TRUE((*comm)->Allreduce(HostView(v.data(), v.size())).Wait().ok());
        if (env.rank == 0) raise(SIGKILL);
        const absl::Time start = absl::Now();
        absl::Status s = (*comm)->Allreduce(HostView(v.data(), v.size())).Wait();
        const absl::Duration took = absl::Now() - start;
        ASSERT_FALSE(s.ok()) << "rank " << env.rank;
        EXPECT_FALSE(IsMembershipChanged(s)) << s;
        // Its code depends on what noticed first (the store listener, the retry vote, the broken
        // backend); its message names the cause either way.
        EXPECT_THAT(std::string(s.message()),
                    HasSubstr("rank 0 at creation, which serves the store,"))
            << s;
        // The op timeout is 10 s: the store's loss is named well before a hang would end.
        EXPECT_LT(took, absl::Seconds(30)) << s;
        std::printf("rank %d: failed %.2f s after rank 0's loss: %s\n", env.rank,
                    absl::ToDoubleSeconds(took), std::string(s.message()).c_str());
        EXPECT_EQ((*comm)->size(), kWorld);
      },
      absl::Seconds(60));
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
  }
}

// The op in flight when the rank dies depends on the world size (allgather): it fails on every
// survivor with the membership-changed status, and the trainer's redo with the new shapes works;
// a broadcast from a root that was renumbered (3 -> 2) reaches every survivor.
TEST(Elastic, WorldShapedOpFailsWithMembershipChangedAndRedoWorks) {
  const std::string dir = FreshDir("allgather");
  std::vector<int> status = testing::RunRankProcesses(
      kWorld,
      [&](const RankEnv& env) {
        auto comm = Communicator::Create(ElasticOptionsFor(env, BackendChoice::kGloo, dir));
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<int32_t> mine(5, env.rank * 10);
        std::vector<int32_t> all(5 * kWorld);
        ASSERT_TRUE(
            (*comm)
                ->Allgather(HostView(mine.data(), mine.size()), HostView(all.data(), all.size()))
                .Wait()
                .ok());
        if (env.rank == kVictim) raise(SIGKILL);
        absl::Status s =
            (*comm)
                ->Allgather(HostView(mine.data(), mine.size()), HostView(all.data(), all.size()))
                .Wait();
        ASSERT_TRUE(IsMembershipChanged(s)) << "rank " << env.rank << ": " << s;
        EXPECT_EQ(MembershipChangedWorldSize(s), 3) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr("depends on the world size"));
        EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 2 of 4 lost"));
        EXPECT_TRUE((*comm)->health().ok()) << (*comm)->health();
        // Redo the step with the new world's shapes.
        ASSERT_EQ((*comm)->size(), 3);
        all.assign(5 * 3, -1);
        ASSERT_TRUE(
            (*comm)
                ->Allgather(HostView(mine.data(), mine.size()), HostView(all.data(), all.size()))
                .Wait()
                .ok());
        const std::vector<int> initial = {0, 1, 3};
        for (int r = 0; r < 3; ++r) {
          for (int k = 0; k < 5; ++k) ASSERT_EQ(all[r * 5 + k], initial[r] * 10);
        }
        // Rank 3 at creation is rank 2 now: a broadcast from it reaches every survivor.
        std::vector<float> b(1000, static_cast<float>(env.rank));
        BroadcastOptions from;
        from.root = 2;
        ASSERT_TRUE((*comm)->Broadcast(HostView(b.data(), b.size()), from).Wait().ok());
        for (float x : b) ASSERT_EQ(x, 3.0f);
      },
      absl::Seconds(60));
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
  }
}

// With the default policy (fail) nothing changes: the loss fails every survivor naming the rank.
// A shrink below elastic.min_world_size fails too, naming the ranks and the minimum.
TEST(Elastic, ShrinkBelowMinimumWorldFailsEveryRankNamingIt) {
  const std::string dir = FreshDir("minimum");
  std::vector<int> status = testing::RunRankProcesses(
      kWorld,
      [&](const RankEnv& env) {
        CommunicatorOptions o = ElasticOptionsFor(env, BackendChoice::kGloo, dir);
        o.elastic.min_world_size = 4;
        auto comm = Communicator::Create(o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<float> v(100, 1.0f);
        ASSERT_TRUE((*comm)->Allreduce(HostView(v.data(), v.size())).Wait().ok());
        if (env.rank == kVictim) raise(SIGKILL);
        absl::Status s = (*comm)->Allreduce(HostView(v.data(), v.size())).Wait();
        ASSERT_FALSE(s.ok());
        EXPECT_FALSE(IsMembershipChanged(s)) << s;
        EXPECT_TRUE(absl::IsUnavailable(s)) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 2 lost"));
        EXPECT_THAT(std::string(s.message()), HasSubstr("below elastic.min_world_size 4"));
        EXPECT_EQ((*comm)->size(), kWorld);
      },
      absl::Seconds(60));
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
  }
}

// Grow (#14 item 3): rank 2 of 4 is killed, the survivors shrink to 3, a replacement started with
// the same job (process 4 here, given rank 2 and world 4 as a launcher restarting rank 2 would)
// is admitted at the next step boundary (AdmitJoiners) and the job goes on as 4: the members keep
// ranks 0-2, the replacement is rank 3 (id 4), rank 0 broadcasts the step to it, and every
// allreduce is checked element by element against the sum over the current members' inputs.
void KillThenReplaceAllreduce(BackendChoice backend) {
  const std::string dir = FreshDir(absl::StrCat("grow_", BackendChoiceName(backend)));
  constexpr int kSteps = 60, kKillStep = 20, kReplacement = kWorld;
  std::vector<int> status = testing::RunRankProcesses(
      kWorld + 1,
      [&](const RankEnv& env) {
        int changes_seen = 0;
        RankEnv as = env;
        as.options.world_size = kWorld;
        const bool replacement = env.rank == kReplacement;
        if (replacement) {
          as.options.rank = kVictim;
          // Started once the victim is dead, as a launcher would.
          while (ReadMicros(dir + "/killed_at") == 0) absl::SleepFor(absl::Milliseconds(20));
        }
        const int64_t started = NowMicros();
        CommunicatorOptions o = ElasticOptionsFor(as, backend, dir);
        o.elastic.join = replacement;
        o.elastic.on_change = [&](const Membership&) { ++changes_seen; };
        auto comm = Communicator::Create(o);
        ASSERT_TRUE(comm.ok()) << "process " << env.rank << ": " << comm.status();
        ASSERT_STREQ((*comm)->backend_name(), BackendChoiceName(backend));
        // The state rank 0 sends a joiner: the step to go on at and the last step (the members
        // run at least 10 steps on the grown world, however long the replacement took).
        int64_t state[2] = {0, kSteps};
        if (replacement) {
          const Membership m = (*comm)->membership();
          EXPECT_TRUE(m.joined);
          EXPECT_EQ(m.rank, 3);
          EXPECT_EQ(m.world_size, kWorld);
          EXPECT_THAT(m.initial_ranks, ElementsAre(0, 1, 3, kReplacement));
          EXPECT_THAT(m.joined_ranks, ElementsAre(3));
          EXPECT_GE(m.generation, 2);
          // The state the members send right after admitting it: here, the step to go on at.
          ASSERT_TRUE((*comm)->Broadcast(HostView(state, 2)).Wait().ok());
          ASSERT_GT(state[0], kKillStep);
        }
        const int64_t first_step = state[0];
        std::vector<float> buf;
        for (int64_t step = first_step; step < state[1] || (*comm)->size() < kWorld; ++step) {
          ASSERT_LT(step, 100000) << "no replacement joined";
          if (!(replacement && step == first_step)) {
            absl::Status admitted = (*comm)->AdmitJoiners();
            if (!admitted.ok()) {
              ASSERT_TRUE(IsMembershipChanged(admitted)) << "rank " << env.rank << ": " << admitted;
              EXPECT_EQ(MembershipChangedWorldSize(admitted), kWorld) << admitted;
              EXPECT_THAT(std::string(admitted.message()), HasSubstr("rank(s) 3 (id 4) joined"));
              EXPECT_EQ((*comm)->size(), kWorld);
              state[0] = step;
              state[1] = std::max<int64_t>(state[1], step + 10);
              ASSERT_TRUE((*comm)->Broadcast(HostView(state, 2)).Wait().ok());
              ASSERT_EQ(state[0], step);
            }
          }
          if (env.rank == kVictim && step == kKillStep) {
            std::ofstream(dir + "/killed_at.tmp") << NowMicros();
            std::rename((dir + "/killed_at.tmp").c_str(), (dir + "/killed_at").c_str());
            raise(SIGKILL);
          }
          const size_t n = step % 3 == 0 ? 70000 : 1000 + step;
          const Membership before = (*comm)->membership();
          buf.resize(n);
          for (size_t i = 0; i < n; ++i) {
            buf[i] = Input(before.initial_ranks[before.rank], static_cast<int>(step), i);
          }
          absl::Status s = (*comm)->Allreduce(HostView(buf.data(), n)).Wait();
          ASSERT_TRUE(s.ok()) << "rank " << env.rank << " step " << step << ": " << s;
          const Membership m = (*comm)->membership();
          for (size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int id : m.initial_ranks) want += Input(id, static_cast<int>(step), i);
            ASSERT_EQ(buf[i], want) << "rank " << env.rank << " step " << step << " i " << i;
          }
          if (replacement && step == first_step) {
            std::ofstream(dir + "/joined_after") << (NowMicros() - started) / 1e6;
          }
        }
        const Membership m = (*comm)->membership();
        EXPECT_EQ(m.world_size, kWorld);
        EXPECT_THAT(m.initial_ranks, ElementsAre(0, 1, 3, kReplacement));
        EXPECT_EQ(changes_seen, replacement ? 0 : 2) << "rank " << env.rank;
        EXPECT_EQ(m.changes, replacement ? 0 : 2);
        // World-shaped ops work on the grown world.
        std::vector<int32_t> mine(2, m.initial_ranks[m.rank]), all(2 * kWorld, -1);
        ASSERT_TRUE(
            (*comm)
                ->Allgather(HostView(mine.data(), mine.size()), HostView(all.data(), all.size()))
                .Wait()
                .ok());
        for (int r = 0; r < kWorld; ++r) ASSERT_EQ(all[2 * r], m.initial_ranks[r]);
      },
      absl::Seconds(90));
  ASSERT_EQ(status.size(), static_cast<size_t>(kWorld + 1));
  for (int r = 0; r <= kWorld; ++r) {
    if (r == kVictim) {
      EXPECT_TRUE(WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL);
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "process " << r;
  }
  double seconds = -1;
  std::ifstream(dir + "/joined_after") >> seconds;
  std::printf("%s: replacement's first allreduce on 4 ranks %.3f s after it started\n",
              BackendChoiceName(backend), seconds);
  EXPECT_GT(seconds, 0);
}

TEST(ElasticGrow, ReplacementJoinsAfterShrinkGloo) {
  KillThenReplaceAllreduce(BackendChoice::kGloo);
}

TEST(ElasticGrow, ReplacementJoinsAfterShrinkShm) { KillThenReplaceAllreduce(BackendChoice::kShm); }

// Rank 0's part in admissions passes to its successor (store served apart). Rank 2 of 4 dies and
// its replacement joins (id 4, rank 3); then rank 0 dies: the survivors shrink (rank 1 at creation
// is rank 0 now, the replacement rank 2) and the new rank 0 admits as the old one did: a
// replacement for rank 0 joins with a fresh id (5; id 4 is taken) and a second process claiming
// rank 2 is refused, naming the replacement that holds it. Every allreduce is checked element by
// element against the sum over the members' inputs.
TEST(ElasticGrow, NewRankZeroAdmitsAfterRankZeroIsLost) {
  StoreServedApart store;
  const std::string dir = FreshDir("successor");
  // Processes 0-3: the ranks at creation; 4: rank 2's replacement; 5: rank 0's; 6: a second claim
  // on rank 2, made while process 4 holds it.
  constexpr int kFirstJoiner = 4, kRankZeroJoiner = 5, kSecondClaim = 6, kSteps = 12;
  std::vector<int> status = testing::RunRankProcesses(
      7,
      [&](const RankEnv& env) {
        RankEnv as = env;
        as.options.world_size = kWorld;
        as.options.master_port = store.port();
        const bool joiner = env.rank >= kFirstJoiner;
        if (env.rank == kFirstJoiner) {
          as.options.rank = kVictim;
          WriteAtomically(dir + "/joiner4.pid", getpid());
          ASSERT_TRUE(AwaitFile(dir + "/killed.2"));
        } else if (env.rank == kRankZeroJoiner || env.rank == kSecondClaim) {
          as.options.rank = env.rank == kRankZeroJoiner ? 0 : kVictim;
          ASSERT_TRUE(AwaitFile(dir + "/killed.0"));
        }
        CommunicatorOptions o = ElasticOptionsFor(as, BackendChoice::kGloo, dir);
        o.elastic.join = joiner;
        auto comm = Communicator::Create(o);
        if (env.rank == kSecondClaim) {
          ASSERT_FALSE(comm.ok());
          EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
          EXPECT_THAT(std::string(comm.status().message()),
                      HasSubstr(absl::StrCat("joiner ", ThisHost(), ":", getpid(),
                                             " claims rank 2 of communicator 'test', which is "
                                             "held by ",
                                             ThisHost(), ":", ReadMicros(dir + "/joiner4.pid"),
                                             " (a member, rank 2 now, id 4)")));
          WriteAtomically(dir + "/refused", 1);
          return;
        }
        ASSERT_TRUE(comm.ok()) << "process " << env.rank << ": " << comm.status();
        // What rank 0 sends a joiner: the step to go on at and the step to end at.
        int64_t state[2] = {0, kSteps};
        if (joiner) {
          ASSERT_TRUE((*comm)->Broadcast(HostView(state, 2)).Wait().ok());
        }
        const int64_t first_step = state[0];
        int64_t grown_at = -1;  // process 0: the step at which rank 2's replacement joined
        std::vector<float> buf;
        for (int64_t step = first_step;; ++step) {
          ASSERT_LT(step, 100000) << "the joiners never came";
          if (!(joiner && step == first_step)) {
            absl::Status admitted = (*comm)->AdmitJoiners();
            if (!admitted.ok()) {
              ASSERT_TRUE(IsMembershipChanged(admitted))
                  << "process " << env.rank << ": " << admitted;
              EXPECT_THAT(std::string(admitted.message()), HasSubstr("joined"));
              state[0] = step;
              state[1] = std::max<int64_t>(state[1], step + 5);
              ASSERT_TRUE((*comm)->Broadcast(HostView(state, 2)).Wait().ok());
              if (grown_at < 0) grown_at = step;
            }
          }
          // The current rank 0 says when to stop: past the last step, with both joiners in and
          // the second claim refused, so that every member stops at the same step.
          int64_t done = (*comm)->rank() == 0 && step >= state[1] &&
                         (*comm)->membership().initial_ranks == std::vector<int>{1, 3, 4, 5} &&
                         ReadMicros(dir + "/refused") != 0;
          ASSERT_TRUE((*comm)->Broadcast(HostView(&done, 1)).Wait().ok()) << "process " << env.rank;
          if (done != 0) break;
          if (env.rank == kVictim && step == 10) {
            WriteAtomically(dir + "/killed.2", NowMicros());
            raise(SIGKILL);
          }
          if (env.rank == 0 && grown_at >= 0 && step == grown_at + 3) {
            WriteAtomically(dir + "/killed.0", NowMicros());
            raise(SIGKILL);
          }
          const size_t n = 1000 + static_cast<size_t>(step % 7);
          const Membership before = (*comm)->membership();
          buf.resize(n);
          for (size_t i = 0; i < n; ++i) {
            buf[i] = Input(before.initial_ranks[before.rank], static_cast<int>(step), i);
          }
          absl::Status s = (*comm)->Allreduce(HostView(buf.data(), n)).Wait();
          ASSERT_TRUE(s.ok()) << "process " << env.rank << " step " << step << ": " << s;
          const Membership m = (*comm)->membership();
          for (size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int id : m.initial_ranks) want += Input(id, static_cast<int>(step), i);
            ASSERT_EQ(buf[i], want) << "process " << env.rank << " step " << step << " i " << i;
          }
        }
        const Membership m = (*comm)->membership();
        EXPECT_EQ(m.world_size, kWorld);
        EXPECT_THAT(m.initial_ranks, ElementsAre(1, 3, 4, 5));
        EXPECT_EQ((*comm)->rank(), env.rank == 1              ? 0
                                   : env.rank == 3            ? 1
                                   : env.rank == kFirstJoiner ? 2
                                                              : 3);
        // Process 1, 3: shrink, grow, shrink, grow; rank 2's replacement: the last two.
        EXPECT_EQ(m.changes, env.rank == kFirstJoiner      ? 2
                             : env.rank == kRankZeroJoiner ? 0
                                                           : 4)
            << "process " << env.rank;
      },
      absl::Seconds(120));
  ASSERT_EQ(status.size(), 7u);
  for (int r = 0; r < 7; ++r) {
    if (r == 0 || r == kVictim) {
      EXPECT_TRUE(WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL) << "process " << r;
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "process " << r;
  }
}

// A replacement whose profile differs from rank 0's is refused, naming the setting, and so is one
// that claims a rank a live member holds, naming both processes; the members see no change. One
// without elastic, or in rank 0's place, is refused before it asks.
TEST(ElasticGrow, ReplacementWithAnotherProfileOrALiveRankIsRefusedNamingWhy) {
  const std::string dir = FreshDir("refused");
  std::vector<int> status = testing::RunRankProcesses(
      3,
      [&](const RankEnv& env) {
        RankEnv as = env;
        as.options.world_size = 2;
        if (env.rank == 2) {
          as.options.rank = 1;
          CommunicatorOptions o = ElasticOptionsFor(as, BackendChoice::kGloo, dir);
          o.elastic.join = true;
          o.timeout = absl::Seconds(11);  // the members run with 10 s
          auto comm = Communicator::Create(o);
          ASSERT_FALSE(comm.ok());
          EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
          EXPECT_THAT(std::string(comm.status().message()), HasSubstr("refused by rank 0"));
          EXPECT_THAT(std::string(comm.status().message()), HasSubstr("11s vs 10s"));
          o.timeout = absl::Seconds(10);
          // World limits come from the API or the environment too, outside the profile's hash.
          o.elastic.min_world_size = 3;
          comm = Communicator::Create(o);
          ASSERT_FALSE(comm.ok());
          EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
          EXPECT_THAT(std::string(comm.status().message()),
                      HasSubstr("has other elastic limits than rank 0: elastic.on_loss=shrink "
                                "elastic.min_world_size=3 loss_window=1s vs elastic.on_loss=shrink "
                                "elastic.min_world_size=2 loss_window=1s"));
          o.elastic.min_world_size = 2;
          // Rank 1 is alive: this process would be a second rank 1 (#14, bad input).
          comm = Communicator::Create(o);
          ASSERT_FALSE(comm.ok());
          EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
          const std::string holder =
              absl::StrCat(ThisHost(), ":", ReadMicros(dir + "/member1.pid"));
          EXPECT_THAT(std::string(comm.status().message()),
                      HasSubstr(absl::StrCat("joiner ", ThisHost(), ":", getpid(),
                                             " claims rank 1 of communicator 'test', which is "
                                             "held by ",
                                             holder, " (a member, rank 1 now, id 1)")));
          o.rank = 0;
          comm = Communicator::Create(o);
          EXPECT_THAT(std::string(comm.status().message()), HasSubstr("rank 0 cannot be replaced"));
          o.rank = 1;
          o.elastic.on_loss = LossPolicy::kFail;
          comm = Communicator::Create(o);
          EXPECT_THAT(std::string(comm.status().message()), HasSubstr("needs elastic.on_loss"));
          std::ofstream(dir + "/refused") << "1";
          return;
        }
        if (env.rank == 1) std::ofstream(dir + "/member1.pid") << getpid();
        auto comm = Communicator::Create(ElasticOptionsFor(as, BackendChoice::kGloo, dir));
        ASSERT_TRUE(comm.ok()) << comm.status();
        std::vector<float> v(100);
        for (int step = 0;; ++step) {
          ASSERT_LT(step, 100000);
          ASSERT_TRUE((*comm)->AdmitJoiners().ok());
          int64_t done = ReadMicros(dir + "/refused");
          ASSERT_TRUE((*comm)->Broadcast(HostView(&done, 1)).Wait().ok());
          if (done != 0) break;
          std::fill(v.begin(), v.end(), 1.0f);
          ASSERT_TRUE((*comm)->Allreduce(HostView(v.data(), v.size())).Wait().ok());
          ASSERT_EQ(v[0], 2.0f);
          absl::SleepFor(absl::Milliseconds(5));
        }
        EXPECT_EQ((*comm)->size(), 2);
        EXPECT_EQ((*comm)->membership().changes, 0);
      },
      absl::Seconds(60));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "process " << r;
  }
}

// A joiner from another build is refused by rank 0 before its profile is compared, naming both
// builds; one from this build is accepted with the rank it claims (no processes: the store
// protocol of lib/core/elastic/elastic_grow.h between a joiner thread and rank 0's screening).
TEST(ElasticGrow, ReplacementFromAnotherBuildIsRefusedNamingBothBuilds) {
  std::shared_ptr<Store> store = CreateHashStore();
  const EffectiveConfig config;
  const std::string limits = internal::ElasticLimits(internal::ElasticPolicy{});
  auto ask = [&](const std::string& build) {
    internal::JoinerIdentity me;
    me.who = "hostB:4242";
    me.build = build;
    me.claimed_rank = 2;
    me.limits = limits;
    return internal::RequestAdmission(*store, config, me, absl::Now() + absl::Seconds(20));
  };
  auto screen_next = [&](int64_t handled) {
    for (int i = 0; i < 2000; ++i) {
      absl::StatusOr<internal::ScreenedJoiners> s =
          internal::ScreenJoiners(*store, handled, config, BuildVersion(), limits);
      if (!s.ok() || s->count > handled) return s;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return absl::StatusOr<internal::ScreenedJoiners>(absl::DeadlineExceededError("no ticket"));
  };
  absl::StatusOr<internal::Admission> other = absl::UnknownError("not run");
  std::thread joiner([&] { other = ask("0.0.9 (git other)"); });
  absl::StatusOr<internal::ScreenedJoiners> screened = screen_next(0);
  joiner.join();
  ASSERT_TRUE(screened.ok()) << screened.status();
  EXPECT_TRUE(screened->accepted.empty());
  EXPECT_TRUE(absl::IsFailedPrecondition(other.status())) << other.status();
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr(absl::StrCat("refused by rank 0: joiner hostB:4242 runs another build than "
                                     "rank 0: adaptcomm 0.0.9 (git other) vs ",
                                     BuildVersion())));

  absl::StatusOr<internal::Admission> same = absl::UnknownError("not run");
  joiner = std::thread([&] { same = ask(BuildVersion()); });
  screened = screen_next(1);
  ASSERT_TRUE(screened.ok()) << screened.status();
  ASSERT_EQ(screened->accepted.size(), 1u);
  EXPECT_EQ(screened->accepted[0].claimed_rank, 2);
  EXPECT_EQ(screened->accepted[0].who, "hostB:4242");
  internal::RefuseJoiners(*store, {{screened->accepted[0].ticket, "test is over"}});
  joiner.join();
  EXPECT_THAT(std::string(same.status().message()), HasSubstr("test is over"));
  EXPECT_EQ(BuildVersion().find('|'), std::string::npos) << BuildVersion();
}

// A rank at creation is held by one process at most: a joiner claiming a member's rank, or one an
// earlier joiner of the same admission claimed, is refused naming both processes.
TEST(ElasticGrow, SecondClaimOnARankIsRefusedNamingBothProcesses) {
  std::vector<internal::ScreenedJoiner> joiners(3);
  joiners[0] = {1, 1, "hostB:21"};
  joiners[1] = {2, 2, "hostB:22"};
  joiners[2] = {3, 2, "hostB:23"};
  internal::RankClaims claims =
      internal::CheckRankClaims(joiners, {{1, "hostA:11 (a member, rank 1 now, id 1)"}}, "job");
  ASSERT_EQ(claims.admitted.size(), 1u);
  EXPECT_EQ(claims.admitted[0].ticket, 2);
  ASSERT_EQ(claims.refused.size(), 2u);
  EXPECT_EQ(claims.refused[0].first, 1);
  EXPECT_THAT(claims.refused[0].second,
              HasSubstr("joiner hostB:21 claims rank 1 of communicator 'job', which is held by "
                        "hostA:11 (a member, rank 1 now, id 1)"));
  EXPECT_EQ(claims.refused[1].first, 3);
  EXPECT_THAT(claims.refused[1].second,
              HasSubstr("joiner hostB:23 claims rank 2 of communicator 'job', which is held by "
                        "joiner hostB:22 (admitted now)"));
}

// Ops issued before a change, as they read after it (no processes needed).
TEST(ElasticTranslate, RootsAndPeersAreRenumberedAndWorldShapedOpsRefused) {
  internal::MembershipChange c;
  c.old_world = 4;
  c.new_world = 3;
  c.old_to_new = {0, 1, -1, 2};
  c.lost = {2};
  c.reason = "rank(s) 2 of 4 lost";
  OpDesc bcast;
  bcast.kind = OpKind::kBroadcast;
  bcast.root = 3;
  absl::StatusOr<OpDesc> t = internal::TranslateOp(bcast, {&c});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->root, 2);
  bcast.root = 2;
  t = internal::TranslateOp(bcast, {&c});
  EXPECT_TRUE(IsMembershipChanged(t.status())) << t.status();
  EXPECT_EQ(MembershipChangedWorldSize(t.status()), 3) << t.status();
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("root (rank 2) was lost"));
  OpDesc send;
  send.kind = OpKind::kSend;
  send.peer = 1;
  t = internal::TranslateOp(send, {&c});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->peer, 1);
  for (OpKind k : {OpKind::kAllgather, OpKind::kReduceScatter, OpKind::kAlltoall}) {
    OpDesc op;
    op.kind = k;
    EXPECT_TRUE(IsMembershipChanged(internal::TranslateOp(op, {&c}).status())) << OpKindName(k);
  }
  OpDesc allreduce;
  allreduce.kind = OpKind::kAllreduce;
  EXPECT_TRUE(internal::TranslateOp(allreduce, {&c}).ok());
  EXPECT_FALSE(IsMembershipChanged(absl::AbortedError("aborted")));
}

// The status is recognised by its typed payload (status.h), not by the text of its message.
TEST(ElasticStatus, MembershipChangeIsItsPayloadNotItsMessage) {
  absl::Status s = MembershipChangedError(3, "rank(s) 2 of 4 lost");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "membership changed: rank(s) 2 of 4 lost");
  EXPECT_TRUE(IsMembershipChanged(s));
  EXPECT_EQ(MembershipChangedWorldSize(s), 3);
  EXPECT_FALSE(IsStepRedo(s));
  // The same words without the payload are just an abort.
  absl::Status text_only = absl::AbortedError("membership changed: rank(s) 2 of 4 lost");
  EXPECT_FALSE(IsMembershipChanged(text_only));
  EXPECT_EQ(MembershipChangedWorldSize(text_only), std::nullopt);
  // The payload on another code, or a payload that is not a world size, marks nothing.
  absl::Status other_code(absl::StatusCode::kUnavailable, "peer gone");
  other_code.SetPayload(kMembershipChangedPayload, absl::Cord("3"));
  EXPECT_FALSE(IsMembershipChanged(other_code));
  absl::Status garbled = absl::AbortedError("x");
  garbled.SetPayload(kMembershipChangedPayload, absl::Cord("three"));
  EXPECT_FALSE(IsMembershipChanged(garbled));
}

// The policy is read off the effective elastic.* settings (precedence: tests/settings_test.cc).
TEST(ElasticPolicy, WaitAddsTheReplacementTimeoutAndNamesWhatFollows) {
  ElasticSettings settings;
  settings.on_loss = "shrink";
  settings.loss_window = absl::Seconds(3);
  internal::ElasticPolicy p = internal::ElasticPolicyOf(settings);
  EXPECT_TRUE(p.elastic && p.shrink_on_loss);
  EXPECT_EQ(p.loss_window, absl::Seconds(3));
  settings.on_loss = "fail";
  EXPECT_FALSE(internal::ElasticPolicyOf(settings).elastic);
  settings.on_loss = "wait_for_replacement";
  settings.replacement_timeout = absl::Seconds(7);
  settings.after_timeout = "fail";
  p = internal::ElasticPolicyOf(settings);
  EXPECT_TRUE(p.elastic);
  EXPECT_FALSE(p.shrink_on_loss);
  EXPECT_EQ(p.loss_window, absl::Seconds(10));
  // A joiner is compared with the members on these words: the two waits must differ in them.
  const std::string wait_then_fail = internal::ElasticLimits(p);
  EXPECT_EQ(wait_then_fail,
            "elastic.on_loss=wait_for_replacement elastic.after_timeout=fail "
            "elastic.min_world_size=1 loss_window=10s");
  settings.after_timeout = "shrink";
  EXPECT_NE(internal::ElasticLimits(internal::ElasticPolicyOf(settings)), wait_then_fail);
}

}  // namespace
}  // namespace adaptcomm

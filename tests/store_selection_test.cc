// Choosing an external store (profile store.url, ADAPTCOMM_STORE, CommunicatorOptions::store_url)
// and communicators that rendezvous through a real Redis or etcd server: allreduce on 4 ranks,
// an elastic shrink after rank 0 is killed, and a wrong Redis password refused at creation.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "adaptcomm/adaptcomm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/config/profile_loader.h"
#include "tests/external_servers.h"
#include "tests/harness.h"
#include "tests/profile_test_util.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RankEnv;
using testing::ServerProcess;

const SettingRecord* Find(const EffectiveConfig& c, const std::string& key) {
  for (const SettingRecord& s : c.settings) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

absl::StatusOr<EffectiveConfig> FromText(const std::string& text, const std::string& env = "",
                                         std::optional<std::string> api = std::nullopt) {
  config::ResolveInputs in;
  in.text = text;
  in.file = "job.yaml";
  in.env["ADAPTCOMM_STORE"] = env;
  in.overrides.store_url = api;
  return config::ResolveFromText(in, testing::Registry());
}

constexpr char kProfile[] = R"(schema: 1
defaults:
  timeouts:
    store_connect: 30s
  store: redis://:pw@redis.internal:6380
tiers:
  - name: only
)";

TEST(StoreSelection, ProfileEnvAndApiInThatOrderWithThePasswordHidden) {
  absl::StatusOr<EffectiveConfig> c = FromText(kProfile);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.url, "redis://:pw@redis.internal:6380");
  EXPECT_EQ(c->store.source, "job.yaml:5");
  const SettingRecord* shown = Find(*c, "store.url");
  ASSERT_NE(shown, nullptr);
  EXPECT_EQ(shown->value, "redis://:***@redis.internal:6380");
  EXPECT_THAT(c->Explain(), Not(HasSubstr(":pw@")));
  EXPECT_THAT(c->CanonicalListing(), Not(HasSubstr(":pw@")));

  c = FromText(kProfile, "etcd://10.0.0.5:2379");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.url, "etcd://10.0.0.5:2379");
  EXPECT_EQ(c->store.source, "env ADAPTCOMM_STORE");

  c = FromText(kProfile, "etcd://10.0.0.5:2379", "redis://127.0.0.1:7000");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.url, "redis://127.0.0.1:7000");
  EXPECT_EQ(c->store.source, "API");

  // The map form, and no store at all.
  c = FromText("schema: 1\ndefaults:\n  store:\n    url: etcd://e:1\ntiers:\n  - name: only\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.url, "etcd://e:1");
  c = FromText("schema: 1\ntiers:\n  - name: only\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.url, "");
  EXPECT_EQ(c->store.source, "default");
}

TEST(StoreSelection, BadUrlsAreRefusedNamingWhereTheyCameFrom) {
  absl::StatusOr<EffectiveConfig> c =
      FromText("schema: 1\ndefaults:\n  store: redis://:pw@host:99999\ntiers:\n  - name: only\n");
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("job.yaml:3:10: store.url: store URL 'redis://***@host:99999': port "
                        "'99999' is not a TCP port"));
  c = FromText("schema: 1\ntiers:\n  - name: only\n    store:\n      url: mysql://h\n");
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("job.yaml:5:12: store.url: store URL 'mysql://h': unknown scheme"));
  c = FromText("schema: 1\ntiers:\n  - name: only\n", "redis//h:1");
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("env ADAPTCOMM_STORE: store.url: store URL 'redis//h:1': no scheme"));
  c = FromText("schema: 1\ntiers:\n  - name: only\n", "", "etcd://h:1/x");
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("API: store.url: store URL"));
}

// The options of a rank that rendezvouses through `url` instead of the harness's store.
CommunicatorOptions ThroughUrl(const RankEnv& env, const std::string& url) {
  CommunicatorOptions o = env.options;
  o.store = nullptr;
  o.master_port.reset();  // the URL names the server
  o.store_url = url;
  o.store_token = "job-a";
  o.init_timeout = absl::Seconds(60);
  return o;
}

std::vector<float> Input(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank * 10 + static_cast<int>(i % 7));
  return v;
}

// 4 ranks as threads create a communicator through the server at `url` and allreduce; the
// job's keys are on the server, under its token.
void FourRanksAllreduce(const ServerProcess& server, const std::string& scheme) {
  constexpr int kWorld = 4;
  constexpr size_t kCount = 4096;
  testing::RunRanks(testing::RankMode::kThreads, kWorld, [&](const RankEnv& env) {
    auto comm = Communicator::Create(ThroughUrl(env, server.Url()));
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> buf = Input(env.rank, kCount);
    ASSERT_TRUE((*comm)->Allreduce(HostView(buf.data(), buf.size())).Wait().ok());
    for (size_t i = 0; i < kCount; ++i) {
      float want = 0;
      for (int r = 0; r < kWorld; ++r) want += Input(r, kCount)[i];
      ASSERT_EQ(buf[i], want) << "rank " << env.rank << " element " << i;
    }
    EXPECT_THAT((*comm)->Explain(), HasSubstr(server.Url()));
  });
  ExternalStoreOptions raw;
  raw.url = server.Url();
  auto store = ConnectExternalStore(raw);
  ASSERT_TRUE(store.ok()) << store.status();
  // Every rank counted its creation of "test" in the job's namespace.
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(*(*store)->Get(absl::StrCat("adaptcomm/job/job-a/adaptcomm/incarnations/test/", r),
                             absl::ZeroDuration()),
              "1")
        << scheme << " rank " << r;
  }
}

TEST(CommunicatorOverRedis, FourRanksAllreduce) {
  ServerProcess redis(ServerProcess::Kind::kRedis);
  if (!redis.SkipReason().empty()) GTEST_SKIP() << redis.SkipReason();
  ASSERT_EQ(redis.error(), "");
  FourRanksAllreduce(redis, "redis");
}

TEST(CommunicatorOverEtcd, FourRanksAllreduce) {
  ServerProcess etcd(ServerProcess::Kind::kEtcd);
  if (!etcd.SkipReason().empty()) GTEST_SKIP() << etcd.SkipReason();
  ASSERT_EQ(etcd.error(), "");
  FourRanksAllreduce(etcd, "etcd");
}

TEST(CommunicatorOverRedis, WrongPasswordIsRefusedAtCreationNamingIt) {
  ServerProcess redis(ServerProcess::Kind::kRedis, "right-pw");
  if (!redis.SkipReason().empty()) GTEST_SKIP() << redis.SkipReason();
  ASSERT_EQ(redis.error(), "");
  RankEnv env;
  env.options.rank = 0;
  env.options.world_size = 1;
  env.options.name = "test";
  const absl::Time start = absl::Now();
  auto comm = Communicator::Create(ThroughUrl(env, redis.Url(":wrong-pw@")));
  EXPECT_TRUE(absl::IsPermissionDenied(comm.status())) << comm.status();
  const std::string message(comm.status().message());
  EXPECT_THAT(message, HasSubstr(absl::StrCat("redis store redis://:***@127.0.0.1:", redis.port(),
                                              " refused the credentials of user 'default'")));
  EXPECT_THAT(message, Not(HasSubstr("wrong-pw")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "a refusal is not retried";
  // The right one, through the environment.
  ASSERT_EQ(setenv("ADAPTCOMM_STORE", redis.Url(":right-pw@").c_str(), 1), 0);
  CommunicatorOptions o = ThroughUrl(env, "");
  o.store_url.reset();  // unset: the environment decides ("" would mean rank 0's TCP store)
  comm = Communicator::Create(o);
  unsetenv("ADAPTCOMM_STORE");
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_THAT((*comm)->Explain(), HasSubstr("env ADAPTCOMM_STORE"));
}

// The output and exit code of a shell command.
std::pair<int, std::string> Capture(const std::string& command) {
  std::string text;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) text.append(buf, n);
  const int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, text};
}

// `adaptcomm status` finds a job whose store is on Redis, under the job's token, and only there.
TEST(CommunicatorOverRedis, StatusReadsTheJobsRecords) {
  ServerProcess redis(ServerProcess::Kind::kRedis);
  if (!redis.SkipReason().empty()) GTEST_SKIP() << redis.SkipReason();
  ASSERT_EQ(redis.error(), "");
  const std::string cli = testing::BuildDir() + "/tools/adaptcomm";
  if (::access(cli.c_str(), X_OK) != 0) GTEST_SKIP() << "the adaptcomm command is not built";
  const std::string status = absl::StrCat(cli, " status --store ", redis.Url(), " --comm test");
  std::pair<int, std::string> ours, stranger;
  absl::Notification read;
  testing::RunRanks(testing::RankMode::kThreads, 2, [&](const RankEnv& env) {
    auto comm = Communicator::Create(ThroughUrl(env, redis.Url()));
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> buf(16, 1.0f);
    ASSERT_TRUE((*comm)->Allreduce(HostView(buf.data(), buf.size())).Wait().ok());
    if (env.rank == 0) {
      absl::SleepFor(absl::Milliseconds(1500));  // the ranks publish once a second
      ours = Capture(status + " --token job-a");
      stranger = Capture(status + " --token job-b");
      read.Notify();
    } else {
      read.WaitForNotificationWithTimeout(absl::Seconds(60));
    }
  });
  EXPECT_EQ(ours.first, 0) << ours.second;
  EXPECT_THAT(ours.second,
              HasSubstr(absl::StrCat("communicator 'test', 2 ranks (store ", redis.Url(), ")")));
  EXPECT_EQ(stranger.first, 1) << stranger.second;
  EXPECT_THAT(stranger.second, HasSubstr("no state records of communicator 'test'"));
}

// Rank 0 is killed mid-run; with the store on a Redis or etcd server nobody's loss ends the job:
// the three others shrink to a world of 3 and go on, every result checked.
void ShrinkAfterRankZeroIsKilled(const ServerProcess& server) {
  constexpr int kWorld = 4, kSteps = 20, kKillStep = 8;
  constexpr size_t kCount = 1000;
  std::vector<int> status = testing::RunRankProcesses(
      kWorld,
      [&](const RankEnv& env) {
        CommunicatorOptions o = ThroughUrl(env, server.Url());
        o.backend = BackendChoice::kGloo;
        o.fallback = Fallback::kDeny;
        o.timeout = absl::Seconds(10);
        o.failure_report_window = absl::Seconds(2);
        o.elastic.on_loss = LossPolicy::kShrink;
        o.elastic.loss_window = absl::Seconds(1);
        o.elastic.min_world_size = 2;
        auto comm = Communicator::Create(o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        for (int step = 0; step < kSteps; ++step) {
          if (env.rank == 0 && step == kKillStep) raise(SIGKILL);
          std::vector<float> buf = Input(env.rank + step, kCount);
          absl::Status s = (*comm)->Allreduce(HostView(buf.data(), buf.size())).Wait();
          ASSERT_TRUE(s.ok()) << "rank " << env.rank << " step " << step << ": " << s;
          const Membership m = (*comm)->membership();
          ASSERT_EQ(m.world_size, step < kKillStep ? kWorld : kWorld - 1) << "step " << step;
          for (size_t i = 0; i < kCount; ++i) {
            float want = 0;
            for (int initial : m.initial_ranks) want += Input(initial + step, kCount)[i];
            ASSERT_EQ(buf[i], want) << "rank " << env.rank << " step " << step << " i " << i;
          }
        }
        EXPECT_EQ((*comm)->membership().lost_ranks, std::vector<int>{0});
      },
      absl::Seconds(90));
  ASSERT_EQ(status.size(), static_cast<size_t>(kWorld));
  EXPECT_TRUE(WIFSIGNALED(status[0]) && WTERMSIG(status[0]) == SIGKILL);
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
  }
}

TEST(CommunicatorOverRedis, ElasticShrinkAfterRankZeroIsKilled) {
  ServerProcess redis(ServerProcess::Kind::kRedis);
  if (!redis.SkipReason().empty()) GTEST_SKIP() << redis.SkipReason();
  ASSERT_EQ(redis.error(), "");
  ShrinkAfterRankZeroIsKilled(redis);
}

TEST(CommunicatorOverEtcd, ElasticShrinkAfterRankZeroIsKilled) {
  ServerProcess etcd(ServerProcess::Kind::kEtcd);
  if (!etcd.SkipReason().empty()) GTEST_SKIP() << etcd.SkipReason();
  ASSERT_EQ(etcd.error(), "");
  ShrinkAfterRankZeroIsKilled(etcd);
}

}  // namespace
}  // namespace adaptcomm

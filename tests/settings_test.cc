// One settings path (lib/config/sources.h): the options of CommunicatorOptions, the ADAPTCOMM_*
// variables, the profile and the tuned table merge in one place into the EffectiveConfig that the
// communicator runs on and Explain() prints. Each setting is built from every source it has; what
// runs (the attempts made against a failing op, the bound an op got, the backend built, where the
// flight record went) is checked against what Explain() prints, and a value that beat another
// source's names it. Ranks are threads; NCCL is the fault-injecting fake (tests/fake_nccl_api.h).
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/profile.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/communicator/communicator_factory.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"
#include "tests/profile_test_util.h"
#include "tests/scoped_env.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;
using testing::ScopedEnv;

std::string FreshDir() {
  char dir[] = "/tmp/adaptcomm_settings_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return dir;
}

// A profile of one tier whose `defaults` block is `body` (indented two spaces).
std::string WriteProfile(const std::string& body) {
  const std::string path = FreshDir() + "/settings.yaml";
  std::ofstream(path) << "schema: 1\ndefaults:\n"
                      << body << "tiers:\n  - name: test\n    params: any\n";
  return path;
}

// "settings.yaml:N", N the line of `path` that sets `key` to `value`: how Explain() names it.
std::string ProfileLine(const std::string& path, const std::string& key, const std::string& value) {
  const std::vector<std::string> parts = absl::StrSplit(key, '.');
  const std::string line =
      absl::StrCat(std::string(2 * parts.size(), ' '), parts.back(), ": ", value);
  std::vector<std::string> lines = absl::StrSplit(testing::ReadTextFile(path), '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i] == line) return absl::StrCat("settings.yaml:", i + 1);
  }
  ADD_FAILURE() << "'" << line << "' not in " << path;
  return "";
}

const SettingRecord* Row(const EffectiveConfig& cfg, const std::string& key) {
  for (const SettingRecord& s : cfg.settings) {
    if (s.key == key) return &s;
  }
  ADD_FAILURE() << "no row " << key;
  return nullptr;
}

// The row of `key` as Explain() prints it: "retry.max_attempts  1  API; settings.yaml:3 said 3".
std::string ExplainedSource(const SettingRecord& s) {
  return s.overridden.empty() ? s.source : absl::StrCat(s.source, "; ", s.overridden);
}

// A world-1 communicator on an in-process store.
absl::StatusOr<std::unique_ptr<Communicator>> CreateOne(CommunicatorOptions o) {
  o.rank = 0;
  o.world_size = 1;
  o.store = CreateHashStore();
  return Communicator::Create(o);
}

// One setting from every source it has. `text` of each source is what Explain() shows for it;
// `typed` reads the value the communicator runs on back as that text.
struct Case {
  std::string key;
  std::string yaml;          // under defaults: its section (unless the case before opened it)
  std::string profile_text;  // the value the profile gives
  const char* env = nullptr;
  std::string env_value, env_text;
  std::function<void(CommunicatorOptions&)> option;
  std::string option_text;
  std::function<std::string(const EffectiveConfig&)> typed;
};

std::vector<Case> Cases(const std::string& dir) {
  auto d = [](absl::Duration x) { return absl::FormatDuration(x); };
  return {
      {"timeouts.init", "    init: 40s\n", "40s", nullptr, "", "",
       [](CommunicatorOptions& o) { o.init_timeout = absl::Seconds(50); }, "50s",
       [d](const EffectiveConfig& c) { return d(c.timeouts.init); }},
      {"timeouts.collective", "    collective: 20s\n", "20s", nullptr, "", "",
       [](CommunicatorOptions& o) { o.timeout = absl::Seconds(15); }, "15s",
       [d](const EffectiveConfig& c) { return d(c.timeouts.collective); }},
      {"retry.max_attempts", "  retry:\n    max_attempts: 4\n", "4", nullptr, "", "",
       [](CommunicatorOptions& o) { o.max_retry_attempts = 2; }, "2",
       [](const EffectiveConfig& c) { return absl::StrCat(c.retry.max_attempts); }},
      {"retry.replay", "    replay: copy\n", "copy", nullptr, "", "",
       [](CommunicatorOptions& o) { o.replay = ReplayMode::kAuto; }, "auto",
       [](const EffectiveConfig& c) { return std::string(ReplayModeName(c.retry.replay)); }},
      {"retry.report_window", "    report_window: 3s\n", "3s", nullptr, "", "",
       [](CommunicatorOptions& o) { o.failure_report_window = absl::Seconds(4); }, "4s",
       [d](const EffectiveConfig& c) { return d(c.retry.report_window); }},
      {"backend.choice", "  backend:\n    choice: shm\n", "shm", nullptr, "", "",
       [](CommunicatorOptions& o) { o.backend = BackendChoice::kGloo; }, "gloo",
       [](const EffectiveConfig& c) { return std::string(BackendChoiceName(c.backend.choice)); }},
      {"backend.fallback", "    fallback: deny\n", "deny", nullptr, "", "",
       [](CommunicatorOptions& o) { o.fallback = Fallback::kAllow; }, "allow",
       [](const EffectiveConfig& c) { return c.backend.allow_fallback ? "allow" : "deny"; }},
      {"flight_recorder.dump_dir", absl::StrCat("  flight_recorder:\n    dump_dir: ", dir, "/p\n"),
       dir + "/p", "ADAPTCOMM_FLIGHT_RECORDER_DIR", dir + "/e", dir + "/e",
       [dir](CommunicatorOptions& o) { o.flight_recorder_dir = dir + "/o"; }, dir + "/o",
       [](const EffectiveConfig& c) { return c.flight_recorder.dump_dir; }},
      {"flight_recorder.entries", "    entries: 7\n", "7", nullptr, "", "",
       [](CommunicatorOptions& o) { o.flight_recorder_entries = 5; }, "5",
       [](const EffectiveConfig& c) { return absl::StrCat(c.flight_recorder.entries); }},
      {"debug.check_collectives", "  debug:\n    check_collectives: true\n", "true",
       "ADAPTCOMM_CHECK_COLLECTIVES", "0", "false",
       [](CommunicatorOptions& o) { o.check_collectives = true; }, "true",
       [](const EffectiveConfig& c) { return c.debug.check_collectives ? "true" : "false"; }},
      {"elastic.on_loss", "  elastic:\n    on_loss: shrink\n", "shrink", "ADAPTCOMM_ELASTIC",
       "wait_for_replacement", "wait_for_replacement",
       [](CommunicatorOptions& o) { o.elastic.on_loss = LossPolicy::kFail; }, "fail",
       [](const EffectiveConfig& c) { return c.elastic.on_loss; }},
      {"elastic.min_world_size", "    min_world_size: 2\n", "2", "ADAPTCOMM_ELASTIC_MIN_WORLD", "3",
       "3", [](CommunicatorOptions& o) { o.elastic.min_world_size = 1; }, "1",
       [](const EffectiveConfig& c) { return absl::StrCat(c.elastic.min_world_size); }},
      {"elastic.loss_window", "    loss_window: 2s\n", "2s", nullptr, "", "",
       [](CommunicatorOptions& o) { o.elastic.loss_window = absl::Seconds(3); }, "3s",
       [d](const EffectiveConfig& c) { return d(c.elastic.loss_window); }},
      {"elastic.replacement_timeout", "    replacement_timeout: 20s\n", "20s", nullptr, "", "",
       [](CommunicatorOptions& o) { o.elastic.replacement_timeout = absl::Seconds(30); }, "30s",
       [d](const EffectiveConfig& c) { return d(c.elastic.replacement_timeout); }},
      {"elastic.after_timeout", "    after_timeout: fail\n", "fail", nullptr, "", "",
       [](CommunicatorOptions& o) { o.elastic.after_timeout = LossPolicy::kShrink; }, "shrink",
       [](const EffectiveConfig& c) { return c.elastic.after_timeout; }},
      {"store.url", "  store:\n    url: redis://profile-host:1\n", "redis://profile-host:1",
       "ADAPTCOMM_STORE", "etcd://env-host:2", "etcd://env-host:2", nullptr, "",
       [](const EffectiveConfig& c) { return c.store.url; }},
      {"tuning.online.enabled", "  tuning:\n    online:\n      enabled: true\n", "true",
       "ADAPTCOMM_ONLINE_TUNING", "off", "false", nullptr, "",
       [](const EffectiveConfig& c) { return c.tuning.online.enabled ? "true" : "false"; }},
      {"trace.enabled", absl::StrCat("  trace:\n    enabled: true\n    dir: ", dir, "\n"), "true",
       "ADAPTCOMM_TRACE", "no", "false", nullptr, "",
       [](const EffectiveConfig& c) { return c.trace.enabled ? "true" : "false"; }},
  };
}

// Profile, then profile + environment, then all three: the highest source wins, names what it
// beat, and the communicator runs on the value Explain() prints.
TEST(Settings, EveryOptionFromEverySourceRunsAsExplained) {
  testing::ClearProfileEnvironment();
  const std::string dir = FreshDir();
  const std::vector<Case> cases = Cases(dir);
  // Each case opens its section or continues the one before it (the timeouts open here).
  std::string yaml = "  timeouts:\n    store_connect: 5s\n    heartbeat: 100s\n    abort: 10s\n";
  for (const Case& c : cases) absl::StrAppend(&yaml, c.yaml);
  const std::string profile = WriteProfile(yaml);
  for (int layers = 1; layers <= 3; ++layers) {
    SCOPED_TRACE(absl::StrCat(layers, " source(s)"));
    std::vector<std::unique_ptr<ScopedEnv>> env;
    CommunicatorOptions o;
    if (!profile.empty()) o.profile_file = profile;
    for (const Case& c : cases) {
      if (layers >= 2 && c.env != nullptr)
        env.push_back(std::make_unique<ScopedEnv>(c.env, c.env_value));
      if (layers >= 3 && c.option) c.option(o);
    }
    absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateOne(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    const EffectiveConfig& cfg = (*comm)->config();
    const std::string explained = (*comm)->Explain();
    for (const Case& c : cases) {
      SCOPED_TRACE(c.key);
      const SettingRecord* row = Row(cfg, c.key);
      ASSERT_NE(row, nullptr);
      const std::string at = ProfileLine(profile, c.key, c.profile_text);
      std::string want = c.profile_text, source = at, overridden;
      if (layers >= 2 && c.env != nullptr) {
        if (c.env_text != want) overridden = absl::StrCat(at, " said ", want);
        want = c.env_text;
        source = absl::StrCat("env ", c.env);
      }
      if (layers >= 3 && c.option) {
        if (c.option_text != want) {
          absl::StrAppend(&overridden, overridden.empty() ? "" : "; ", source, " said ", want);
        }
        want = c.option_text;
        source = "API";
      }
      EXPECT_EQ(row->value, want);
      EXPECT_EQ(row->source, source);
      EXPECT_EQ(row->overridden, overridden);
      // What runs: the typed value the communicator reads is the row's.
      EXPECT_EQ(c.typed(cfg), row->value);
      EXPECT_THAT(explained, HasSubstr(ExplainedSource(*row)));
    }
    // What runs, seen from outside: the backend built, and where the flight record goes.
    EXPECT_STREQ((*comm)->backend_name(), BackendChoiceName(cfg.backend.choice));
    absl::StatusOr<std::string> dumped = (*comm)->DumpFlightRecord("settings test");
    ASSERT_TRUE(dumped.ok()) << dumped.status();
    EXPECT_THAT(*dumped, HasSubstr(cfg.flight_recorder.dump_dir + "/"));
  }
}

// ---- what runs against a failing op: the attempts made and the bound applied ----

constexpr int kWorld = 2;
constexpr int kFailingRank = 1;

struct FailingRun {
  std::vector<std::string> explained = std::vector<std::string>(kWorld);
  std::vector<EffectiveConfig> config = std::vector<EffectiveConfig>(kWorld);
  std::vector<absl::Status> status = std::vector<absl::Status>(kWorld);
  std::vector<absl::Duration> took = std::vector<absl::Duration>(kWorld);
  std::vector<int> attempts = std::vector<int>(kWorld, -1);  // NCCL communicators made
};

// Every rank runs one device allreduce on NCCL (fallback deny: every rebuild is NCCL again) while
// rank kFailingRank's fake breaks every communicator it makes (`faults`). Each attempt after the
// first rebuilds the communicator, so a rank's NCCL inits are the attempts made.
FailingRun RunFailingOp(const std::string& profile, const FakeNcclFaults& faults,
                        const std::function<void(CommunicatorOptions&)>& options = nullptr) {
  const std::vector<std::shared_ptr<FakeNcclApi>> fakes =
      testing::FakesWithFailingRank(kWorld, kFailingRank, faults);
  FailingRun run;
  testing::RunRanks(
      testing::RankMode::kThreads, kWorld,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = env.options;
        if (!profile.empty()) o.profile_file = profile;
        o.backend = BackendChoice::kNccl;
        o.fallback = Fallback::kDeny;
        // Bounds for the rank whose op waits on the failing one when nothing retries.
        o.timeout = absl::Seconds(5);
        o.failure_report_window = absl::Seconds(1);
        if (options) options(o);
        auto comm = internal::CreateCommunicatorWith(o, testing::FakeSeams(fakes[env.rank]));
        ASSERT_TRUE(comm.ok()) << comm.status();
        const size_t r = static_cast<size_t>(env.rank);
        run.explained[r] = (*comm)->Explain();
        run.config[r] = (*comm)->config();
        std::vector<float> buf(64, 1.0f);
        const absl::Time start = absl::Now();
        run.status[r] = (*comm)
                            ->Allreduce(TensorView{buf.data(), 64, DType::kF32, Device::Cuda(0)})
                            .Synchronize(absl::Seconds(30));
        run.took[r] = absl::Now() - start;
      },
      absl::Seconds(60));
  for (int r = 0; r < kWorld; ++r) run.attempts[static_cast<size_t>(r)] = fakes[r]->init_calls();
  return run;
}

// Fast retries, no degrading: the attempts are all NCCL's. replay copy: an op outside a step is
// re-run only from a copy of its input (retry.replay auto would fail it at once).
std::string RetryProfile() {
  return WriteProfile(
      "  retry:\n    max_attempts: 3\n    replay: copy\n    initial_backoff: 10ms\n"
      "    max_backoff: 50ms\n");
}

// Every NCCL communicator of the failing rank reports an error at its first launch.
FakeNcclFaults BreaksEveryCommunicator() {
  return FakeNcclFaults{.async_error_at_launch = 1, .async_error_on_comm = 0};
}

void ExpectAttemptsAsExplained(const FailingRun& run, int want) {
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const EffectiveConfig& cfg = run.config[static_cast<size_t>(r)];
    EXPECT_EQ(cfg.retry.max_attempts, want);
    const SettingRecord* row = Row(cfg, "retry.max_attempts");
    ASSERT_NE(row, nullptr);
    EXPECT_EQ(row->value, absl::StrCat(want));
    EXPECT_FALSE(run.status[static_cast<size_t>(r)].ok());
    EXPECT_EQ(run.attempts[static_cast<size_t>(r)], want) << run.status[static_cast<size_t>(r)];
  }
}

TEST(Settings, AttemptsMadeAreTheProfilesWhenNothingElseSetsThem) {
  FailingRun run = RunFailingOp(RetryProfile(), BreaksEveryCommunicator());
  ExpectAttemptsAsExplained(run, 3);
}

TEST(Settings, AttemptsMadeAreTheOptionsOverTheProfile) {
  FailingRun run = RunFailingOp(RetryProfile(), BreaksEveryCommunicator(),
                                [](CommunicatorOptions& o) { o.max_retry_attempts = 2; });
  ExpectAttemptsAsExplained(run, 2);
  EXPECT_THAT(run.explained[0], HasSubstr("API; settings.yaml:4 said 3"));
}

// Regression: max_retry_attempts = 1 with the shipped profile (retry.max_attempts 3) turns retries
// off; Explain() says 1, from the option, and names the profile's 3 it beat.
TEST(Settings, OptionOfOneAttemptOverTheDefaultProfileShowsOneAndRetriesNothing) {
  testing::ClearProfileEnvironment();
  FailingRun run = RunFailingOp(testing::ConfigPath("profiles.yaml"), BreaksEveryCommunicator(),
                                [](CommunicatorOptions& o) { o.max_retry_attempts = 1; });
  ExpectAttemptsAsExplained(run, 1);
  EXPECT_THAT(run.explained[0], HasSubstr("said 3"));
  EXPECT_THAT(run.explained[0], HasSubstr("protection: off"));
}

// Regression: retry.max_attempts 1 with elastic.on_loss shrink ran two attempts (the membership
// vote needs one) while Explain() said 1; now it says 2 and why.
TEST(Settings, ElasticShrinkWithOneAttemptShowsTheTwoThatRun) {
  const std::string profile = WriteProfile(
      "  retry:\n    max_attempts: 1\n    initial_backoff: 10ms\n    max_backoff: 50ms\n"
      "  elastic:\n    on_loss: shrink\n    loss_window: 2s\n");
  FailingRun run = RunFailingOp(profile, BreaksEveryCommunicator());
  ExpectAttemptsAsExplained(run, 2);
  EXPECT_THAT(run.explained[0], HasSubstr("elastic.on_loss shrink"));
  EXPECT_THAT(run.explained[0], HasSubstr("settings.yaml:4 said 1"));
}

// The op bound that runs is the one Explain() prints: a device that never finishes the op fails
// it after timeouts.collective, from the option over the profile's.
TEST(Settings, OpTimeoutAppliedIsTheExplainedOne) {
  const std::string profile =
      WriteProfile("  retry:\n    max_attempts: 1\n  timeouts:\n    collective: 30s\n");
  FailingRun run =
      RunFailingOp(profile, FakeNcclFaults{.hang_at_launch = 1},
                   [](CommunicatorOptions& o) { o.timeout = absl::Milliseconds(400); });
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const EffectiveConfig& cfg = run.config[static_cast<size_t>(r)];
    EXPECT_EQ(cfg.timeouts.collective, absl::Milliseconds(400));
    const SettingRecord* row = Row(cfg, "timeouts.collective");
    ASSERT_NE(row, nullptr);
    EXPECT_EQ(row->value, "400ms");
    EXPECT_EQ(row->source, "API");
    EXPECT_EQ(row->overridden,
              absl::StrCat(ProfileLine(profile, "timeouts.collective", "30s"), " said 30s"));
    EXPECT_FALSE(run.status[static_cast<size_t>(r)].ok());
  }
  // Both ranks' ops wait on the hanging device under the same 400 ms bound: whichever watchdog
  // fires first fails its rank with DeadlineExceeded and its report fails the other, so at least
  // one rank timed out, after the explained bound and long before the profile's 30 s.
  EXPECT_TRUE(absl::IsDeadlineExceeded(run.status[0]) || absl::IsDeadlineExceeded(run.status[1]))
      << run.status[0] << " / " << run.status[1];
  EXPECT_GE(std::max(run.took[0], run.took[1]), absl::Milliseconds(400));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_LT(run.took[static_cast<size_t>(r)], absl::Seconds(10)) << "rank " << r;
  }
}

// ---- the three regressions that need no failing op ----

class IdleBackend final : public Backend {
 public:
  const char* name() const override { return "idle"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Capabilities capabilities() const override { return {}; }
  absl::Status Supports(const OpDesc&) const override { return absl::OkStatus(); }
  absl::Status Run(const OpDesc&) override { return absl::OkStatus(); }
  void Abort(const absl::Status&) override {}
  absl::Status health() const override { return absl::OkStatus(); }
};

// Regression: a communicator without a store (CreateWithBackend) has no coordinated retry; its
// report said 3.
TEST(Settings, CreateWithBackendShowsNoRetryAndSaysWhy) {
  testing::ClearProfileEnvironment();
  CommunicatorOptions o;
  o.profile_file = testing::ConfigPath("profiles.yaml");
  auto comm = Communicator::CreateWithBackend(std::make_unique<IdleBackend>(), o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->config().retry.max_attempts, 1);
  const SettingRecord* row = Row((*comm)->config(), "retry.max_attempts");
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->value, "1");
  EXPECT_THAT(row->source, HasSubstr("CreateWithBackend"));
  EXPECT_THAT(row->overridden, HasSubstr("said 3"));
  EXPECT_THAT((*comm)->Explain(), HasSubstr("protection: off"));
}

// Regression: the cross-rank check compares every effective setting, options included: ranks
// that differ only in an option fail creation on every rank, naming it.
TEST(Settings, RanksThatDifferInAnOptionFailTheConsistencyCheck) {
  testing::ClearProfileEnvironment();
  std::vector<absl::Status> created(kWorld);
  testing::RunRanks(testing::RankMode::kThreads, kWorld, [&](const testing::RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.profile_file = testing::ConfigPath("profiles.yaml");
    o.backend = BackendChoice::kGloo;
    o.init_timeout = absl::Seconds(20);
    o.elastic.min_world_size = env.rank + 1;
    created[static_cast<size_t>(env.rank)] = Communicator::Create(o).status();
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(absl::IsFailedPrecondition(created[r])) << created[r];
    EXPECT_THAT(created[r].message(), HasSubstr("elastic.min_world_size (2 vs 1)"));
  }
}

// ---- bad input ----

TEST(Settings, UnknownProfileKeyIsRefusedWithFileAndLine) {
  const std::string profile = WriteProfile("  retry:\n    max_attempt: 3\n");
  ProfileRequest req;
  req.file = profile;
  absl::StatusOr<EffectiveConfig> cfg = ResolveProfile(req);
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cfg.status().message(), HasSubstr("settings.yaml:4:"));
  EXPECT_THAT(cfg.status().message(), HasSubstr("max_attempt"));
}

TEST(Settings, BadEnvironmentValueIsRefusedNamingTheVariable) {
  testing::ClearProfileEnvironment();
  ScopedEnv env("ADAPTCOMM_ELASTIC", "sometimes");
  ProfileRequest req;
  req.file = WriteProfile("");
  absl::StatusOr<EffectiveConfig> cfg = ResolveProfile(req);
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.status().message(),
              HasSubstr("env ADAPTCOMM_ELASTIC: elastic.on_loss: must be one of"));
  req.overrides.after_timeout = LossPolicy::kWaitForReplacement;
  unsetenv("ADAPTCOMM_ELASTIC");
  cfg = ResolveProfile(req);
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.status().message(), HasSubstr("API: elastic.after_timeout: must be one of"));
}

}  // namespace
}  // namespace adaptcomm

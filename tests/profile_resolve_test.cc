// Tier selection, world scaling, precedence, the article's variables and validation errors.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/profile.h"
#include "gtest/gtest.h"
#include "lib/config/nccl_plan.h"
#include "lib/config/profile_loader.h"
#include "tests/profile_test_util.h"

namespace adaptcomm {
namespace {

using ::adaptcomm::testing::ClearProfileEnvironment;
using ::adaptcomm::testing::ConfigPath;
using ::adaptcomm::testing::ReadText;
using ::adaptcomm::testing::Registry;

class ProfileResolve : public ::testing::Test {
 protected:
  void SetUp() override { ClearProfileEnvironment(); }

  absl::StatusOr<EffectiveConfig> Resolve(const std::string& size, int world,
                                          const std::string& file = "profiles.yaml") {
    ProfileRequest req;
    if (!size.empty()) req.model_size = size;  // "": unset
    req.world_size = world;
    req.file = ConfigPath(file);
    return ResolveProfile(req);
  }
  // A profile given as text: the loader without files or environment.
  absl::StatusOr<EffectiveConfig> FromText(const std::string& text, uint64_t params = 0,
                                           int world = 8, bool strict = false) {
    config::ResolveInputs in;
    in.text = text;
    in.file = "test.yaml";
    in.model_params = params;
    in.world_size = world;
    in.strict = strict;
    return config::ResolveFromText(in, Registry());
  }
};

const SettingRecord* Find(const EffectiveConfig& c, const std::string& key) {
  for (const SettingRecord& s : c.settings) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

std::string AllWarnings(const EffectiveConfig& c) { return absl::StrJoin(c.warnings, "\n"); }

TEST_F(ProfileResolve, TiersByModelSize) {
  struct Case {
    const char* size;
    const char* tier;
    int collective_s;
  } cases[] = {{"3B", "small", 1200},   {"7B", "small", 1200},   {"7000000000", "small", 1200},
               {"30B", "medium", 2400}, {"70B", "medium", 2400}, {"99.9B", "medium", 2400},
               {"100B", "large", 3600}, {"235B", "large", 3600}, {"1.5T", "large", 3600}};
  for (const Case& c : cases) {
    auto cfg = Resolve(c.size, 8);
    ASSERT_TRUE(cfg.ok()) << c.size << ": " << cfg.status();
    EXPECT_EQ(cfg->tier, c.tier) << c.size;
    EXPECT_EQ(cfg->timeouts.collective, absl::Seconds(c.collective_s)) << c.size;
  }
  auto large = Resolve("235B", 8);
  ASSERT_TRUE(large.ok());
  std::map<std::string, std::string> nccl;
  for (const config::NcclSetting& s : config::NcclSettingsOf(*large)) nccl[s.name] = s.value;
  EXPECT_EQ(nccl["NCCL_MIN_CTAS"], "4");
  EXPECT_EQ(nccl["NCCL_MAX_CTAS"], "8");
  EXPECT_EQ(nccl["NCCL_BUFFSIZE"], "2097152");
  auto small = Resolve("7B", 8);
  ASSERT_TRUE(small.ok());
  for (const config::NcclSetting& s : config::NcclSettingsOf(*small))
    EXPECT_NE(s.name, "NCCL_BUFFSIZE");  // NCCL's default
  EXPECT_TRUE(small->warnings.empty()) << AllWarnings(*small);
}

TEST_F(ProfileResolve, GapGoesToNextLargerTier) {
  for (const char* size : {"8B", "20B", "29.9B"}) {
    auto cfg = Resolve(size, 8);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    EXPECT_EQ(cfg->tier, "medium") << size;
    ASSERT_FALSE(cfg->notes.empty());
    EXPECT_TRUE(absl::StrContains(cfg->notes[0], "using the next larger tier 'medium'"))
        << cfg->notes[0];
  }
}

TEST_F(ProfileResolve, SelectionByNameEnvAndDefault) {
  auto by_name = Resolve("large", 8);
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ(by_name->tier, "large");
  auto typo = Resolve("larg", 8);
  ASSERT_FALSE(typo.ok());
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(typo.status().message(), "did you mean 'large'?"));
  auto smallest = Resolve("", 8);
  ASSERT_TRUE(smallest.ok());
  EXPECT_EQ(smallest->tier, "small");
  setenv("ADAPTCOMM_MODEL_SIZE", "70B", 1);
  auto from_env = Resolve("", 8);
  unsetenv("ADAPTCOMM_MODEL_SIZE");
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(from_env->tier, "medium");
  EXPECT_EQ(from_env->model_params, 70000000000ULL);
  setenv("ADAPTCOMM_PROFILE", ConfigPath("templates/7b.yaml").c_str(), 1);
  ProfileRequest req;
  req.world_size = 8;
  auto from_profile_env = ResolveProfile(req);
  unsetenv("ADAPTCOMM_PROFILE");
  ASSERT_TRUE(from_profile_env.ok()) << from_profile_env.status();
  EXPECT_EQ(from_profile_env->tier, "optimized-7b");
}

// Unset is an empty std::optional; a field set to "" is a mistake, named, not the default.
TEST_F(ProfileResolve, RequestFieldSetButEmptyIsRefusedNamingIt) {
  for (const char* field : {"model_size", "file"}) {
    ProfileRequest req;
    req.world_size = 8;
    (std::string(field) == "file" ? req.file : req.model_size) = "";
    auto cfg = ResolveProfile(req);
    ASSERT_FALSE(cfg.ok()) << field;
    EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_TRUE(absl::StrContains(cfg.status().message(),
                                  absl::StrCat("ProfileRequest::", field, " is set but empty")))
        << cfg.status();
  }
  CommunicatorOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.model_size = "";
  o.store = CreateHashStore();
  auto comm = Communicator::Create(o);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
  EXPECT_TRUE(absl::StrContains(comm.status().message(),
                                "CommunicatorOptions::model_size is set but empty"))
      << comm.status();
}

TEST_F(ProfileResolve, WorldScalingIsMonotoneAndCapped) {
  EXPECT_DOUBLE_EQ(config::WorldScalingFactor(1, 8, 0.25, 3), 1.0);
  EXPECT_DOUBLE_EQ(config::WorldScalingFactor(8, 8, 0.25, 3), 1.0);
  EXPECT_DOUBLE_EQ(config::WorldScalingFactor(16, 8, 0.25, 3), 1.25);
  EXPECT_DOUBLE_EQ(config::WorldScalingFactor(64, 8, 0.25, 3), 1.75);
  EXPECT_DOUBLE_EQ(config::WorldScalingFactor(512, 8, 0.25, 3), 2.5);
  EXPECT_DOUBLE_EQ(config::WorldScalingFactor(1 << 20, 8, 0.25, 3), 3.0);
  double prev = 0;
  for (int w = 1; w <= 100000; w += (w < 64 ? 1 : w / 7)) {
    double f = config::WorldScalingFactor(w, 8, 0.25, 3);
    EXPECT_GE(f, prev) << "world " << w;
    EXPECT_LE(f, 3.0);
    prev = f;
  }
  auto cfg = Resolve("70B", 64);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->timeouts.collective_base, absl::Seconds(2400));
  EXPECT_EQ(cfg->timeouts.collective, absl::Seconds(4200));
  EXPECT_EQ(cfg->timeouts.heartbeat, absl::Seconds(6300));
  EXPECT_EQ(cfg->gloo.timeout, absl::Seconds(4200));
  absl::Duration last = absl::ZeroDuration();
  for (int w : {1, 8, 9, 16, 64, 512, 4096, 1 << 20}) {
    auto c = Resolve("235B", w);
    ASSERT_TRUE(c.ok());
    EXPECT_GE(c->timeouts.collective, last) << w;
    last = c->timeouts.collective;
  }
  EXPECT_EQ(last, absl::Seconds(3 * 3600));
}

TEST_F(ProfileResolve, ShortApiTimeoutsPullTheStoreBoundDownVisibly) {
  ProfileRequest req;
  req.model_size = "7B";
  req.world_size = 2;
  req.file = ConfigPath("profiles.yaml");
  req.overrides.collective_timeout = absl::Seconds(2);
  auto cfg = ResolveProfile(req);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->timeouts.store_connect, absl::Seconds(1));
  EXPECT_EQ(Find(*cfg, "timeouts.store_connect")->source, "API (follows the API timeouts)");
  req.overrides.collective_timeout.reset();
  req.overrides.init_timeout = absl::Seconds(7);
  cfg = ResolveProfile(req);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->timeouts.store_connect, absl::Seconds(7));
  // A store bound the API set itself is still checked, not adjusted.
  req.overrides.store_connect_timeout = absl::Seconds(30);
  EXPECT_EQ(ResolveProfile(req).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ProfileResolve, ApiBeatsProfileAndIsNotScaled) {
  ProfileRequest req;
  req.model_size = "235B";
  req.world_size = 512;
  req.file = ConfigPath("profiles.yaml");
  req.overrides.collective_timeout = absl::Seconds(5000);
  req.overrides.backend = BackendChoice::kGloo;
  req.overrides.nccl_min_ctas = 2;
  req.overrides.nccl_buffer_size = 8 << 20;
  req.overrides.max_retry_attempts = 5;
  auto cfg = ResolveProfile(req);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->timeouts.collective, absl::Seconds(5000));
  EXPECT_EQ(cfg->timeouts.world_factor, 1.0);
  EXPECT_EQ(cfg->backend.choice, BackendChoice::kGloo);
  EXPECT_EQ(cfg->retry.max_attempts, 5);
  EXPECT_EQ(Find(*cfg, "timeouts.collective")->source, "API");
  EXPECT_EQ(Find(*cfg, "backend.choice")->value, "gloo");
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_MIN_CTAS")->value, "2");
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_MIN_CTAS")->source, "API");
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_BUFFSIZE")->value, "8388608");
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_MAX_CTAS")->source, "profiles.yaml:83");

  req.overrides = {};
  req.overrides.nccl_env["NCCL_IB_MTU"] = "4096";
  auto dead = ResolveProfile(req);
  ASSERT_FALSE(dead.ok());
  EXPECT_TRUE(absl::StrContains(dead.status().message(), "NCCL_IB_MTU: never read by NCCL"));
}

TEST_F(ProfileResolve, ExportedVariableWinsUnlessForced) {
  setenv("NCCL_IB_HCA", "mlx5_2", 1);
  setenv("NCCL_IB_TC", "41", 1);
  auto cfg = Resolve("7B", 8);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_IB_HCA")->value, "mlx5_2");
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_IB_HCA")->source, "env NCCL_IB_HCA");
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_IB_TC")->value, "41");

  const std::string forced = R"(
infrastructure:
  env:
    NCCL_IB_HCA: {value: mlx5_0, force: true}
    NCCL_IB_TC: 106
tiers:
  - name: only
)";
  config::ResolveInputs in;
  in.text = forced;
  in.file = "forced.yaml";
  in.user_env = {{"NCCL_IB_HCA", "mlx5_2"}, {"NCCL_IB_TC", "41"}};
  auto f = config::ResolveFromText(in, Registry());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Find(*f, "nccl.NCCL_IB_HCA")->value, "mlx5_0");
  EXPECT_EQ(Find(*f, "nccl.NCCL_IB_HCA")->source, "forced.yaml:4");
  EXPECT_EQ(Find(*f, "nccl.NCCL_IB_TC")->value, "41");
  EXPECT_EQ(Find(*f, "nccl.NCCL_IB_TC")->source, "env NCCL_IB_TC");
  unsetenv("NCCL_IB_HCA");
  unsetenv("NCCL_IB_TC");
}

// An image's NCCL_VERSION is neither a warning nor a setting handed to NCCL; a profile that names
// it is told it is no setting, with file:line.
TEST_F(ProfileResolve, ImageMetadataIsNeitherWarnedAboutNorApplied) {
  config::ResolveInputs in;
  in.text = "infrastructure:\n  env:\n    NCCL_VERSION: 2.28.3-1\ntiers:\n  - name: only\n";
  in.file = "image.yaml";
  in.user_env = {{"NCCL_VERSION", "2.28.3-1"}, {"NCCL_IB_TC", "41"}};
  auto cfg = config::ResolveFromText(in, Registry());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_VERSION"), nullptr);
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_IB_TC")->value, "41");
  ASSERT_EQ(cfg->warnings.size(), 1u) << AllWarnings(*cfg);
  EXPECT_EQ(cfg->warnings[0],
            "image.yaml:3:5: NCCL_VERSION is not an NCCL setting (exported by NVIDIA's CUDA and "
            "PyTorch container images to name the NCCL they ship; NCCL never reads it); dropped");
}

TEST_F(ProfileResolve, ArticleListWarnsAndTranslates) {
  auto cfg = Resolve("235B", 8, "templates/article.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const std::string w = AllWarnings(*cfg);
  EXPECT_EQ(cfg->warnings.size(), 4u) << w;
  EXPECT_TRUE(absl::StrContains(w,
                                "article.yaml:13:5: NCCL_IBEXT_DISABLE is read only by the "
                                "Mellanox SHARP plugin"))
      << w;
  EXPECT_TRUE(
      absl::StrContains(w,
                        "article.yaml:17:5: NCCL_IB_MTU is never read by NCCL (the IB MTU is "
                        "negotiated from the ports' active MTU); dropped"))
      << w;
  EXPECT_TRUE(
      absl::StrContains(w,
                        "article.yaml:35:7: NCCL_MAX_RINGS is never read by NCCL (read by no "
                        "NCCL version; the old name was NCCL_MAX_NRINGS); dropped; "
                        "did you mean NCCL_MAX_CTAS?"))
      << w;
  EXPECT_TRUE(absl::StrContains(w,
                                "NCCL_MIN_NRINGS is a deprecated alias of NCCL_MIN_CTAS since "
                                "NCCL 2.17: using NCCL_MIN_CTAS=4 (ncclConfig_t.minCTAs)"))
      << w;
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_MIN_CTAS")->value, "4");
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_IB_MTU"), nullptr);
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_MAX_RINGS"), nullptr);
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_MAX_CTAS"), nullptr);  // dropped, not guessed
  EXPECT_EQ(Find(*cfg, "nccl.NCCL_IBEXT_DISABLE")->value, "1");
}

TEST_F(ProfileResolve, StrictModeRefusesDeadVariables) {
  ProfileRequest req;
  req.model_size = "235B";
  req.world_size = 8;
  req.file = ConfigPath("templates/article.yaml");
  req.strict = true;
  auto cfg = ResolveProfile(req);
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(cfg.status().message(), "NCCL_IB_MTU")) << cfg.status();
  EXPECT_TRUE(absl::StrContains(cfg.status().message(), "NCCL_MAX_RINGS")) << cfg.status();
  req.strict = false;
  setenv("ADAPTCOMM_PROFILE_STRICT", "1", 1);
  auto env_strict = ResolveProfile(req);
  unsetenv("ADAPTCOMM_PROFILE_STRICT");
  EXPECT_EQ(env_strict.status().code(), absl::StatusCode::kFailedPrecondition);
  // The shipped profiles pass strict mode.
  req.file = ConfigPath("profiles.yaml");
  req.strict = true;
  for (const char* size : {"7B", "70B", "235B"}) {
    req.model_size = size;
    EXPECT_TRUE(ResolveProfile(req).ok()) << size;
  }
}

// backend.intra_host / backend.hierarchical (#13): defaults keep shared memory and the hierarchy;
// the profile can forbid each, with its file:line as the source; a bad value names the key.
TEST_F(ProfileResolve, IntraHostAndHierarchicalKeys) {
  auto defaults = FromText("tiers:\n  - name: only\n");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_TRUE(defaults->backend.intra_host_shm);
  EXPECT_TRUE(defaults->backend.hierarchical);
  EXPECT_EQ(Find(*defaults, "backend.intra_host")->value, "shm");

  auto off = FromText(
      "defaults:\n  backend:\n    intra_host: gloo\n    hierarchical: off\n"
      "tiers:\n  - name: only\n");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->backend.intra_host_shm);
  EXPECT_FALSE(off->backend.hierarchical);
  EXPECT_EQ(Find(*off, "backend.intra_host")->source, "test.yaml:3");
  EXPECT_EQ(Find(*off, "backend.hierarchical")->source, "test.yaml:4");

  auto bad = FromText("defaults:\n  backend:\n    intra_host: tcp\ntiers:\n  - name: only\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "test.yaml:3")) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "intra_host")) << bad.status();
}

// retry.in_flight: how many device ops may be in flight with coordinated retry on (their records
// cost device memory); 8 unless the profile says otherwise.
TEST_F(ProfileResolve, RetryWindowDefaultsToEightAndComesFromTheProfile) {
  auto defaults = FromText("tiers:\n  - name: only\n");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->retry.in_flight, 8);
  EXPECT_EQ(Find(*defaults, "retry.in_flight")->source, "default");
  auto set = FromText("defaults:\n  retry:\n    in_flight: 32\ntiers:\n  - name: only\n");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->retry.in_flight, 32);
  EXPECT_EQ(Find(*set, "retry.in_flight")->source, "test.yaml:3");
}

// retry.record_bytes: the device memory those records may hold; 1 GiB unless the profile says
// otherwise, in the profile's units.
TEST_F(ProfileResolve, RetryRecordBudgetDefaultsToOneGibAndComesFromTheProfile) {
  auto defaults = FromText("tiers:\n  - name: only\n");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->retry.record_bytes, uint64_t{1} << 30);
  EXPECT_EQ(Find(*defaults, "retry.record_bytes")->source, "default");
  auto set = FromText("defaults:\n  retry:\n    record_bytes: 256MiB\ntiers:\n  - name: only\n");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->retry.record_bytes, uint64_t{256} << 20);
  EXPECT_EQ(Find(*set, "retry.record_bytes")->source, "test.yaml:3");
}

// buckets.bytes: the gradient bucketer's bucket size; 25 MiB unless the profile (or a tier) says
// otherwise, in the profile's units.
TEST_F(ProfileResolve, BucketSizeDefaultsTo25MibAndComesFromTheTier) {
  auto defaults = FromText("tiers:\n  - name: only\n");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->buckets.bytes, uint64_t{25} << 20);
  EXPECT_EQ(Find(*defaults, "buckets.bytes")->source, "default");
  auto set = FromText("tiers:\n  - name: only\n    buckets:\n      bytes: 100MiB\n");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->buckets.bytes, uint64_t{100} << 20);
  EXPECT_EQ(Find(*set, "buckets.bytes")->source, "test.yaml:4");
}

TEST_F(ProfileResolve, TemplatesLoad) {
  for (const char* t : {"templates/3b.yaml", "templates/7b.yaml", "templates/30b.yaml"}) {
    auto cfg = Resolve("", 8, t);
    ASSERT_TRUE(cfg.ok()) << t << ": " << cfg.status();
    EXPECT_TRUE(cfg->warnings.empty()) << t << ": " << AllWarnings(*cfg);
  }
  EXPECT_EQ(Resolve("", 8, "templates/7b.yaml")->timeouts.collective, absl::Seconds(1200));
  EXPECT_EQ(Resolve("", 8, "templates/30b.yaml")->timeouts.collective, absl::Seconds(2400));
}

struct BadCase {
  const char* name;
  const char* text;
  const char* message;  // exact expected status message
};

TEST_F(ProfileResolve, BrokenFilesNameLineAndColumn) {
  const BadCase cases[] = {
      {"unknown key", "tiers:\n  - name: a\n    timeouts:\n      colective: 5s\n",
       "test.yaml:4:7: unknown key 'timeouts.colective' (did you mean 'collective'?) (at "
       "'colective')"},
      {"unknown section", "defualts:\n  timeouts: {}\ntiers: [{name: a}]\n",
       "test.yaml:1:1: unknown top-level key 'defualts' (did you mean 'defaults'?) (at "
       "'defualts')"},
      {"wrong type", "defaults:\n  timeouts:\n    collective: [1, 2]\ntiers: [{name: a}]\n",
       "test.yaml:3:17: timeouts.collective must be a single value, not a list (at '[1, 2]')"},
      {"no unit", "defaults:\n  timeouts:\n    collective: 1200\ntiers: [{name: a}]\n",
       "test.yaml:3:17: timeouts.collective: duration '1200' has no unit: write e.g. 1200s (at "
       "'1200')"},
      {"ctas range", "tiers:\n  - name: a\n    nccl:\n      NCCL_MAX_CTAS: 65\n",
       "test.yaml:4:22: NCCL_MAX_CTAS=65 is outside 1..64 (at '65')"},
      {"traffic class", "infrastructure:\n  env:\n    NCCL_IB_TC: 300\ntiers: [{name: a}]\n",
       "test.yaml:3:17: NCCL_IB_TC=300 is outside 0..255 (at '300')"},
      {"zero timeout", "defaults:\n  timeouts:\n    init: 0s\ntiers: [{name: a}]\n",
       "test.yaml:3:11: timeouts.init: must be positive (at '0s')"},
      {"overlap",
       "tiers:\n  - name: a\n    params: \"<=10B\"\n  - name: b\n    params: \"5B-20B\"\n",
       "test.yaml:5:13: tier 'b' (5B-20B) overlaps tier 'a' (<=10B) (at '5B-20B')"},
      {"unordered",
       "tiers:\n  - name: big\n    params: \">=100B\"\n  - name: small\n    params: \"<=7B\"\n",
       "test.yaml:5:13: tier 'small' (<=7B) must come before tier 'big' (>=100B): list tiers from "
       "smallest to largest (at '<=7B')"},
      {"syntax", "tiers:\n  - name: a\n    timeouts: {collective: 5s\n",
       "test.yaml:4:1: YAML error: end of map flow not found"},
      {"bad size", "tiers:\n  - name: a\n    params: \"<=7Q\"\n",
       "test.yaml:3:13: model size '7Q': unknown suffix 'Q' (use K, M, B or T, e.g. 7B, 1.5T) (at "
       "'<=7Q')"},
      {"retry window", "defaults:\n  retry:\n    in_flight: 0\ntiers: [{name: a}]\n",
       "test.yaml:3:16: retry.in_flight: 0 is outside 1..256 (at '0')"},
      {"retry record budget", "defaults:\n  retry:\n    record_bytes: 2GeB\ntiers: [{name: a}]\n",
       "test.yaml:3:19: retry.record_bytes: size '2GeB': unknown unit 'GeB' (use B, KiB, MiB, GiB, "
       "KB, MB or GB) (at '2GeB')"},
      {"bucket size", "defaults:\n  buckets:\n    bytes: 1KiB\ntiers: [{name: a}]\n",
       "test.yaml:3:12: buckets.bytes: 1024 is outside 4096..1099511627776 (at '1KiB')"},
      {"bucket unit", "defaults:\n  buckets:\n    bytes: 25MeB\ntiers: [{name: a}]\n",
       "test.yaml:3:12: buckets.bytes: size '25MeB': unknown unit 'MeB' (use B, KiB, MiB, GiB, "
       "KB, MB or GB) (at '25MeB')"},
      {"buffsize", "tiers:\n  - name: a\n    nccl:\n      NCCL_BUFFSIZE: 2MeB\n",
       "test.yaml:4:22: NCCL_BUFFSIZE: size '2MeB': unknown unit 'MeB' (use B, KiB, MiB, GiB, KB, "
       "MB or GB) (at '2MeB')"},
  };
  for (const BadCase& c : cases) {
    auto cfg = FromText(c.text);
    ASSERT_FALSE(cfg.ok()) << c.name;
    EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(std::string(cfg.status().message()), c.message) << c.name;
  }
}

// yaml-cpp keeps both copies of a repeated key; the loader used the first `name` but the last
// `collective`. Any repeated key is refused, naming the key and both positions.
TEST_F(ProfileResolve, DuplicateKeysAreRefusedNamingBothLines) {
  const BadCase cases[] = {
      {"tier name", "tiers:\n  - name: a\n    name: b\n",
       "test.yaml:3:5: duplicate key 'name' (first at test.yaml:2:5): a key may appear only once "
       "in a map"},
      {"nested timeout",
       "defaults:\n  timeouts:\n    collective: 5s\n    init: 60s\n    collective: 9s\n"
       "tiers: [{name: a}]\n",
       "test.yaml:5:5: duplicate key 'collective' (first at test.yaml:3:5): a key may appear only "
       "once in a map"},
      {"top level", "tiers: [{name: a}]\ndefaults: {}\ntiers: [{name: b}]\n",
       "test.yaml:3:1: duplicate key 'tiers' (first at test.yaml:1:1): a key may appear only once "
       "in a map"},
      {"flow map", "tiers:\n  - {name: a, nccl: {NCCL_MAX_CTAS: 4, NCCL_MAX_CTAS: 8}}\n",
       "test.yaml:2:40: duplicate key 'NCCL_MAX_CTAS' (first at test.yaml:2:22): a key may appear "
       "only once in a map"},
  };
  for (const BadCase& c : cases) {
    auto cfg = FromText(c.text);
    ASSERT_FALSE(cfg.ok()) << c.name;
    EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(std::string(cfg.status().message()), c.message) << c.name;
  }
  // The same key in two different maps is no duplicate.
  auto two_maps =
      FromText("tiers:\n  - name: a\n    params: \"<=7B\"\n  - name: b\n    params: \">=8B\"\n");
  EXPECT_TRUE(two_maps.ok()) << two_maps.status();
}

// Aliases share their anchor's node: the check visits each map once, so 40 levels of doubling
// aliases (2^40 nodes when expanded) are checked in no time, and a duplicate inside an aliased
// map is still found at its own position.
TEST_F(ProfileResolve, DuplicateKeyCheckVisitsAliasedNodesOnce) {
  std::string doubling = "defaults:\n  description: x\n  n0: &n0 [1]\n";
  for (int i = 1; i <= 40; ++i) {
    absl::StrAppend(&doubling, "  n", i, ": &n", i, " [*n", i - 1, ", *n", i - 1, "]\n");
  }
  config::ResolveInputs in;
  in.text = doubling + "tiers: [{name: a}]\n";
  in.file = "test.yaml";
  in.world_size = 8;
  // The loader refuses the unknown keys n0..n40; what matters is that it returns.
  EXPECT_FALSE(config::ResolveFromText(in, Registry()).ok());
  auto aliased = FromText("x: &m {a: 1, a: 2}\ntiers: [{name: a, timeouts: *m}]\n");
  ASSERT_FALSE(aliased.ok());
  EXPECT_EQ(aliased.status().message(),
            "test.yaml:1:14: duplicate key 'a' (first at test.yaml:1:8): a key may appear only "
            "once in a map");
}

TEST_F(ProfileResolve, InvertedTimeoutsNameBothValues) {
  auto cfg = FromText(
      "defaults:\n  timeouts:\n    collective: 2400s\n    heartbeat: 1800s\ntiers: [{name: a}]\n");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().message(),
            "timeouts out of order: timeouts.collective 2400s (test.yaml:3:17) must be shorter "
            "than timeouts.heartbeat 1800s (test.yaml:4:16); required: store_connect < collective "
            "< heartbeat");
  auto store = FromText(
      "defaults:\n  timeouts:\n    store_connect: 20min\n    collective: 10min\ntiers: [{name: "
      "a}]\n");
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::StrContains(store.status().message(),
                                "timeouts.store_connect 1200s (test.yaml:3:20) must be shorter "
                                "than timeouts.collective 600s (test.yaml:4:17)"))
      << store.status();
  auto ctas = FromText("tiers:\n  - name: a\n    nccl: {NCCL_MIN_CTAS: 8, NCCL_MAX_CTAS: 4}\n");
  ASSERT_FALSE(ctas.ok());
  EXPECT_EQ(ctas.status().message(),
            "NCCL_MIN_CTAS=8 (test.yaml:3:27) is greater than NCCL_MAX_CTAS=4 (test.yaml:3:45)");
}

TEST_F(ProfileResolve, WarnsOnOddBufferAndUnknownName) {
  auto cfg = FromText("tiers:\n  - name: a\n    nccl: {NCCL_BUFFSIZE: 3MiB, NCCL_IB_HAC: mlx5}\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const std::string w = AllWarnings(*cfg);
  EXPECT_TRUE(absl::StrContains(w, "NCCL_BUFFSIZE=3145728 is not a power of two")) << w;
  EXPECT_TRUE(absl::StrContains(w,
                                "test.yaml:3:33: NCCL_IB_HAC is unknown to NCCL (did you mean "
                                "NCCL_IB_HCA?)"))
      << w;
  auto strict = FromText("tiers:\n  - name: a\n    nccl: {NCCL_IB_HAC: mlx5}\n", 0, 8, true);
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ProfileResolve, MissingFileIsNotFound) {
  auto cfg = Resolve("7B", 8, "does-not-exist.yaml");
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kNotFound);
  auto world = Resolve("7B", 0);
  EXPECT_EQ(world.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adaptcomm

// NCCL application: ncclConfig_t fields by NCCL version, and the process environment by
// precedence (the user's exports survive unless forced; read-once conflicts are reported).
#include <cstdlib>

#include "absl/strings/match.h"
#include "adaptcomm/profile.h"
#include "gtest/gtest.h"
#include "lib/config/nccl_plan.h"
#include "lib/config/profile_loader.h"
#include "lib/config/resolve_internal.h"
#include "tests/profile_test_util.h"

namespace adaptcomm {
namespace {

using ::adaptcomm::config::ApplyNcclEnvironment;
using ::adaptcomm::config::NcclEnvReport;
using ::adaptcomm::config::NcclEnvVar;
using ::adaptcomm::config::NcclPlan;
using ::adaptcomm::config::PlanNccl;
using ::adaptcomm::testing::ClearProfileEnvironment;
using ::adaptcomm::testing::Registry;

EffectiveConfig Load(const std::string& text, std::map<std::string, std::string> user_env = {},
                     ProfileOverrides overrides = {}) {
  config::ResolveInputs in;
  in.text = text;
  in.file = "apply.yaml";
  in.user_env = std::move(user_env);
  in.overrides = std::move(overrides);
  auto cfg = config::ResolveFromText(in, Registry());
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return cfg.ok() ? *cfg : EffectiveConfig();
}

const char kProfile[] = R"(
infrastructure:
  env:
    NCCL_IB_HCA: mlx5
    NCCL_IB_TC: 106
tiers:
  - name: t
    nccl:
      NCCL_MIN_CTAS: 4
      NCCL_MAX_CTAS: 8
      NCCL_CTA_POLICY: 1
      NCCL_COMM_BLOCKING: 0
      NCCL_BUFFSIZE: 2MiB
)";

std::vector<std::string> Names(const std::vector<NcclEnvVar>& env) {
  std::vector<std::string> out;
  for (const NcclEnvVar& v : env) out.push_back(v.name + "=" + v.value);
  return out;
}

class ProfileApply : public ::testing::Test {
 protected:
  void SetUp() override {
    ClearProfileEnvironment();
    config::ResetAppliedEnvForTest();
  }
  void TearDown() override { ClearProfileEnvironment(); }
};

TEST_F(ProfileApply, NewNcclTakesEveryConfigField) {
  NcclPlan plan = PlanNccl(Load(kProfile), 22809);  // 2.28.9
  EXPECT_EQ(plan.config.min_ctas, 4);
  EXPECT_EQ(plan.config.max_ctas, 8);
  EXPECT_EQ(plan.config.traffic_class, 106);
  EXPECT_EQ(plan.config.cta_policy, 1);
  EXPECT_EQ(plan.config.blocking, 0);
  EXPECT_FALSE(plan.config.nvls_ctas.has_value());
  EXPECT_EQ(Names(plan.env),
            (std::vector<std::string>{"NCCL_BUFFSIZE=2097152", "NCCL_IB_HCA=mlx5"}));
  EXPECT_TRUE(plan.notes.empty());
}

TEST_F(ProfileApply, OlderNcclGetsEnvForMissingFields) {
  NcclPlan plan = PlanNccl(Load(kProfile), 22105);  // 2.21.5: no trafficClass, no CTAPolicy
  EXPECT_EQ(plan.config.min_ctas, 4);
  EXPECT_FALSE(plan.config.traffic_class.has_value());
  EXPECT_FALSE(plan.config.cta_policy.has_value());
  EXPECT_EQ(Names(plan.env), (std::vector<std::string>{"NCCL_BUFFSIZE=2097152", "NCCL_CTA_POLICY=1",
                                                       "NCCL_IB_HCA=mlx5", "NCCL_IB_TC=106"}));
  ASSERT_EQ(plan.notes.size(), 2u);
  EXPECT_EQ(plan.notes[1],
            "NCCL 2.21.5 lacks ncclConfig_t.trafficClass (added in 2.26): NCCL_IB_TC=106 goes to "
            "the process environment instead");
  NcclPlan old = PlanNccl(Load(kProfile), 21606);  // 2.16: no minCTAs/maxCTAs
  EXPECT_FALSE(old.config.min_ctas.has_value());
  EXPECT_EQ(old.config.blocking, 0);
  EXPECT_EQ(old.env.size(), 6u);
}

TEST_F(ProfileApply, UserExportIsKeptUnlessForced) {
  setenv("NCCL_IB_HCA", "mlx5_3", 1);
  // The loader sees the export: the setting is the user's and nothing needs setting.
  EffectiveConfig cfg = Load(kProfile, {{"NCCL_IB_HCA", "mlx5_3"}});
  NcclEnvReport r = ApplyNcclEnvironment(cfg, 22809);
  EXPECT_STREQ(std::getenv("NCCL_IB_HCA"), "mlx5_3");
  EXPECT_EQ(r.set, (std::vector<std::string>{"NCCL_BUFFSIZE=2097152"}));
  EXPECT_STREQ(std::getenv("NCCL_BUFFSIZE"), "2097152");

  // Even a config resolved without the export (stale) must not overwrite it.
  config::ResetAppliedEnvForTest();
  unsetenv("NCCL_BUFFSIZE");
  NcclEnvReport stale = ApplyNcclEnvironment(Load(kProfile), 22809);
  EXPECT_STREQ(std::getenv("NCCL_IB_HCA"), "mlx5_3");
  EXPECT_EQ(stale.kept_user, (std::vector<std::string>{"NCCL_IB_HCA=mlx5_3"}));

  // force: true in the profile overwrites it.
  config::ResetAppliedEnvForTest();
  EffectiveConfig forced = Load(
      "infrastructure:\n  env:\n    NCCL_IB_HCA: {value: mlx5_0, force: true}\ntiers: [{name: "
      "t}]\n",
      {{"NCCL_IB_HCA", "mlx5_3"}});
  NcclEnvReport f = ApplyNcclEnvironment(forced, 22809);
  EXPECT_STREQ(std::getenv("NCCL_IB_HCA"), "mlx5_0");
  EXPECT_EQ(f.set, (std::vector<std::string>{"NCCL_IB_HCA=mlx5_0"}));
}

TEST_F(ProfileApply, ApiBeatsExportEvenWhereEnvOverridesConfig) {
  setenv("NCCL_MIN_CTAS", "2", 1);
  ProfileOverrides o;
  o.nccl_min_ctas = 6;
  EffectiveConfig cfg = Load(kProfile, {{"NCCL_MIN_CTAS", "2"}}, o);
  NcclPlan plan = PlanNccl(cfg, 22809);
  EXPECT_EQ(plan.config.min_ctas, 6);
  // NCCL would let the exported NCCL_MIN_CTAS=2 override minCTAs: it must be rewritten too.
  ApplyNcclEnvironment(cfg, 22809);
  EXPECT_STREQ(std::getenv("NCCL_MIN_CTAS"), "6");
}

TEST_F(ProfileApply, LaterDifferentReadOnceValueWarns) {
  EffectiveConfig first = Load(kProfile);
  NcclEnvReport a = ApplyNcclEnvironment(first, 22809);
  EXPECT_EQ(a.set.size(), 2u);
  EXPECT_TRUE(a.conflicts.empty());
  // The same profile again: nothing to do, no warning.
  NcclEnvReport same = ApplyNcclEnvironment(first, 22809);
  EXPECT_TRUE(same.set.empty());
  EXPECT_TRUE(same.conflicts.empty());
  // A variable adaptcomm set does not count as a user export on the next resolve.
  EXPECT_TRUE(config::SetByAdaptcomm("NCCL_BUFFSIZE", "2097152"));
  EffectiveConfig second = Load("tiers:\n  - name: t\n    nccl: {NCCL_BUFFSIZE: 8MiB}\n");
  NcclEnvReport b = ApplyNcclEnvironment(second, 22809);
  ASSERT_EQ(b.conflicts.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(b.conflicts[0],
                               "NCCL_BUFFSIZE: this profile wants 8388608 but "
                               "2097152 was already set"))
      << b.conflicts[0];
  EXPECT_STREQ(std::getenv("NCCL_BUFFSIZE"), "2097152");
}

}  // namespace
}  // namespace adaptcomm

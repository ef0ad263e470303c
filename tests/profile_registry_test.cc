#include "gtest/gtest.h"
#include "lib/config/nccl_registry.h"
#include "tests/profile_test_util.h"

namespace adaptcomm::config {
namespace {

using ::adaptcomm::testing::Registry;

TEST(NcclRegistry, ArticleFactsAreData) {
  const NcclRegistry& reg = Registry();
  ASSERT_GE(reg.params().size(), 40u);

  const NcclParam* min_nrings = reg.Lookup("NCCL_MIN_NRINGS");
  ASSERT_NE(min_nrings, nullptr);
  EXPECT_EQ(min_nrings->status, ParamStatus::kDeprecated);
  const NcclParam* min_ctas = reg.Canonical("NCCL_MIN_NRINGS");
  ASSERT_NE(min_ctas, nullptr);
  EXPECT_EQ(min_ctas->name, "NCCL_MIN_CTAS");
  EXPECT_EQ(min_ctas->config_field, "minCTAs");
  EXPECT_EQ(min_ctas->config_since, 21700);
  EXPECT_EQ(*min_ctas->min, 1);
  EXPECT_EQ(*min_ctas->max, 64);
  EXPECT_TRUE(min_ctas->env_overrides_config);

  const NcclParam* max_rings = reg.Lookup("NCCL_MAX_RINGS");
  ASSERT_NE(max_rings, nullptr);
  EXPECT_EQ(max_rings->status, ParamStatus::kNeverRead);
  EXPECT_EQ(reg.DidYouMean("NCCL_MAX_RINGS"), "NCCL_MAX_CTAS");

  const NcclParam* mtu = reg.Lookup("NCCL_IB_MTU");
  ASSERT_NE(mtu, nullptr);
  EXPECT_EQ(mtu->status, ParamStatus::kNeverRead);
  EXPECT_NE(reg.Describe("NCCL_IB_MTU").find("never read by NCCL"), std::string::npos);

  // NVIDIA's container images export NCCL_VERSION (seen: NCCL_VERSION=2.28.3-1 on an H200 image).
  const NcclParam* version = reg.Lookup("NCCL_VERSION");
  ASSERT_NE(version, nullptr);
  EXPECT_EQ(version->status, ParamStatus::kMetadata);
  EXPECT_NE(reg.Describe("NCCL_VERSION").find("NCCL_VERSION: not an NCCL setting: exported by"),
            std::string::npos)
      << reg.Describe("NCCL_VERSION");

  const NcclParam* ibext = reg.Lookup("NCCL_IBEXT_DISABLE");
  ASSERT_NE(ibext, nullptr);
  EXPECT_EQ(ibext->status, ParamStatus::kPluginOnly);

  const NcclParam* buffsize = reg.Lookup("NCCL_BUFFSIZE");
  ASSERT_NE(buffsize, nullptr);
  EXPECT_EQ(buffsize->default_value, "4194304");

  EXPECT_EQ(reg.Lookup("NCCL_IB_TC")->config_field, "trafficClass");
  EXPECT_EQ(reg.Lookup("NCCL_IB_TC")->config_since, 22600);
  EXPECT_EQ(reg.Lookup("NCCL_CTA_POLICY")->config_since, 22700);
  EXPECT_EQ(reg.Lookup("NCCL_NVLS_NCHANNELS")->config_field, "nvlsCTAs");
  EXPECT_EQ(reg.Lookup("NCCL_COMM_BLOCKING")->config_field, "blocking");
  EXPECT_FALSE(reg.Lookup("NCCL_COMM_BLOCKING")->per_process);
}

TEST(NcclRegistry, DidYouMean) {
  const NcclRegistry& reg = Registry();
  EXPECT_EQ(reg.DidYouMean("NCCL_IB_HAC"), "NCCL_IB_HCA");
  EXPECT_EQ(reg.DidYouMean("NCCL_BUFSIZE"), "NCCL_BUFFSIZE");
  // A typo near a deprecated name points at the current one.
  EXPECT_EQ(reg.DidYouMean("NCCL_MIN_NCHANELS"), "NCCL_MIN_CTAS");
  EXPECT_EQ(reg.DidYouMean("NCCL_COMPLETELY_DIFFERENT_THING"), "");
  EXPECT_EQ(reg.Lookup("NCCL_NOT_A_THING"), nullptr);
  EXPECT_NE(reg.Describe("NCCL_IB_HAC").find("did you mean NCCL_IB_HCA"), std::string::npos);
}

TEST(NcclRegistry, NormalizeChecksTypeAndRange) {
  const NcclRegistry& reg = Registry();
  EXPECT_EQ(*reg.Normalize(*reg.Lookup("NCCL_BUFFSIZE"), "2MiB"), "2097152");
  EXPECT_EQ(*reg.Normalize(*reg.Lookup("NCCL_MIN_CTAS"), "4"), "4");
  EXPECT_EQ(reg.Normalize(*reg.Lookup("NCCL_MIN_CTAS"), "65").status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(reg.Normalize(*reg.Lookup("NCCL_MIN_CTAS"), "0").status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(reg.Normalize(*reg.Lookup("NCCL_IB_TC"), "256").status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*reg.Normalize(*reg.Lookup("NCCL_IB_TC"), "255"), "255");
  EXPECT_EQ(*reg.Normalize(*reg.Lookup("NCCL_P2P_DISABLE"), "false"), "0");
  EXPECT_FALSE(reg.Normalize(*reg.Lookup("NCCL_P2P_LEVEL"), "FAR").ok());
  EXPECT_FALSE(reg.Normalize(*reg.Lookup("NCCL_MIN_CTAS"), "four").ok());
}

TEST(NcclRegistry, BrokenRegistryNamesPosition) {
  auto r = NcclRegistry::Parse("params:\n  NCCL_X:\n    status: curent\n", "reg.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(
      r.status().message(),
      "reg.yaml:3:13: status must be current, deprecated, never_read, plugin_only or metadata "
      "(at 'curent')");
  auto dangling = NcclRegistry::Parse(
      "params:\n  NCCL_A:\n    status: deprecated\n    alias_of: NCCL_B\n", "reg.yaml");
  ASSERT_FALSE(dangling.ok());
  EXPECT_NE(dangling.status().message().find("NCCL_B, which has no entry"), std::string::npos);
  auto unknown = NcclRegistry::Parse("params:\n  NCCL_A:\n    stauts: current\n", "reg.yaml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("reg.yaml:3:5: unknown registry field 'stauts' (did "
                                            "you mean 'status'?)"),
            std::string::npos)
      << unknown.status();
}

TEST(NcclRegistry, DuplicateKeysAreRefused) {
  auto dup = NcclRegistry::Parse(
      "params:\n  NCCL_A:\n    status: current\n    status: deprecated\n", "reg.yaml");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().message(),
            "reg.yaml:4:5: duplicate key 'status' (first at reg.yaml:3:5): a key may appear only "
            "once in a map");
  // The shipped registry has none.
  EXPECT_TRUE(NcclRegistry::Load(::adaptcomm::testing::ConfigPath("nccl_params.yaml")).ok());
}

TEST(NcclRegistry, VersionCodes) {
  EXPECT_EQ(NcclVersionCode("2.17"), 21700);
  EXPECT_EQ(NcclVersionCode("2.27.3"), 22703);
  EXPECT_EQ(NcclVersionCode("2"), 0);
  EXPECT_EQ(NcclVersionCode("2.x"), 0);
  EXPECT_EQ(NcclVersionText(22600), "2.26");
  EXPECT_EQ(NcclVersionText(22809), "2.28.9");
}

}  // namespace
}  // namespace adaptcomm::config

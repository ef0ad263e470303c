// Golden `profile explain` reports for the three tiers and the gap. After an intended change,
// regenerate with ADAPTCOMM_UPDATE_GOLDEN=1 and review the diff.
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "adaptcomm/profile.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/profile_test_util.h"

namespace adaptcomm {
namespace {

using ::adaptcomm::testing::ClearProfileEnvironment;
using ::adaptcomm::testing::ConfigPath;
using ::adaptcomm::testing::ReadText;
using ::adaptcomm::testing::SourceDir;

struct Golden {
  const char* model;
  int world;
  const char* file;
};

// Printed in failure messages (and by ctest's listing) instead of the struct's bytes.
void PrintTo(const Golden& g, std::ostream* os) {
  *os << g.model << " on " << g.world << " ranks vs " << g.file;
}

class ProfileGolden : public ::testing::TestWithParam<Golden> {};

TEST_P(ProfileGolden, ExplainMatches) {
  ClearProfileEnvironment();
  const Golden& g = GetParam();
  ProfileRequest req;
  req.model_size = g.model;
  req.world_size = g.world;
  req.file = ConfigPath("profiles.yaml");
  auto cfg = ResolveProfile(req);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  // The absolute path differs between checkouts.
  std::string text = absl::StrReplaceAll(cfg->Explain(), {{SourceDir() + "/", ""}});
  const std::string path = absl::StrCat(SourceDir(), "/tests/golden/", g.file);
  const char* update = std::getenv("ADAPTCOMM_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(path) << text;
  }
  EXPECT_EQ(text, ReadText(path)) << "regenerate with ADAPTCOMM_UPDATE_GOLDEN=1 if intended";

  // The JSON form carries the same rows and hash.
  nlohmann::json j = nlohmann::json::parse(cfg->ExplainJson());
  ASSERT_EQ(j["settings"].size(), cfg->settings.size());
  for (size_t i = 0; i < cfg->settings.size(); ++i) {
    EXPECT_EQ(j["settings"][i]["key"], cfg->settings[i].key);
    EXPECT_EQ(j["settings"][i]["value"], cfg->settings[i].value);
    EXPECT_EQ(j["settings"][i]["source"], cfg->settings[i].source);
  }
  EXPECT_EQ(j["tier"], cfg->tier);
  EXPECT_EQ(j["world_size"], g.world);
}

// Readable test names ("Tiers/ProfileGolden.ExplainMatches/model_70b_64ranks"): without a
// generator gtest names a struct parameter by its bytes.
std::string GoldenName(const ::testing::TestParamInfo<Golden>& info) {
  return absl::StrCat("model_", absl::AsciiStrToLower(info.param.model), "_", info.param.world,
                      "ranks");
}

INSTANTIATE_TEST_SUITE_P(Tiers, ProfileGolden,
                         ::testing::Values(Golden{"7B", 8, "explain_7b_w8.txt"},
                                           Golden{"20B", 8, "explain_20b_w8.txt"},
                                           Golden{"70B", 64, "explain_70b_w64.txt"},
                                           Golden{"235B", 512, "explain_235b_w512.txt"}),
                         GoldenName);

}  // namespace
}  // namespace adaptcomm

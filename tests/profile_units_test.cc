#include "gtest/gtest.h"
#include "lib/base/byte_text.h"
#include "lib/config/units.h"

namespace adaptcomm::config {
namespace {

TEST(ProfileUnits, ModelSizes) {
  struct Case {
    const char* text;
    uint64_t params;
  } cases[] = {{"7B", 7000000000ULL},       {"235B", 235000000000ULL},
               {"1.5T", 1500000000000ULL},  {"7000000000", 7000000000ULL},
               {"70b", 70000000000ULL},     {"500M", 500000000ULL},
               {" 3B ", 3000000000ULL},     {"0.5B", 500000000ULL},
               {"1.25T", 1250000000000ULL}, {"13.7B", 13700000000ULL}};
  for (const Case& c : cases) {
    auto v = ParseModelSize(c.text);
    ASSERT_TRUE(v.ok()) << c.text << ": " << v.status();
    EXPECT_EQ(*v, c.params) << c.text;
  }
  for (const char* bad : {"", "7X", "B", "0", "0B", "1.5", "-7B", "7BB", "1.2.3B", "abc",
                          "99999999999T", "1.0000000000001B"}) {
    EXPECT_FALSE(ParseModelSize(bad).ok()) << bad;
  }
  EXPECT_EQ(FormatModelSize(7000000000ULL), "7B");
  EXPECT_EQ(FormatModelSize(1500000000000ULL), "1.5T");
  EXPECT_EQ(FormatModelSize(235000000000ULL), "235B");
  EXPECT_EQ(FormatModelSize(7000000001ULL), "7000000001");
}

TEST(ProfileUnits, Durations) {
  EXPECT_EQ(*ParseDuration("1200s"), absl::Seconds(1200));
  EXPECT_EQ(*ParseDuration("40min"), absl::Minutes(40));
  EXPECT_EQ(*ParseDuration("2h"), absl::Hours(2));
  EXPECT_EQ(*ParseDuration("500ms"), absl::Milliseconds(500));
  EXPECT_EQ(*ParseDuration("1.5s"), absl::Milliseconds(1500));
  auto bare = ParseDuration("1200");
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(bare.status().message().find("write e.g. 1200s"), absl::string_view::npos);
  for (const char* bad : {"", "s", "12parsecs", "1e400s", "400d", "-5s", "99999h"}) {
    EXPECT_FALSE(ParseDuration(bad).ok()) << bad;
  }
  EXPECT_EQ(DurationText(absl::Minutes(40)), "2400s");
  EXPECT_EQ(DurationText(absl::Milliseconds(1500)), "1500ms");
}

TEST(ProfileUnits, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("2MiB"), 2097152u);
  EXPECT_EQ(*ParseByteSize("4194304"), 4194304u);
  EXPECT_EQ(*ParseByteSize("1.5KiB"), 1536u);
  EXPECT_EQ(*ParseByteSize("1GiB"), 1073741824u);
  EXPECT_EQ(*ParseByteSize("2MB"), 2000000u);
  for (const char* bad : {"", "2XB", "1.3B", "MiB", "2 mib", "-1"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
}

// Sizes in messages ("64 MiB") and in names ("two-phase/64KiB", "ring/seg 4MiB"): one spelling,
// which the byte-size parser reads back.
TEST(ProfileUnits, ByteSizeTexts) {
  EXPECT_EQ(ByteSizeText(64 << 20), "64 MiB");
  EXPECT_EQ(ByteSizeText(3072), "3 KiB");
  EXPECT_EQ(ByteSizeText(1000), "1000 B");
  EXPECT_EQ(ByteSizeText(0), "0 B");
  EXPECT_EQ(CompactByteSizeText(4096), "4KiB");
  EXPECT_EQ(CompactByteSizeText(16 << 20), "16MiB");
  EXPECT_EQ(CompactByteSizeText(uint64_t{1} << 30), "1GiB");
  EXPECT_EQ(CompactByteSizeText(1536), "1536B");
  EXPECT_EQ(CompactByteSizeText(12), "12B");
  for (uint64_t bytes : {uint64_t{12}, uint64_t{1536}, uint64_t{4096}, uint64_t{16} << 20,
                         uint64_t{1} << 30, uint64_t{3} << 30}) {
    absl::StatusOr<uint64_t> parsed = ParseByteSize(CompactByteSizeText(bytes));
    ASSERT_TRUE(parsed.ok()) << CompactByteSizeText(bytes) << ": " << parsed.status();
    EXPECT_EQ(*parsed, bytes) << CompactByteSizeText(bytes);
  }
}

TEST(ProfileUnits, Scalars) {
  EXPECT_EQ(*ParseInt("-3"), -3);
  EXPECT_FALSE(ParseInt("3x").ok());
  EXPECT_TRUE(*ParseBool("yes"));
  EXPECT_FALSE(*ParseBool("0"));
  EXPECT_FALSE(ParseBool("maybe").ok());
  EXPECT_DOUBLE_EQ(*ParseDouble("0.25"), 0.25);
  EXPECT_FALSE(ParseDouble("nan").ok());
}

}  // namespace
}  // namespace adaptcomm::config

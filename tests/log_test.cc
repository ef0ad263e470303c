// Log lines' rank tag: a process that is one rank tags every thread's lines with it; a process
// running several ranks as threads (bench --ranks N, tests) tags each rank thread's lines with
// its own rank, and no rank's creation re-tags the lines of the other threads (the store
// server's, other ranks' helpers) with that rank.
#include "lib/base/log.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace adaptcomm::log {
namespace {

using ::testing::StartsWith;

class LogTest : public ::testing::Test {
 protected:
  // The sink opens ADAPTCOMM_LOG_FILE once per process: every test of this binary shares the
  // file and reads only what was written after it started.
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/log_test_", getpid(), ".log");
    setenv("ADAPTCOMM_LOG_FILE", path_.c_str(), 1);
    SetProcessRank(-1);
    Flush();
    std::ifstream in(path_, std::ios::ate);
    start_ = in ? static_cast<std::streamoff>(in.tellg()) : 0;
  }
  std::vector<std::string> Lines() {
    Flush();
    std::ifstream in(path_);
    in.seekg(start_);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  std::string path_;
  std::streamoff start_ = 0;
};

TEST_F(LogTest, OneRankProcessTagsEveryThread) {
  SetProcessRank(3);
  std::thread([] { ADAPTCOMM_LOG(kError, "helper thread"); }).join();
  ASSERT_EQ(Lines().size(), 1u);
  EXPECT_THAT(Lines()[0], StartsWith("[adaptcomm r3 E "));
}

TEST_F(LogTest, RanksAsThreadsTagOnlyTheirOwnLines) {
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([r] {
      ScopedThreadRank tag(r);
      SetProcessRank(r);  // as Communicator::Create does for its rank
      ADAPTCOMM_LOG(kError, "rank thread");
    });
    ranks.back().join();  // rank 1 is created last
  }
  std::thread([] { ADAPTCOMM_LOG(kError, "store server"); }).join();
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[0], StartsWith("[adaptcomm r0 E "));
  EXPECT_THAT(lines[1], StartsWith("[adaptcomm r1 E "));
  EXPECT_THAT(lines[2], StartsWith("[adaptcomm r? E "));  // was r1
}

}  // namespace
}  // namespace adaptcomm::log

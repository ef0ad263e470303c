// The 3D-parallel example under the launcher (8 ranks: tensor 2 x pipeline 2 x data 2) ends with
// the weights of single-process training of the same model on the same data.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace {

TEST(Parallel3d, EightRanksTensorPipelineDataMatchSingleProcessTraining) {
  const std::string bin = adaptcomm::testing::BuildDir();
  const std::string dir = ::testing::TempDir();
  const std::string dist = dir + "/parallel3d_weights.txt";
  const std::string ref = dir + "/parallel3d_reference.txt";
  const std::string init = dir + "/parallel3d_init.txt";
  const std::string log = dir + "/parallel3d_out.txt";
  std::remove(dist.c_str());
  const std::string example = bin + "/examples/adaptcomm_parallel3d";
  ASSERT_EQ(adaptcomm::testing::RunShell(
                absl::StrCat(bin, "/tools/adaptcomm launch -n 8 --timeout 120 -- ", example,
                             " --steps 60 --out ", dist, " > ", log, " 2>&1")),
            0)
      << adaptcomm::testing::ReadTextFile(log);
  ASSERT_EQ(adaptcomm::testing::RunShell(absl::StrCat(
                example, " --reference --shards 2 --steps 60 --out ", ref, " > /dev/null")),
            0);
  ASSERT_EQ(adaptcomm::testing::RunShell(
                absl::StrCat(example, " --reference --steps 0 --out ", init, " > /dev/null")),
            0);
  const std::vector<double> a = adaptcomm::testing::ReadNumbers(dist),
                            b = adaptcomm::testing::ReadNumbers(ref),
                            c = adaptcomm::testing::ReadNumbers(init);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), c.size());
  ASSERT_GT(a.size(), 800u);
  // The demo's tolerance: the split layers add their partial sums in another order than the
  // reference's one sum, and the data group averages two shard gradients; 60 steps of such
  // rounding differences stay far below 1e-4.
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << "weight " << i;
  double moved = 0;
  for (size_t i = 0; i < a.size(); ++i) moved = std::max(moved, std::abs(a[i] - c[i]));
  EXPECT_GT(moved, 1e-2);  // training happened
  const std::string text = adaptcomm::testing::ReadTextFile(log);
  EXPECT_NE(text.find("tensor 2 x pipeline 2 x data 2"), std::string::npos) << text;
  EXPECT_NE(text.find("step 60 loss"), std::string::npos) << text;
}

}  // namespace

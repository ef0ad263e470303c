// The demo trainer under the launcher (4 ranks) ends with the weights of single-process training
// on the same data.
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

std::vector<double> ReadWeights(const std::string& path) {
  std::vector<double> w;
  std::ifstream in(path);
  double v;
  while (in >> v) w.push_back(v);
  return w;
}

int RunCommand(const std::string& command) {
  int rc = std::system(command.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(Demo, FourRankTrainingMatchesSingleProcess) {
  const std::string bin = adaptcomm::testing::BuildDir();
  const std::string dir = ::testing::TempDir();
  const std::string dist = dir + "/demo_weights_4ranks.txt";
  const std::string ref = dir + "/demo_weights_reference.txt";
  std::remove(dist.c_str());
  ASSERT_EQ(RunCommand(absl::StrCat(bin, "/tools/adaptcomm launch -n 4 --timeout 120 -- ", bin,
                                    "/examples/adaptcomm_trainer --steps 100 --out ", dist, " > ",
                                    dir, "/demo_out.txt 2>&1")),
            0);
  ASSERT_EQ(
      RunCommand(absl::StrCat(bin, "/examples/adaptcomm_trainer --reference --shards 4 --steps 100",
                              " --out ", ref, " > /dev/null")),
      0);
  std::vector<double> a = ReadWeights(dist), b = ReadWeights(ref);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 1000u);
  // Float tolerance: the allreduce sums the 4 shard gradients in ring order, the reference in
  // rank order; 100 steps of such rounding differences stay far below 1e-4.
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << "weight " << i;
  // Training happened: the weights moved from their initial values (the 0-step run).
  const std::string init = dir + "/demo_weights_init.txt";
  ASSERT_EQ(RunCommand(
                absl::StrCat(bin, "/examples/adaptcomm_trainer --reference --steps 1 --lr 0 --out ",
                             init, " > /dev/null")),
            0);
  std::vector<double> c = ReadWeights(init);
  double moved = 0;
  for (size_t i = 0; i < a.size(); ++i) moved = std::max(moved, std::abs(a[i] - c[i]));
  EXPECT_GT(moved, 1e-2);
  std::ifstream out(dir + "/demo_out.txt");
  std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  // auto without a usable GPU, every rank on this host: the shared-memory backend.
  EXPECT_NE(text.find("backend shm"), std::string::npos) << text;
  EXPECT_NE(text.find("step 100 loss"), std::string::npos) << text;
}

}  // namespace

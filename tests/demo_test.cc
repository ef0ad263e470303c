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

TEST(Demo, FourRankTrainingMatchesSingleProcess) {
  const std::string bin = adaptcomm::testing::BuildDir();
  const std::string dir = ::testing::TempDir();
  const std::string dist = dir + "/demo_weights_4ranks.txt";
  const std::string ref = dir + "/demo_weights_reference.txt";
  std::remove(dist.c_str());
  ASSERT_EQ(adaptcomm::testing::RunShell(
                absl::StrCat(bin, "/tools/adaptcomm launch -n 4 --timeout 120 -- ", bin,
                             "/examples/adaptcomm_trainer --steps 100 --out ", dist, " > ", dir,
                             "/demo_out.txt 2>&1")),
            0);
  ASSERT_EQ(adaptcomm::testing::RunShell(
                absl::StrCat(bin, "/examples/adaptcomm_trainer --reference --shards 4 --steps 100",
                             " --out ", ref, " > /dev/null")),
            0);
  std::vector<double> a = adaptcomm::testing::ReadNumbers(dist),
                      b = adaptcomm::testing::ReadNumbers(ref);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 1000u);
  // Float tolerance: the allreduce sums the 4 shard gradients in ring order, the reference in
  // rank order; 100 steps of such rounding differences stay far below 1e-4.
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << "weight " << i;
  // Training happened: the weights moved from their initial values (the 0-step run).
  const std::string init = dir + "/demo_weights_init.txt";
  ASSERT_EQ(adaptcomm::testing::RunShell(
                absl::StrCat(bin, "/examples/adaptcomm_trainer --reference --steps 1 --lr 0 --out ",
                             init, " > /dev/null")),
            0);
  std::vector<double> c = adaptcomm::testing::ReadNumbers(init);
  double moved = 0;
  for (size_t i = 0; i < a.size(); ++i) moved = std::max(moved, std::abs(a[i] - c[i]));
  EXPECT_GT(moved, 1e-2);
  std::ifstream out(dir + "/demo_out.txt");
  std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  // auto without a usable GPU, every rank on this host: the shared-memory backend.
  EXPECT_NE(text.find("backend shm"), std::string::npos) << text;
  EXPECT_NE(text.find("step 100 loss"), std::string::npos) << text;
}

// A rank stopped for 15 s inside step 50 (SIGSTOP, then SIGCONT from a helper process): its peer
// times out (8 s op timeout), every rank recovers and redoes the step from the model before it,
// and the weights are byte-identical to those of a fault-free run with the same settings.
TEST(Demo, RankStoppedForFifteenSecondsRedoesTheStepWithIdenticalWeights) {
  const std::string bin = adaptcomm::testing::BuildDir();
  const std::string dir = ::testing::TempDir();
  const std::string profile = dir + "/demo_stop_profile.yaml";
  std::ofstream(profile) << "schema: 1\n"
                         << "defaults:\n"
                         << "  timeouts:\n"
                         << "    store_connect: 5s\n"
                         << "    collective: 8s\n"
                         << "    heartbeat: 120s\n"
                         << "  retry:\n"
                         << "    initial_backoff: 100ms\n"
                         << "    max_backoff: 1s\n"
                         << "tiers:\n"
                         << "  - name: test\n"
                         << "    params: any\n";
  auto run = [&](const std::string& name, const std::string& flags) {
    const std::string out = absl::StrCat(dir, "/demo_", name, ".txt");
    std::remove(out.c_str());
    EXPECT_EQ(adaptcomm::testing::RunShell(
                  absl::StrCat("ADAPTCOMM_PROFILE=", profile, " ", bin,
                               "/tools/adaptcomm launch -n 2 --timeout 120 -- ", bin,
                               "/examples/adaptcomm_trainer --steps 100 --out ", out, " ", flags,
                               " > ", dir, "/demo_", name, ".log 2>&1")),
              0)
        << name;
    std::ifstream in(out, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string clean = run("clean", "");
  const std::string stopped = run("stopped", "--stop-rank 1 --stop-step 50 --stop-seconds 15");
  ASSERT_GT(clean.size(), 1000u);
  EXPECT_TRUE(clean == stopped) << "weights differ after the redone step";
  std::ifstream log(dir + "/demo_stopped.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("1 step(s) redone"), std::string::npos) << text;
  EXPECT_NE(text.find("step 50: redone"), std::string::npos) << text;
}

double FinalLoss(const std::string& text) {
  const size_t at = text.rfind("step 100 loss ");
  return at == std::string::npos ? -1.0 : std::atof(text.c_str() + at + 14);
}

// #14 item 5: under `adaptcomm launch --elastic`, `victim` of 4 ranks dies (SIGKILL) at step 30;
// the other 3 redo that step on the new membership and finish. The launcher exits 0 and says so in
// its last line; the final loss and weights match a fault-free 3-rank run (the elastic step sums
// gradient x shard size, so the full-data gradient does not depend on the world size). Rank 0 is
// no exception: the launcher serves the store, and rank 1 at creation becomes rank 0.
void ElasticKillOneOfFourFinishesOnThree(int victim) {
  const std::string bin = adaptcomm::testing::BuildDir();
  const std::string dir = ::testing::TempDir();
  const std::string tag = absl::StrCat("kill", victim);
  const std::string elastic = absl::StrCat(dir, "/demo_weights_elastic_", tag, ".txt");
  const std::string three = absl::StrCat(dir, "/demo_weights_3ranks_", tag, ".txt");
  const std::string elastic_out = absl::StrCat(dir, "/demo_elastic_", tag, ".txt");
  const std::string three_out = absl::StrCat(dir, "/demo_three_", tag, ".txt");
  std::remove(elastic.c_str());
  std::remove(three.c_str());
  const std::string trainer = bin + "/examples/adaptcomm_trainer --elastic --steps 100";
  ASSERT_EQ(
      adaptcomm::testing::RunShell(absl::StrCat(
          bin, "/tools/adaptcomm launch --elastic -n 4 --timeout 120 -- ", trainer, " --kill-rank ",
          victim, " --kill-step 30 --out ", elastic, " > ", elastic_out, " 2>&1")),
      0)
      << adaptcomm::testing::ReadTextFile(elastic_out);
  ASSERT_EQ(adaptcomm::testing::RunShell(
                absl::StrCat(bin, "/tools/adaptcomm launch -n 3 --timeout 120 -- ", trainer,
                             " --out ", three, " > ", three_out, " 2>&1")),
            0);
  const std::string text = adaptcomm::testing::ReadTextFile(elastic_out);
  EXPECT_NE(text.find("finished on 3 ranks (1 membership change(s), 1 step(s) redone)"),
            std::string::npos)
      << text;
  const size_t last = text.rfind("adaptcomm launch: ");
  ASSERT_NE(last, std::string::npos) << text;
  EXPECT_EQ(text.substr(last).find(absl::StrCat(
                "adaptcomm launch: job finished with 3 of 4 ranks (elastic; lost: rank ", victim,
                " (pid ")),
            0u)
      << text;
  const std::string text3 = adaptcomm::testing::ReadTextFile(three_out);
  const double a = FinalLoss(text), b = FinalLoss(text3);
  ASSERT_GT(a, 0) << text;
  ASSERT_GT(b, 0) << text3;
  EXPECT_NEAR(a, b, 1e-4 * b);
  std::vector<double> wa = adaptcomm::testing::ReadNumbers(elastic),
                      wb = adaptcomm::testing::ReadNumbers(three);
  ASSERT_EQ(wa.size(), wb.size());
  ASSERT_GT(wa.size(), 1000u);
  for (size_t i = 0; i < wa.size(); ++i) ASSERT_NEAR(wa[i], wb[i], 1e-4) << "weight " << i;
}

TEST(Demo, ElasticKillOneOfFourFinishesOnThreeLikeAFaultFreeThreeRankRun) {
  ElasticKillOneOfFourFinishesOnThree(2);
}

TEST(Demo, ElasticKillRankZeroOfFourFinishesOnThreeLikeAFaultFreeThreeRankRun) {
  ElasticKillOneOfFourFinishesOnThree(0);
}

// #14 item 5 with --max-restarts 1: `victim` of 4 dies at step 30, the other 3 shrink and redo the
// step, the launcher restarts it as a replacement, the members admit it at the end of a step and
// rank 0 broadcasts the next step and the weights to it: the job finishes on 4, the launcher says
// so in its last line, and the final loss and weights match a fault-free 4-rank run. For rank 0,
// the rank that admits the replacement and sends it the state is rank 1 at creation.
void ElasticReplacementJoinsAndFinishesOnFour(int victim) {
  const std::string bin = adaptcomm::testing::BuildDir();
  const std::string dir = ::testing::TempDir();
  const std::string tag = absl::StrCat("restart", victim);
  const std::string restarted = absl::StrCat(dir, "/demo_weights_", tag, ".txt");
  const std::string four = absl::StrCat(dir, "/demo_weights_elastic4_", tag, ".txt");
  const std::string restarted_out = absl::StrCat(dir, "/demo_", tag, ".txt");
  const std::string four_out = absl::StrCat(dir, "/demo_four_", tag, ".txt");
  std::remove(restarted.c_str());
  std::remove(four.c_str());
  const std::string trainer = bin + "/examples/adaptcomm_trainer --elastic --steps 100";
  ASSERT_EQ(adaptcomm::testing::RunShell(absl::StrCat(
                bin, "/tools/adaptcomm launch --elastic --max-restarts 1 -n 4 --timeout 120 -- ",
                trainer, " --kill-rank ", victim, " --kill-step 30 --out ", restarted, " > ",
                restarted_out, " 2>&1")),
            0)
      << adaptcomm::testing::ReadTextFile(restarted_out);
  ASSERT_EQ(adaptcomm::testing::RunShell(
                absl::StrCat(bin, "/tools/adaptcomm launch -n 4 --timeout 120 -- ", trainer,
                             " --out ", four, " > ", four_out, " 2>&1")),
            0);
  const std::string text = adaptcomm::testing::ReadTextFile(restarted_out);
  EXPECT_NE(text.find(absl::StrCat("[rank ", victim,
                                   "] replacement: joined as rank 3 of 4, going on at step ")),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("finished on 4 ranks (2 membership change(s), 1 step(s) redone)"),
            std::string::npos)
      << text;
  const size_t last = text.rfind("adaptcomm launch: ");
  ASSERT_NE(last, std::string::npos) << text;
  EXPECT_EQ(text.substr(last).find(absl::StrCat("adaptcomm launch: job finished with 4 of 4 ranks "
                                                "(elastic; 1 restart(s) of 1: rank ",
                                                victim, " ")),
            0u)
      << text;
  const std::string text4 = adaptcomm::testing::ReadTextFile(four_out);
  const double a = FinalLoss(text), b = FinalLoss(text4);
  ASSERT_GT(a, 0) << text;
  ASSERT_GT(b, 0) << text4;
  EXPECT_NEAR(a, b, 1e-4 * b);
  std::vector<double> wa = adaptcomm::testing::ReadNumbers(restarted),
                      wb = adaptcomm::testing::ReadNumbers(four);
  ASSERT_EQ(wa.size(), wb.size());
  ASSERT_GT(wa.size(), 1000u);
  for (size_t i = 0; i < wa.size(); ++i) ASSERT_NEAR(wa[i], wb[i], 1e-4) << "weight " << i;
}

TEST(Demo, ElasticReplacementJoinsAndFinishesOnFourLikeAFaultFreeFourRankRun) {
  ElasticReplacementJoinsAndFinishesOnFour(2);
}

TEST(Demo, ElasticReplacementOfRankZeroJoinsAndFinishesOnFourLikeAFaultFreeFourRankRun) {
  ElasticReplacementJoinsAndFinishesOnFour(0);
}

}  // namespace

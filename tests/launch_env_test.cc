// Rank, world size, master address and CUDA device from the launchers' variables: torchrun first,
// then OpenMPI, then Slurm; bad values are named; nothing set is NotFound with what to do.
#include <stdlib.h>

#include <string>

#include "adaptcomm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;

class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override { Clear(); }
  void TearDown() override { Clear(); }
  static void Clear() {
    for (const char* v :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "ADAPTCOMM_MASTER_ADDR", "ADAPTCOMM_MASTER_PORT", "OMPI_COMM_WORLD_RANK",
          "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
          "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
          "ADAPTCOMM_CUDA_DEVICE"}) {
      unsetenv(v);
    }
  }
};

TEST_F(LaunchEnv, TorchrunVariables) {
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "10.0.0.7", 1);
  setenv("MASTER_PORT", "29500", 1);
  absl::StatusOr<LaunchInfo> info = DetectLaunchEnvironment();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->source, "torchrun");
  EXPECT_EQ(info->rank, 5);
  EXPECT_EQ(info->world_size, 8);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->master_addr, "10.0.0.7");
  EXPECT_EQ(info->master_port, 29500);
  EXPECT_EQ(DefaultCudaDevice(), 1);
  setenv("ADAPTCOMM_CUDA_DEVICE", "3", 1);  // ours wins
  EXPECT_EQ(DefaultCudaDevice(), 3);
}

TEST_F(LaunchEnv, OpenMpiThenSlurmAndTheirLocalRanks) {
  setenv("SLURM_PROCID", "2", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_LOCALID", "2", 1);
  setenv("SLURM_NTASKS_PER_NODE", "4(x2)", 1);  // Slurm's own format: ignored, not an error
  absl::StatusOr<LaunchInfo> info = DetectLaunchEnvironment();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->source, "slurm");
  EXPECT_EQ(info->local_world_size, -1);
  EXPECT_EQ(DefaultCudaDevice(), 2);

  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  info = DetectLaunchEnvironment();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->source, "openmpi");
  EXPECT_EQ(info->rank, 1);
  EXPECT_EQ(DefaultCudaDevice(), 0);
}

TEST_F(LaunchEnv, BadValuesAreNamedAndNothingIsNotFound) {
  absl::StatusOr<LaunchInfo> none = DetectLaunchEnvironment();
  EXPECT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("set RANK and WORLD_SIZE"));
  EXPECT_EQ(DefaultCudaDevice(), 0);

  setenv("RANK", "two", 1);
  setenv("WORLD_SIZE", "4", 1);
  absl::StatusOr<LaunchInfo> bad = DetectLaunchEnvironment();
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("RANK='two'"));

  setenv("RANK", "0", 1);
  setenv("MASTER_PORT", "70000", 1);
  bad = DetectLaunchEnvironment();
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("MASTER_PORT=70000 is not a TCP port"));

  setenv("ADAPTCOMM_CUDA_DEVICE", "-1", 1);  // not a device: the next rule applies
  EXPECT_EQ(DefaultCudaDevice(), 0);
}

}  // namespace
}  // namespace adaptcomm

// Rank, world size and master address from the launchers users already have.
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/communicator.h"

namespace adaptcomm {
namespace {

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

// -1 when unset; InvalidArgument naming the variable when set but not an integer.
absl::StatusOr<int> EnvInt(const char* name) {
  const char* v = Env(name);
  if (v == nullptr) return -1;
  int value;
  if (!absl::SimpleAtoi(v, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", v, "' is not a non-negative integer"));
  }
  return value;
}

struct LauncherVars {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr LauncherVars kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

}  // namespace

absl::StatusOr<LaunchInfo> DetectLaunchEnvironment() {
  for (const LauncherVars& l : kLaunchers) {
    if (Env(l.rank) == nullptr || Env(l.world_size) == nullptr) continue;
    LaunchInfo info;
    info.source = l.source;
    absl::StatusOr<int> rank = EnvInt(l.rank);
    if (!rank.ok()) return rank.status();
    absl::StatusOr<int> world = EnvInt(l.world_size);
    if (!world.ok()) return world.status();
    info.rank = *rank;
    info.world_size = *world;
    // Local values are informational; a malformed one (Slurm writes "4(x2)") is ignored.
    info.local_rank = EnvInt(l.local_rank).value_or(-1);
    info.local_world_size = EnvInt(l.local_world_size).value_or(-1);
    const char* addr = Env("ADAPTCOMM_MASTER_ADDR");
    if (addr == nullptr) addr = Env("MASTER_ADDR");
    if (addr != nullptr) info.master_addr = addr;
    const char* port_var = Env("ADAPTCOMM_MASTER_PORT") ? "ADAPTCOMM_MASTER_PORT" : "MASTER_PORT";
    absl::StatusOr<int> port = EnvInt(port_var);
    if (!port.ok()) return port.status();
    if (*port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat(port_var, "=", *port, " is not a TCP port (1..65535)"));
    }
    info.master_port = *port < 0 ? 0 : *port;
    return info;
  }
  return absl::NotFoundError(
      "no launcher environment found: set RANK and WORLD_SIZE (torchrun), run under mpirun "
      "(OMPI_COMM_WORLD_RANK) or srun (SLURM_PROCID), or pass rank and world_size explicitly");
}

int DefaultCudaDevice() {
  for (const char* name :
       {"ADAPTCOMM_CUDA_DEVICE", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    absl::StatusOr<int> d = EnvInt(name);
    if (d.ok() && *d >= 0) return *d;
  }
  return 0;
}

}  // namespace adaptcomm

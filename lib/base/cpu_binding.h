// Where the ranks a launcher starts on one host run: each on cores of its own, like OpenMPI's
// `--bind-to core` for the ranks of one host. Two ranks that the scheduler lets share a core
// take turns on it: a 4 KiB shared-memory allreduce then costs a context switch per op, about
// 4x its time with a core each. Used by `adaptcomm launch`, `adaptcomm tune` and the benches that
// fork ranks; the library itself never moves a thread.
#ifndef ADAPTCOMM_LIB_BASE_CPU_BINDING_H_
#define ADAPTCOMM_LIB_BASE_CPU_BINDING_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace adaptcomm {

enum class CpuBindMode {
  kAuto,  // kCore when every local rank gets a core of its own, else unbound
  kCore,  // each local rank on cores of its own; an error when there are fewer cores than ranks
  kNone,  // the ranks inherit the launcher's CPUs
};

// "auto", "core" or "none"; InvalidArgument naming the text otherwise.
absl::StatusOr<CpuBindMode> ParseCpuBindMode(absl::string_view text);

// The CPUs this process may run on, grouped by physical core (hardware threads of one core
// together), cores ordered by package then core id (/sys/devices/system/cpu/cpuN/topology). A
// CPU whose topology cannot be read is a core of its own.
std::vector<std::vector<int>> AllowedCores();

// How many CPUs (hardware threads) the calling thread may run on, from its affinity; 0 when it
// cannot be read.
int AllowedCpuCount();

// The CPUs of local rank `local_rank` of `local_world` under `mode`: the cores split into
// `local_world` contiguous runs (the first ranks take one more when they do not divide evenly),
// each rank all hardware threads of its run. Empty: leave the rank unbound (kNone, or kAuto with
// fewer cores than ranks). kCore with fewer cores than ranks: InvalidArgument saying so.
// REQUIRES: 0 <= local_rank < local_world.
absl::StatusOr<std::vector<int>> CpusForLocalRank(const std::vector<std::vector<int>>& cores,
                                                  CpuBindMode mode, int local_rank,
                                                  int local_world);

// Restricts the calling thread (and the threads and processes it starts later) to `cpus`.
absl::Status BindCallingThread(const std::vector<int>& cpus);

// "0-3,8,10-11" (sorted, ranges folded), as Linux writes CPU lists.
std::string CpuListText(std::vector<int> cpus);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_CPU_BINDING_H_

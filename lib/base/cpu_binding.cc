#include "lib/base/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace adaptcomm {
namespace {

// -1 when the file does not hold an integer (no such CPU, or no topology in this kernel).
int ReadTopologyNumber(int cpu, const char* name) {
  std::ifstream in(absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/", name));
  std::string text;
  int value = -1;
  if (!(in >> text) || !absl::SimpleAtoi(text, &value)) return -1;
  return value;
}

}  // namespace

absl::StatusOr<CpuBindMode> ParseCpuBindMode(absl::string_view text) {
  if (text == "auto") return CpuBindMode::kAuto;
  if (text == "core") return CpuBindMode::kCore;
  if (text == "none") return CpuBindMode::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("CPU binding '", text, "' is not one of auto, core, none"));
}

std::vector<std::vector<int>> AllowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  // (package, core id) -> CPUs; a CPU without a topology is keyed by its own number.
  std::map<std::pair<int, int>, std::vector<int>> by_core;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const int package = ReadTopologyNumber(cpu, "physical_package_id");
    const int core = ReadTopologyNumber(cpu, "core_id");
    const std::pair<int, int> key =
        package < 0 || core < 0 ? std::pair(-1, cpu) : std::pair(package, core);
    by_core[key].push_back(cpu);
  }
  std::vector<std::vector<int>> cores;
  for (auto& [key, cpus] : by_core) cores.push_back(std::move(cpus));
  return cores;
}

int AllowedCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

absl::StatusOr<std::vector<int>> CpusForLocalRank(const std::vector<std::vector<int>>& cores,
                                                  CpuBindMode mode, int local_rank,
                                                  int local_world) {
  const int n = static_cast<int>(cores.size());
  if (mode == CpuBindMode::kNone || local_world < 1) return std::vector<int>{};
  if (n < local_world) {
    if (mode == CpuBindMode::kAuto) return std::vector<int>{};
    std::vector<int> all;
    for (const std::vector<int>& core : cores) all.insert(all.end(), core.begin(), core.end());
    return absl::InvalidArgumentError(
        absl::StrCat(local_world, " ranks on this host but ", n, " core(s) to run on (CPUs ",
                     CpuListText(all), "): use fewer ranks, or none to leave them unbound"));
  }
  const int base = n / local_world, extra = n % local_world;
  const int first = local_rank * base + std::min(local_rank, extra);
  const int count = base + (local_rank < extra ? 1 : 0);
  std::vector<int> cpus;
  for (int c = first; c < first + count; ++c) {
    cpus.insert(cpus.end(), cores[static_cast<size_t>(c)].begin(),
                cores[static_cast<size_t>(c)].end());
  }
  std::sort(cpus.begin(), cpus.end());
  return cpus;
}

absl::Status BindCallingThread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(absl::StrCat("no CPU ", cpu));
    }
    CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(
        absl::StrCat("sched_setaffinity(", CpuListText(cpus), "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string CpuListText(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

}  // namespace adaptcomm

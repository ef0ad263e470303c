#include "lib/diag/gpu_probe.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace adaptcomm::diag {
namespace {

// The few NVML types and entry points used, declared from NVML's documented C ABI.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct NvmlMemory {
  unsigned long long total, free, used;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kNvmlMemoryErrorUncorrected = 1;
constexpr int kNvmlAggregateEcc = 1;
constexpr int kNvmlP2pCapsRead = 0;
constexpr int kNvmlP2pCapsNvlink = 2;
constexpr int kNvmlP2pStatusOk = 0;

struct Nvml {
  void* handle = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*driver_version)(char*, unsigned) = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, NvmlMemory*) = nullptr;
  nvmlReturn_t (*ecc)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*common_ancestor)(nvmlDevice_t, nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*p2p_status)(nvmlDevice_t, nvmlDevice_t, int, int*) = nullptr;

  template <typename F>
  void Bind(F& fn, const char* symbol) {
    fn = reinterpret_cast<F>(dlsym(handle, symbol));
  }
  std::string Error(nvmlReturn_t r) const {
    return error_string != nullptr ? error_string(r) : absl::StrCat("NVML error ", r);
  }
};

// nvmlGpuTopologyLevel_t values, named as `nvidia-smi topo -m` does.
std::string TopologyName(int level) {
  switch (level) {
    case 0:
      return "SELF";
    case 10:
      return "PIX";  // one PCIe switch
    case 20:
      return "PXB";  // several PCIe switches
    case 30:
      return "PHB";  // a PCIe host bridge
    case 40:
      return "NODE";  // host bridges of one NUMA node
    case 50:
      return "SYS";  // across NUMA nodes (SMP interconnect)
    default:
      return absl::StrCat("level", level);
  }
}

}  // namespace

GpuProbe ProbeGpus() {
  GpuProbe out;
  Nvml nv;
  nv.handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nv.handle == nullptr) {
    out.nvml_error = "libnvidia-ml.so.1 not found (no NVIDIA driver on this node)";
    return out;
  }
  nv.Bind(nv.init, "nvmlInit_v2");
  nv.Bind(nv.shutdown, "nvmlShutdown");
  nv.Bind(nv.error_string, "nvmlErrorString");
  nv.Bind(nv.driver_version, "nvmlSystemGetDriverVersion");
  nv.Bind(nv.count, "nvmlDeviceGetCount_v2");
  nv.Bind(nv.by_index, "nvmlDeviceGetHandleByIndex_v2");
  nv.Bind(nv.name, "nvmlDeviceGetName");
  nv.Bind(nv.memory, "nvmlDeviceGetMemoryInfo");
  nv.Bind(nv.ecc, "nvmlDeviceGetTotalEccErrors");
  nv.Bind(nv.common_ancestor, "nvmlDeviceGetTopologyCommonAncestor");
  nv.Bind(nv.p2p_status, "nvmlDeviceGetP2PStatus");
  if (nv.init == nullptr || nv.count == nullptr || nv.by_index == nullptr) {
    out.nvml_error = "libnvidia-ml.so.1 lacks nvmlInit_v2/nvmlDeviceGetCount_v2 (driver too old)";
    dlclose(nv.handle);
    return out;
  }
  if (nvmlReturn_t r = nv.init(); r != kNvmlSuccess) {
    out.nvml_error = absl::StrCat("nvmlInit failed: ", nv.Error(r));
    dlclose(nv.handle);
    return out;
  }
  out.nvml_loaded = true;
  if (nv.driver_version != nullptr) {
    char buf[96] = {};
    if (nv.driver_version(buf, sizeof(buf)) == kNvmlSuccess) out.driver_version = buf;
  }
  unsigned count = 0;
  if (nvmlReturn_t r = nv.count(&count); r != kNvmlSuccess) {
    out.nvml_error = absl::StrCat("nvmlDeviceGetCount failed: ", nv.Error(r));
    count = 0;
  }
  std::vector<nvmlDevice_t> devices;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    GpuInfo info;
    info.index = static_cast<int>(i);
    if (nvmlReturn_t r = nv.by_index(i, &dev); r != kNvmlSuccess) {
      info.name = absl::StrCat("<unavailable: ", nv.Error(r), ">");
      out.gpus.push_back(info);
      devices.push_back(nullptr);
      continue;
    }
    char name[96] = {};
    if (nv.name != nullptr && nv.name(dev, name, sizeof(name)) == kNvmlSuccess) info.name = name;
    NvmlMemory mem{};
    if (nv.memory != nullptr && nv.memory(dev, &mem) == kNvmlSuccess) {
      info.memory_total = mem.total;
      info.memory_used = mem.used;
    }
    unsigned long long ecc = 0;
    if (nv.ecc != nullptr &&
        nv.ecc(dev, kNvmlMemoryErrorUncorrected, kNvmlAggregateEcc, &ecc) == kNvmlSuccess) {
      info.ecc_known = true;
      info.ecc_uncorrected = ecc;
    }
    out.gpus.push_back(info);
    devices.push_back(dev);
  }
  for (size_t a = 0; a < devices.size(); ++a) {
    for (size_t b = a + 1; b < devices.size(); ++b) {
      GpuPair pair;
      pair.a = static_cast<int>(a);
      pair.b = static_cast<int>(b);
      if (devices[a] == nullptr || devices[b] == nullptr) {
        pair.error = "device unavailable";
        out.pairs.push_back(pair);
        continue;
      }
      int nvlink = -1;
      if (nv.p2p_status != nullptr &&
          nv.p2p_status(devices[a], devices[b], kNvmlP2pCapsNvlink, &nvlink) == kNvmlSuccess &&
          nvlink == kNvmlP2pStatusOk) {
        pair.link = "NVLink";
      } else if (int level = -1;
                 nv.common_ancestor != nullptr &&
                 nv.common_ancestor(devices[a], devices[b], &level) == kNvmlSuccess) {
        pair.link = TopologyName(level);
      } else {
        pair.error = "topology query failed";
      }
      int read = -1;
      if (nv.p2p_status != nullptr &&
          nv.p2p_status(devices[a], devices[b], kNvmlP2pCapsRead, &read) == kNvmlSuccess) {
        pair.p2p_read = read == kNvmlP2pStatusOk;
      }
      out.pairs.push_back(pair);
    }
  }
  if (nv.shutdown != nullptr) nv.shutdown();
  // The library stays loaded: unloading NVML while the driver holds state is not worth the risk.
  return out;
}

std::string TopologyMatrix(const GpuProbe& probe) {
  const size_t n = probe.gpus.size();
  std::string out = absl::StrFormat("%-6s", "");
  for (size_t j = 0; j < n; ++j)
    absl::StrAppend(&out, absl::StrFormat("%-8s", "GPU" + std::to_string(j)));
  absl::StrAppend(&out, "\n");
  for (size_t i = 0; i < n; ++i) {
    absl::StrAppend(&out, absl::StrFormat("%-6s", "GPU" + std::to_string(i)));
    for (size_t j = 0; j < n; ++j) {
      std::string cell = "X";
      for (const GpuPair& p : probe.pairs) {
        if ((static_cast<size_t>(p.a) == i && static_cast<size_t>(p.b) == j) ||
            (static_cast<size_t>(p.a) == j && static_cast<size_t>(p.b) == i)) {
          cell = p.error.empty() ? p.link + (p.p2p_read ? "" : "*") : "?";
        }
      }
      absl::StrAppend(&out, absl::StrFormat("%-8s", cell));
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "(* = P2P read not supported)\n");
  return out;
}

}  // namespace adaptcomm::diag

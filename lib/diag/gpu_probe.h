// GPUs as NVML sees them, loaded at run time with dlopen("libnvidia-ml.so.1"): a node without a
// driver is reported as such instead of failing to start. No NVML header is needed.
#ifndef ADAPTCOMM_LIB_DIAG_GPU_PROBE_H_
#define ADAPTCOMM_LIB_DIAG_GPU_PROBE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace adaptcomm::diag {

struct GpuInfo {
  int index = 0;
  std::string name;
  uint64_t memory_total = 0;
  uint64_t memory_used = 0;
  bool ecc_known = false;
  uint64_t ecc_uncorrected = 0;  // aggregate uncorrected ECC errors (0 when unknown)
  std::string bus_id;
};

struct GpuPair {
  int a = 0, b = 0;
  std::string link;  // "NV#" style summary: "NVLink", "PIX", "PXB", "PHB", "NODE", "SYS"
  bool p2p_read = false;
  std::string error;  // why the pair could not be queried
};

struct GpuProbe {
  bool nvml_loaded = false;
  std::string nvml_error;  // why NVML is unusable (not installed, init failed)
  std::string driver_version;
  std::vector<GpuInfo> gpus;
  std::vector<GpuPair> pairs;  // i < j
};

// Queries NVML. Never fails: problems are described in the result.
GpuProbe ProbeGpus();

// The topology matrix like `nvidia-smi topo -m` prints it (one line per GPU).
std::string TopologyMatrix(const GpuProbe& probe);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_GPU_PROBE_H_

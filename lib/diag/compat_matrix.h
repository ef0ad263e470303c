// The version compatibility matrix (configs/compat_matrix.yaml) and the checks against it.
#ifndef ADAPTCOMM_LIB_DIAG_COMPAT_MATRIX_H_
#define ADAPTCOMM_LIB_DIAG_COMPAT_MATRIX_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "adaptcomm/diagnose.h"
#include "lib/diag/library_probe.h"

namespace adaptcomm::diag {

struct CompatMatrix {
  std::map<std::string, std::string> toolkit_min_driver;       // "12.4" -> "550.54.14"
  std::map<std::string, std::string> minor_compat_min_driver;  // "12" -> "525.60.13"
  std::string nccl_minimum, nccl_recommended;
  std::vector<std::pair<std::string, std::string>> nccl_notes;  // below version -> text

  static absl::StatusOr<CompatMatrix> Load(const std::string& path);
  static absl::StatusOr<CompatMatrix> Parse(const std::string& yaml_text, const std::string& name);
};

// Compares dotted versions numerically ("550.54.14" < "555.42.02"): <0, 0, >0.
int CompareVersions(const std::string& a, const std::string& b);

// The version checks: driver vs runtime, driver vs the toolkit's minimum, NCCL minimum and
// recommended. `driver_version` is NVML's ("550.54.14", empty if unknown).
std::vector<CheckResult> CheckVersions(const CompatMatrix& matrix, const LibraryVersion& driver,
                                       const std::string& driver_version,
                                       const LibraryVersion& runtime, const LibraryVersion& nccl,
                                       bool expect_gpu);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_COMPAT_MATRIX_H_

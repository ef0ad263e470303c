// Pre-flight checks of a node before training (what `adaptcomm diagnose` runs): GPUs and their
// topology, CUDA driver/runtime and NCCL versions against the compatibility matrix, the NCCL_* /
// GLOO_* / ADAPTCOMM_* environment, and checkpoint storage. Each check ends pass, warn or fail
// with a one-line detail and, unless it passed, the fix. A CI pipeline gates on AnyFailed().
//
//   adaptcomm::DiagnoseOptions opts;
//   opts.expect_gpus = 8;
//   opts.checkpoint_dir = "/ckpt";
//   std::vector<adaptcomm::CheckResult> results = adaptcomm::RunPreflightChecks(opts);
//   if (adaptcomm::AnyFailed(results)) ...
//
// Compiles as C++17: trainers include it.
#ifndef ADAPTCOMM_DIAGNOSE_H_
#define ADAPTCOMM_DIAGNOSE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "adaptcomm/export.h"

namespace adaptcomm {

enum class CheckStatus { kPass, kWarn, kFail };
ADAPTCOMM_EXPORT const char* CheckStatusName(CheckStatus status);  // "pass", "warn", "fail"

struct CheckResult {
  std::string check;  // "gpu.count", "version.nccl", "env.NCCL_MAX_RINGS", "storage.fsync", ...
  CheckStatus status = CheckStatus::kPass;
  std::string detail;  // what was found
  std::string fix;     // what to do (empty when passed)
};

struct DiagnoseOptions {
  // GPUs this node must have. Unset: no expectation (no GPU passes, as on a CPU job). Set to
  // N >= 1: fewer than N (or no NVML at all) is a failure; a set value below 1 fails gpu.count.
  std::optional<int> expect_gpus = std::nullopt;
  // The job spans several hosts (the hostname must not resolve to loopback). Unset: inferred
  // from WORLD_SIZE > LOCAL_WORLD_SIZE.
  std::optional<bool> multi_host = std::nullopt;

  // Storage: unset skips the checks. `checkpoint_bytes` are written, fsynced and read back.
  std::optional<std::string> checkpoint_dir = std::nullopt;
  uint64_t checkpoint_bytes = 64ull << 20;
  double min_write_mbps = 200;  // below: warn; below a tenth of it: fail
  double min_read_mbps = 200;   // same
  double max_fsync_ms = 100;    // above: warn; above ten times it: fail

  // Data files. Unset: found in the configuration directory (configs/).
  std::optional<std::string> compat_matrix_file = std::nullopt;  // compat_matrix.yaml
  std::optional<std::string> nccl_params_file = std::nullopt;    // nccl_params.yaml

  // The environment to lint, "NAME=value" entries. Unset: this process's environment.
  std::optional<std::vector<std::string>> environment = std::nullopt;

  // Called with a short line before each group of checks starts ("checking GPUs...").
  std::function<void(const std::string&)> progress;
};

// Runs every local check. Never throws; a check that cannot run reports why as warn or fail.
ADAPTCOMM_EXPORT std::vector<CheckResult> RunPreflightChecks(const DiagnoseOptions& options);

ADAPTCOMM_EXPORT bool AnyFailed(const std::vector<CheckResult>& results);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_DIAGNOSE_H_

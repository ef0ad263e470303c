// RunPreflightChecks: the local checks of `adaptcomm diagnose`, in the order of the article's
// pyramid (hardware, versions, configuration, storage).
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "adaptcomm/diagnose.h"
#include "lib/config/nccl_registry.h"
#include "lib/diag/compat_matrix.h"
#include "lib/diag/config_file.h"
#include "lib/diag/env_lint.h"
#include "lib/diag/gpu_probe.h"
#include "lib/diag/library_probe.h"
#include "lib/diag/storage_check.h"

extern char** environ;

namespace adaptcomm {
namespace {

using diag::GpuProbe;

void Add(std::vector<CheckResult>& out, std::string check, CheckStatus st, std::string detail,
         std::string fix = "") {
  out.push_back({std::move(check), st, std::move(detail), std::move(fix)});
}

void CheckGpus(const DiagnoseOptions& o, const GpuProbe& probe, std::vector<CheckResult>& out) {
  if (o.expect_gpus.has_value() && *o.expect_gpus < 1) {
    Add(out, "gpu.count", CheckStatus::kFail,
        absl::StrCat("expect_gpus must be at least 1, got ", *o.expect_gpus),
        "leave it unset for no expectation");
    return;
  }
  const bool expect = o.expect_gpus.has_value();
  if (!probe.nvml_loaded) {
    Add(out, "gpu.count", expect ? CheckStatus::kFail : CheckStatus::kPass,
        absl::StrCat("no GPU: ", probe.nvml_error),
        expect ? absl::StrCat("this job expects ", *o.expect_gpus,
                              " GPU(s): install the driver or schedule on a GPU node")
               : "");
    return;
  }
  const int n = static_cast<int>(probe.gpus.size());
  std::string models;
  for (const auto& g : probe.gpus) {
    if (models.find(g.name) == std::string::npos)
      absl::StrAppend(&models, models.empty() ? "" : ", ", g.name);
  }
  const std::string detail =
      absl::StrCat(n, " GPU(s)", n ? ": " + models : "",
                   probe.driver_version.empty() ? "" : ", driver " + probe.driver_version);
  if (expect && n < *o.expect_gpus) {
    Add(out, "gpu.count", CheckStatus::kFail, absl::StrCat(detail, "; expected ", *o.expect_gpus),
        "check `nvidia-smi` for missing GPUs (Xid 79 'fallen off the bus', disabled devices) and "
        "CUDA_VISIBLE_DEVICES");
  } else {
    Add(out, "gpu.count", CheckStatus::kPass, detail);
  }
  for (const auto& g : probe.gpus) {
    const std::string check = absl::StrCat("gpu.", g.index);
    std::string mem = absl::StrFormat("%s, %.1f GiB, %.1f GiB in use", g.name,
                                      g.memory_total / 1073741824.0, g.memory_used / 1073741824.0);
    if (g.ecc_known && g.ecc_uncorrected > 0) {
      Add(out, check, CheckStatus::kFail,
          absl::StrCat(mem, "; ", g.ecc_uncorrected, " uncorrected ECC error(s)"),
          "drain the node; check `nvidia-smi -q -d ECC,ROW_REMAPPER` and reset or replace the GPU");
    } else if (g.memory_total > 0 && g.memory_used > g.memory_total / 10) {
      Add(out, check, CheckStatus::kWarn, absl::StrCat(mem, " before training starts"),
          "another process holds GPU memory (`nvidia-smi`): NCCL may run out of memory");
    } else {
      Add(out, check, CheckStatus::kPass,
          absl::StrCat(mem, g.ecc_known ? ", no uncorrected ECC errors" : ", ECC not reported"));
    }
  }
  if (n > 1) {
    std::string links;
    int no_p2p = 0;
    for (const auto& p : probe.pairs) {
      absl::StrAppend(&links, links.empty() ? "" : " ", p.a, "-", p.b, ":",
                      p.error.empty() ? p.link : "?");
      if (!p.p2p_read) ++no_p2p;
    }
    Add(out, "gpu.topology", no_p2p ? CheckStatus::kWarn : CheckStatus::kPass,
        absl::StrCat(links, no_p2p ? absl::StrCat("; ", no_p2p, " pair(s) without P2P") : ""),
        no_p2p ? "P2P unavailable between some GPUs (ACS/IOMMU, or across root complexes): NCCL "
                 "routes that traffic through host memory; see `adaptcomm diagnose --topology`"
               : "");
  }
}

std::vector<std::string> ProcessEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

bool InferMultiHost(const std::vector<std::string>& env) {
  long world = -1, local = -1;
  for (const std::string& kv : env) {
    if (kv.rfind("WORLD_SIZE=", 0) == 0) world = std::strtol(kv.c_str() + 11, nullptr, 10);
    if (kv.rfind("LOCAL_WORLD_SIZE=", 0) == 0) local = std::strtol(kv.c_str() + 17, nullptr, 10);
  }
  return world > 0 && local > 0 && world > local;
}

}  // namespace

const char* CheckStatusName(CheckStatus status) {
  switch (status) {
    case CheckStatus::kPass:
      return "pass";
    case CheckStatus::kWarn:
      return "warn";
    case CheckStatus::kFail:
      return "fail";
  }
  return "?";
}

bool AnyFailed(const std::vector<CheckResult>& results) {
  for (const auto& r : results) {
    if (r.status == CheckStatus::kFail) return true;
  }
  return false;
}

std::vector<CheckResult> RunPreflightChecks(const DiagnoseOptions& o) {
  std::vector<CheckResult> out;
  auto progress = [&](const std::string& what) {
    if (o.progress) o.progress(what);
  };

  progress("checking GPUs (NVML)");
  GpuProbe probe = diag::ProbeGpus();
  CheckGpus(o, probe, out);

  progress("checking CUDA driver, CUDA runtime and NCCL versions");
  const std::string matrix_path = o.compat_matrix_file.has_value()
                                      ? *o.compat_matrix_file
                                      : diag::FindConfigFile("compat_matrix.yaml");
  auto matrix = diag::CompatMatrix::Load(matrix_path.empty() ? "compat_matrix.yaml" : matrix_path);
  if (!matrix.ok()) {
    Add(out, "version.matrix", CheckStatus::kWarn, std::string(matrix.status().message()),
        "pass the compatibility matrix (configs/compat_matrix.yaml) or set ADAPTCOMM_CONFIG_DIR");
  } else {
    auto versions =
        diag::CheckVersions(*matrix, diag::ProbeCudaDriver(), probe.driver_version,
                            diag::ProbeCudaRuntime(), diag::ProbeNccl(), o.expect_gpus.has_value());
    out.insert(out.end(), versions.begin(), versions.end());
  }

  progress("linting NCCL_*/GLOO_*/ADAPTCOMM_* environment");
  diag::EnvLintInput lint;
  lint.environment = o.environment.has_value() ? *o.environment : ProcessEnvironment();
  const std::string params_path = o.nccl_params_file.has_value()
                                      ? *o.nccl_params_file
                                      : diag::FindConfigFile("nccl_params.yaml");
  absl::StatusOr<std::shared_ptr<const config::NcclRegistry>> registry =
      absl::NotFoundError("configs/nccl_params.yaml not found");
  if (!params_path.empty()) registry = config::NcclRegistry::LoadCached(params_path);
  if (registry.ok()) {
    lint.registry = registry->get();
  } else {
    Add(out, "env.registry", CheckStatus::kWarn, std::string(registry.status().message()),
        "set ADAPTCOMM_CONFIG_DIR to the directory holding nccl_params.yaml");
  }
  lint.interfaces = diag::ListInterfaces();
  lint.multi_host = o.multi_host.has_value() ? *o.multi_host : InferMultiHost(lint.environment);
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) {
    lint.hostname = host;
    if (lint.multi_host) lint.hostname_addresses = diag::ResolveHost(host);
  }
  auto env = diag::LintEnvironment(lint);
  out.insert(out.end(), env.begin(), env.end());

  if (o.checkpoint_dir.has_value()) {
    progress(absl::StrCat("measuring checkpoint storage in ", *o.checkpoint_dir));
    auto storage = diag::CheckStorage(o);
    out.insert(out.end(), storage.begin(), storage.end());
  }
  return out;
}

}  // namespace adaptcomm

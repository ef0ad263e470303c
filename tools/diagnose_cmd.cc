// `adaptcomm diagnose`: the pre-flight checklist (GPUs, versions, environment, storage and,
// under the launcher with --ranks, the network between ranks). Exit code 1 on any failed check,
// so a CI/CD pipeline can gate on it; 0 otherwise (warnings included).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/diagnose.h"
#include "adaptcomm/profile.h"
#include "lib/diag/check_report.h"
#include "lib/diag/gpu_probe.h"
#include "lib/diag/rank_checks.h"
#include "tools/subcommands.h"

namespace adaptcomm::tools {
namespace {

struct DiagnoseArgs {
  bool json = false;
  std::optional<int> expect_gpus;  // unset: no expectation
  int expect_gpus_flag = 0;
  std::string checkpoint_dir;
  double checkpoint_mib = 64;
  bool ranks = false;
  bool topology = false;
  std::string multi_host = "auto";
  std::string inject_delay;         // "RANK:MS"
  std::optional<double> min_busbw;  // unset: the profile's diagnose.min_busbw_gbps
  double min_busbw_flag = 0;
  std::string model;  // profile selection, as for the communicator
  std::string profile;
};

int RunDiagnose(const DiagnoseArgs& a) {
  const bool tty = isatty(STDERR_FILENO) != 0;
  DiagnoseOptions o;
  o.expect_gpus = a.expect_gpus;
  if (!a.checkpoint_dir.empty()) o.checkpoint_dir = a.checkpoint_dir;
  o.checkpoint_bytes = static_cast<uint64_t>(a.checkpoint_mib * 1048576);
  if (a.multi_host != "auto") o.multi_host = a.multi_host == "yes";
  // One progress line, rewritten in place on a terminal.
  o.progress = [tty](const std::string& what) {
    std::fprintf(stderr, tty ? "\r\033[K[diagnose] %s..." : "[diagnose] %s...\n", what.c_str());
    std::fflush(stderr);
  };
  std::vector<CheckResult> results = RunPreflightChecks(o);

  if (a.ranks) {
    o.progress("checking ranks: store, versions, allreduce latency and bandwidth");
    diag::RankCheckOptions ro;
    ro.versions = diag::LocalVersionFingerprint();
    ProfileRequest req;
    if (!a.model.empty()) req.model_size = a.model;
    if (!a.profile.empty()) req.file = a.profile;
    ro.comm.model_size = req.model_size;
    ro.comm.profile_file = req.file;
    if (const char* world = std::getenv("WORLD_SIZE"); world != nullptr) {
      (void)absl::SimpleAtoi(world, &req.world_size);
      req.world_size = std::max(1, req.world_size);
    }
    const diag::BusbwThreshold threshold = diag::ResolveBusbwThreshold(a.min_busbw, req);
    ro.min_busbw_gbps = threshold.gbps;
    ro.min_busbw_source = threshold.source;
    if (!a.inject_delay.empty()) {
      const size_t colon = a.inject_delay.find(':');
      int rank = -1, ms = 0;
      if (colon == std::string::npos || !absl::SimpleAtoi(a.inject_delay.substr(0, colon), &rank) ||
          !absl::SimpleAtoi(a.inject_delay.substr(colon + 1), &ms)) {
        std::fprintf(stderr, "diagnose: --inject-delay wants RANK:MS, got '%s'\n",
                     a.inject_delay.c_str());
        return 2;
      }
      ro.inject_rank = rank;
      ro.inject_delay = absl::Milliseconds(ms);
    }
    std::vector<CheckResult> rank_results = diag::RunRankChecks(ro);
    results.insert(results.end(), rank_results.begin(), rank_results.end());
  }
  if (tty) std::fprintf(stderr, "\r\033[K");

  // Under the launcher every rank runs the checks; rank 0 prints the table, the others only what
  // did not pass (their exit codes still count).
  const char* rank_env = std::getenv("RANK");
  if (a.ranks && !a.json && rank_env != nullptr && std::string(rank_env) != "0") {
    std::vector<CheckResult> notable;
    for (const auto& r : results) {
      if (r.status != CheckStatus::kPass) notable.push_back(r);
    }
    if (notable.empty()) return 0;
    results = notable;
  }
  std::string out =
      a.json ? diag::RenderCheckJson(results) + "\n" : diag::RenderCheckTable(results);
  if (a.topology && !a.json) {
    diag::GpuProbe probe = diag::ProbeGpus();
    absl::StrAppend(&out, "\nGPU topology:\n",
                    probe.gpus.empty() ? "no GPU\n" : diag::TopologyMatrix(probe));
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return AnyFailed(results) ? 1 : 0;
}

std::function<int()> SetupDiagnose(CLI::App& sub) {
  auto a = std::make_shared<DiagnoseArgs>();
  sub.add_flag("--json", a->json, "Machine-readable output");
  CLI::Option* expect_gpus = sub.add_option("--expect-gpus", a->expect_gpus_flag,
                                            "GPUs this node must have (fail if fewer)");
  sub.add_option("--checkpoint-dir", a->checkpoint_dir,
                 "Measure write/fsync/read of this checkpoint directory");
  sub.add_option("--checkpoint-mib", a->checkpoint_mib, "Bytes written by the storage check (MiB)")
      ->check(CLI::PositiveNumber);
  sub.add_flag("--ranks", a->ranks,
               "Also check the network between ranks (run under `adaptcomm launch -n N --`)");
  CLI::Option* min_busbw = sub.add_option(
      "--min-busbw", a->min_busbw_flag,
      "Bus bandwidth threshold of --ranks, GB/s (default: the profile's diagnose.min_busbw_gbps)");
  sub.add_option(
      "--model", a->model,
      "Model size or tier selecting the profile (default: ADAPTCOMM_MODEL_SIZE, else the "
      "smallest tier)");
  sub.add_option("--profile", a->profile,
                 "Profile YAML file (default: ADAPTCOMM_PROFILE, else configs/profiles.yaml)");
  sub.add_option("--inject-delay", a->inject_delay,
                 "RANK:MS - that rank arrives MS late to each timed collective (tests the "
                 "slow-rank check)");
  sub.add_option("--multi-host", a->multi_host,
                 "yes|no|auto: the job spans hosts (auto: WORLD_SIZE > LOCAL_WORLD_SIZE)")
      ->check(CLI::IsMember({"yes", "no", "auto"}));
  sub.add_flag("--topology", a->topology,
               "Print the GPU topology matrix (like nvidia-smi topo -m)");
  sub.footer("Exit code: 1 if any check failed, 0 otherwise (warnings included).");
  return [a, min_busbw, expect_gpus] {
    if (min_busbw->count() > 0) a->min_busbw = a->min_busbw_flag;
    if (expect_gpus->count() > 0) a->expect_gpus = a->expect_gpus_flag;
    return RunDiagnose(*a);
  };
}

}  // namespace

ADAPTCOMM_SUBCOMMAND(diagnose, "Pre-flight checks: GPUs, versions, environment, storage, network",
                     SetupDiagnose);

}  // namespace adaptcomm::tools

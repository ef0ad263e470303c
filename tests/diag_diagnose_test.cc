// `adaptcomm diagnose`: environment lint, version checks, storage checks, the whole local run on
// this machine, and the rank checks with a planted straggler.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "adaptcomm/diagnose.h"
#include "adaptcomm/profile.h"
#include "gtest/gtest.h"
#include "lib/config/nccl_registry.h"
#include "lib/diag/check_report.h"
#include "lib/diag/compat_matrix.h"
#include "lib/diag/env_lint.h"
#include "lib/diag/gpu_probe.h"
#include "lib/diag/library_probe.h"
#include "lib/diag/rank_checks.h"
#include "lib/diag/storage_check.h"
#include "nlohmann/json.hpp"
#include "tests/harness.h"

namespace adaptcomm::diag {
namespace {

std::string SourceDir() {
  const char* dir = std::getenv("ADAPTCOMM_SOURCE_DIR");
  if (dir != nullptr) return dir;
  std::string file = __FILE__;
  return file.substr(0, file.rfind("/tests/"));
}

const CheckResult* Find(const std::vector<CheckResult>& rs, const std::string& check) {
  for (const auto& r : rs) {
    if (r.check == check) return &r;
  }
  return nullptr;
}

const config::NcclRegistry& Registry() {
  static auto reg = config::NcclRegistry::LoadCached(SourceDir() + "/configs/nccl_params.yaml");
  EXPECT_TRUE(reg.ok()) << reg.status();
  return **reg;
}

EnvLintInput LintInput(std::vector<std::string> env) {
  EnvLintInput in;
  in.environment = std::move(env);
  in.registry = &Registry();
  in.interfaces = {{"lo", true, true}, {"eth0", true, false}, {"ib0", false, false}};
  return in;
}

TEST(EnvLintTest, FlagsDeadDeprecatedUnknownAndOutOfRange) {
  auto rs = LintEnvironment(
      LintInput({"NCCL_MAX_RINGS=8", "NCCL_MIN_NRINGS=4", "NCCL_IB_MTU=4096", "NCCL_MIN_CTAS=500",
                 "NCCL_BUFFSIZE=2097152", "ADAPTCOMM_LOG_LEVL=debug", "PATH=/bin"}));
  const CheckResult* dead = Find(rs, "env.NCCL_MAX_RINGS");
  ASSERT_NE(dead, nullptr);
  EXPECT_EQ(dead->status, CheckStatus::kFail);
  EXPECT_NE(dead->fix.find("NCCL_MAX_CTAS"), std::string::npos) << dead->fix;
  ASSERT_NE(Find(rs, "env.NCCL_IB_MTU"), nullptr);
  EXPECT_EQ(Find(rs, "env.NCCL_IB_MTU")->status, CheckStatus::kFail);
  ASSERT_NE(Find(rs, "env.NCCL_MIN_NRINGS"), nullptr);
  EXPECT_EQ(Find(rs, "env.NCCL_MIN_NRINGS")->status, CheckStatus::kWarn);
  EXPECT_NE(Find(rs, "env.NCCL_MIN_NRINGS")->fix.find("NCCL_MIN_CTAS"), std::string::npos);
  ASSERT_NE(Find(rs, "env.NCCL_MIN_CTAS"), nullptr);
  EXPECT_EQ(Find(rs, "env.NCCL_MIN_CTAS")->status, CheckStatus::kFail);
  EXPECT_EQ(Find(rs, "env.NCCL_BUFFSIZE"), nullptr) << "a valid current variable is clean";
  ASSERT_NE(Find(rs, "env.ADAPTCOMM_LOG_LEVL"), nullptr);
  EXPECT_EQ(Find(rs, "env.ADAPTCOMM_LOG_LEVL")->status, CheckStatus::kWarn);
  EXPECT_NE(Find(rs, "env.ADAPTCOMM_LOG_LEVL")->detail.find("did you mean ADAPTCOMM_LOG_LEVEL"),
            std::string::npos);
  EXPECT_EQ(Find(rs, "env.PATH"), nullptr);
  ASSERT_NE(Find(rs, "env.summary"), nullptr);
  EXPECT_NE(
      Find(rs, "env.summary")->detail.find("6 NCCL_/GLOO_/ADAPTCOMM_ variable(s) set, 1 clean"),
      std::string::npos)
      << Find(rs, "env.summary")->detail;
}

TEST(EnvLintTest, ImageMetadataIsClean) {
  auto rs = LintEnvironment(LintInput({"NCCL_VERSION=2.28.3-1", "NCCL_VERSON=2.28"}));
  EXPECT_EQ(Find(rs, "env.NCCL_VERSION"), nullptr);
  ASSERT_NE(Find(rs, "env.NCCL_VERSON"), nullptr) << "a misspelt name is still unknown";
  EXPECT_EQ(Find(rs, "env.NCCL_VERSON")->status, CheckStatus::kWarn);
  ASSERT_NE(Find(rs, "env.summary"), nullptr);
  EXPECT_NE(
      Find(rs, "env.summary")->detail.find("2 NCCL_/GLOO_/ADAPTCOMM_ variable(s) set, 1 clean"),
      std::string::npos)
      << Find(rs, "env.summary")->detail;
}

TEST(EnvLintTest, UnknownNcclNameGetsDidYouMean) {
  auto rs = LintEnvironment(LintInput({"NCCL_BUFSIZE=4194304"}));
  const CheckResult* r = Find(rs, "env.NCCL_BUFSIZE");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status, CheckStatus::kWarn);
  EXPECT_NE(r->detail.find("NCCL_BUFFSIZE"), std::string::npos) << r->detail;
}

TEST(EnvLintTest, SocketInterfaceNames) {
  auto rs = LintEnvironment(LintInput({"NCCL_SOCKET_IFNAME=eth9", "GLOO_SOCKET_IFNAME=ib0"}));
  ASSERT_NE(Find(rs, "env.NCCL_SOCKET_IFNAME"), nullptr);
  EXPECT_EQ(Find(rs, "env.NCCL_SOCKET_IFNAME")->status, CheckStatus::kFail);
  EXPECT_NE(Find(rs, "env.NCCL_SOCKET_IFNAME")->detail.find("matches no interface (up: lo, eth0)"),
            std::string::npos);
  ASSERT_NE(Find(rs, "env.GLOO_SOCKET_IFNAME"), nullptr);
  EXPECT_EQ(Find(rs, "env.GLOO_SOCKET_IFNAME")->status, CheckStatus::kFail);
  EXPECT_NE(Find(rs, "env.GLOO_SOCKET_IFNAME")->detail.find("ib0 is down"), std::string::npos);

  auto ok = LintEnvironment(LintInput({"NCCL_SOCKET_IFNAME=eth", "GLOO_SOCKET_IFNAME=eth0"}));
  EXPECT_EQ(Find(ok, "env.NCCL_SOCKET_IFNAME"), nullptr);
  EXPECT_EQ(Find(ok, "env.GLOO_SOCKET_IFNAME"), nullptr);

  const std::vector<Interface> ifs = {
      {"lo", true, true}, {"eth0", true, false}, {"ib0", false, false}};
  std::string why;
  EXPECT_TRUE(NcclIfnameMatches("^lo,docker", ifs, why));
  EXPECT_TRUE(NcclIfnameMatches("=eth0", ifs, why));
  EXPECT_FALSE(NcclIfnameMatches("=eth", ifs, why));
  EXPECT_FALSE(NcclIfnameMatches("ib", ifs, why));
  EXPECT_NE(why.find("down: ib0"), std::string::npos) << why;
  EXPECT_FALSE(NcclIfnameMatches("^lo,eth", ifs, why));
}

TEST(EnvLintTest, LoopbackHostnameFailsOnlyInMultiHostJobs) {
  EnvLintInput in = LintInput({});
  in.hostname = "node1";
  in.hostname_addresses = {"127.0.1.1", "10.0.0.5"};
  in.multi_host = true;
  auto rs = LintEnvironment(in);
  ASSERT_NE(Find(rs, "env.hostname"), nullptr);
  EXPECT_EQ(Find(rs, "env.hostname")->status, CheckStatus::kFail);
  in.hostname_addresses = {"10.0.0.5", "127.0.1.1"};
  EXPECT_EQ(Find(LintEnvironment(in), "env.hostname")->status, CheckStatus::kPass);
  in.multi_host = false;
  in.hostname_addresses = {"127.0.1.1"};
  EXPECT_EQ(Find(LintEnvironment(in), "env.hostname"), nullptr);
}

TEST(ListInterfacesTest, LoopbackIsPresentAndUp) {
  bool found = false;
  for (const Interface& i : ListInterfaces()) {
    if (i.loopback) {
      found = true;
      EXPECT_TRUE(i.up) << i.name;
    }
  }
  EXPECT_TRUE(found);
}

LibraryVersion Lib(const char* name, int code, const char* version) {
  LibraryVersion v;
  v.library = name;
  v.found = code > 0;
  v.code = code;
  v.version = version;
  v.path = "/x";
  v.error = v.found ? "" : "not found";
  return v;
}

TEST(CompatMatrixTest, DriverRuntimeAndNccl) {
  auto m = CompatMatrix::Load(SourceDir() + "/configs/compat_matrix.yaml");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_LT(CompareVersions("550.54.14", "555.42.02"), 0);
  EXPECT_EQ(CompareVersions("2.19", "2.19.0"), 0);
  EXPECT_GT(CompareVersions("2.28.9", "2.19"), 0);

  auto st = [&](const std::vector<CheckResult>& rs, const char* c) {
    const CheckResult* r = Find(rs, c);
    EXPECT_NE(r, nullptr) << c;
    return r ? r->status : CheckStatus::kFail;
  };
  // Driver supports CUDA 12.4, runtime 12.2, NCCL 2.21.5: all fine.
  auto good = CheckVersions(*m, Lib("CUDA driver", 12040, "12.4"), "550.54.14",
                            Lib("CUDA runtime", 12020, "12.2"), Lib("NCCL", 22105, "2.21.5"), true);
  EXPECT_FALSE(AnyFailed(good));
  EXPECT_EQ(st(good, "compat.driver_runtime"), CheckStatus::kPass);
  // Runtime 12.6 on a 12.4 driver: minor-version compatibility, a warning.
  auto minor =
      CheckVersions(*m, Lib("CUDA driver", 12040, "12.4"), "550.54.14",
                    Lib("CUDA runtime", 12060, "12.6"), Lib("NCCL", 22105, "2.21.5"), true);
  EXPECT_EQ(st(minor, "compat.driver_runtime"), CheckStatus::kWarn);
  // Runtime 13.0 on a 12.4 driver: fails, and names the driver needed.
  auto major =
      CheckVersions(*m, Lib("CUDA driver", 12040, "12.4"), "550.54.14",
                    Lib("CUDA runtime", 13000, "13.0"), Lib("NCCL", 22809, "2.28.9"), true);
  EXPECT_EQ(st(major, "compat.driver_runtime"), CheckStatus::kFail);
  EXPECT_NE(Find(major, "compat.driver_runtime")->fix.find("580.65.06"), std::string::npos);
  // NCCL below the minimum fails; below recommended warns.
  auto old = CheckVersions(*m, Lib("CUDA driver", 0, ""), "", Lib("CUDA runtime", 0, ""),
                           Lib("NCCL", 21203, "2.12.3"), false);
  EXPECT_EQ(st(old, "version.nccl"), CheckStatus::kFail);
  auto oldish = CheckVersions(*m, Lib("CUDA driver", 0, ""), "", Lib("CUDA runtime", 0, ""),
                              Lib("NCCL", 21805, "2.18.5"), false);
  EXPECT_EQ(st(oldish, "version.nccl"), CheckStatus::kWarn);
  EXPECT_NE(Find(oldish, "version.nccl")->detail.find("ncclRemoteError"), std::string::npos);
  // No driver on a CPU job passes; on a GPU job it fails.
  EXPECT_EQ(st(old, "version.cuda_driver"), CheckStatus::kPass);
  auto gpu_job = CheckVersions(*m, Lib("CUDA driver", 0, ""), "", Lib("CUDA runtime", 0, ""),
                               Lib("NCCL", 22809, "2.28.9"), true);
  EXPECT_EQ(st(gpu_job, "version.cuda_driver"), CheckStatus::kFail);
}

TEST(LibraryProbeTest, VersionText) {
  EXPECT_EQ(CudaVersionText(12040), "12.4");
  EXPECT_EQ(CudaVersionText(13000), "13.0");
  EXPECT_EQ(NcclVersionTextFromCode(22809), "2.28.9");
  EXPECT_EQ(NcclVersionTextFromCode(2804), "2.8.4");
}

// The NCCL in the image is found where REFERENCE.md says it is, with its real version.
TEST(LibraryProbeTest, FindsTheInstalledNccl) {
  if (access("/usr/local/cuda/lib64/libnccl.so.2", R_OK) != 0) GTEST_SKIP() << "no NCCL here";
  LibraryVersion v = ProbeNccl();
  ASSERT_TRUE(v.found) << v.error;
  EXPECT_GE(CompareVersions(v.version, "2.0"), 0);
  EXPECT_NE(v.path.find("libnccl.so"), std::string::npos) << v.path;
}

TEST(StorageCheckTest, WritableDirectoryPasses) {
  DiagnoseOptions o;
  o.checkpoint_dir = ::testing::TempDir();
  o.checkpoint_bytes = 8 << 20;
  o.min_write_mbps = 1;  // functional here: only a broken disk is this slow
  o.min_read_mbps = 1;
  o.max_fsync_ms = 1000;
  auto rs = CheckStorage(o);
  for (const char* c : {"storage.access", "storage.write", "storage.read", "storage.fsync"}) {
    ASSERT_NE(Find(rs, c), nullptr) << c;
    EXPECT_EQ(Find(rs, c)->status, CheckStatus::kPass) << c << ": " << Find(rs, c)->detail;
  }
}

TEST(StorageCheckTest, MissingDirectoryFails) {
  DiagnoseOptions o;
  o.checkpoint_dir = "/nonexistent/ckpt";
  auto rs = CheckStorage(o);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, CheckStatus::kFail);
  EXPECT_NE(rs[0].detail.find("No such file"), std::string::npos);
}

// The planted problem of the issue: a tiny tmpfs as the checkpoint directory.
TEST(StorageCheckTest, TinyTmpfsFailsWithAClearMessage) {
  char dir[] = "/tmp/diag_tmpfs_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  if (mount("tmpfs", dir, "tmpfs", 0, "size=2m") != 0) {
    rmdir(dir);
    GTEST_SKIP() << "cannot mount a tmpfs here (not root?)";
  }
  DiagnoseOptions o;
  o.checkpoint_dir = dir;
  o.checkpoint_bytes = 16 << 20;
  auto rs = CheckStorage(o);
  umount(dir);
  rmdir(dir);
  const CheckResult* w = Find(rs, "storage.write");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->status, CheckStatus::kFail);
  EXPECT_NE(w->detail.find("No space left on device"), std::string::npos) << w->detail;
  EXPECT_NE(w->detail.find("cannot hold a checkpoint"), std::string::npos) << w->detail;
}

// On this machine (no GPU driver): passes or warns, never fails, within the time budget, and
// reports progress; --expect-gpus turns the missing GPU into a failure.
TEST(PreflightTest, RunsOnThisMachine) {
  DiagnoseOptions o;
  o.environment = std::vector<std::string>{"PATH=/bin"};
  o.multi_host = false;
  std::vector<std::string> progress;
  o.progress = [&](const std::string& s) { progress.push_back(s); };
  const auto t0 = std::chrono::steady_clock::now();
  auto rs = RunPreflightChecks(o);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_GE(progress.size(), 3u);
  ASSERT_NE(Find(rs, "gpu.count"), nullptr);
  ASSERT_NE(Find(rs, "version.nccl"), nullptr);
  ASSERT_NE(Find(rs, "env.summary"), nullptr);
  const GpuProbe probe = ProbeGpus();
  if (!probe.nvml_loaded) {
    EXPECT_FALSE(AnyFailed(rs)) << RenderCheckTable(rs);
    EXPECT_EQ(Find(rs, "gpu.count")->status, CheckStatus::kPass);
    o.expect_gpus = 1;
    auto with_gpu = RunPreflightChecks(o);
    EXPECT_TRUE(AnyFailed(with_gpu));
    EXPECT_EQ(Find(with_gpu, "gpu.count")->status, CheckStatus::kFail);
  } else {
    EXPECT_NE(Find(rs, "gpu.count")->detail.find("GPU(s)"), std::string::npos);
    EXPECT_EQ(Find(rs, "gpu.count")->status, CheckStatus::kPass);
  }
  // Zero GPUs is no expectation that can be meant: unset is how to say none.
  o.expect_gpus = 0;
  auto zero = RunPreflightChecks(o);
  ASSERT_NE(Find(zero, "gpu.count"), nullptr);
  EXPECT_EQ(Find(zero, "gpu.count")->status, CheckStatus::kFail);
  EXPECT_NE(Find(zero, "gpu.count")->detail.find("expect_gpus must be at least 1, got 0"),
            std::string::npos);
}

TEST(CheckReportTest, TableAndJson) {
  std::vector<CheckResult> rs = {{"a.one", CheckStatus::kPass, "fine", ""},
                                 {"b.two", CheckStatus::kWarn, "meh", "do x"},
                                 {"c.three", CheckStatus::kFail, "broken", "do y"}};
  const std::string table = RenderCheckTable(rs);
  EXPECT_NE(table.find("c.three  FAIL   broken"), std::string::npos) << table;
  EXPECT_NE(table.find("fix: do y"), std::string::npos);
  EXPECT_NE(table.find("1 pass, 1 warn, 1 fail"), std::string::npos);
  auto j = nlohmann::json::parse(RenderCheckJson(rs));
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["summary"]["warn"], 1);
  EXPECT_EQ(j["checks"][2]["status"], "fail");
  EXPECT_EQ(j["checks"][1]["fix"], "do x");
}

// --ranks with 4 ranks as threads: a rank that arrives 60 ms late to each collective is named.
TEST(RankChecksTest, NamesTheStalledRank) {
  for (int stalled : {-1, 2}) {
    std::vector<std::vector<CheckResult>> results(4);
    testing::RunRanks(
        testing::RankMode::kThreads, 4,
        [&](const testing::RankEnv& env) {
          RankCheckOptions o;
          o.comm = env.options;
          o.small_iters = 6;
          o.large_bytes = 1 << 20;
          o.large_iters = 2;
          o.slow_rank_ms = 30;
          o.inject_rank = stalled;
          o.inject_delay = absl::Milliseconds(60);
          o.versions = "host|driver none|cudart 13.0|nccl 2.28.9";
          results[env.rank] = RunRankChecks(o);
        },
        absl::Seconds(120));
    for (int r = 0; r < 4; ++r) {
      const CheckResult* store = Find(results[r], "ranks.store");
      ASSERT_NE(store, nullptr);
      EXPECT_EQ(store->status, CheckStatus::kPass) << store->detail;
      ASSERT_NE(Find(results[r], "ranks.versions"), nullptr);
      EXPECT_EQ(Find(results[r], "ranks.versions")->status, CheckStatus::kPass);
      const CheckResult* slow = Find(results[r], "ranks.slow_rank");
      ASSERT_NE(slow, nullptr);
      if (stalled < 0) {
        EXPECT_EQ(slow->status, CheckStatus::kPass) << slow->detail;
      } else {
        EXPECT_EQ(slow->status, CheckStatus::kFail) << slow->detail;
        EXPECT_EQ(slow->detail.rfind("rank 2 arrives", 0), 0u) << slow->detail;
      }
      ASSERT_NE(Find(results[r], "ranks.busbw"), nullptr);
      EXPECT_NE(Find(results[r], "ranks.busbw")->detail.find("GB/s bus bandwidth"),
                std::string::npos);
    }
  }
}

// The --ranks bandwidth threshold: the flag wins; else the profile tier's
// diagnose.min_busbw_gbps with its file:line; else the built-in default, saying why.
TEST(BusbwThresholdTest, FlagProfileTierAndDefault) {
  ProfileRequest req;
  req.file = SourceDir() + "/configs/profiles.yaml";
  req.world_size = 2;
  req.model_size = "7B";
  BusbwThreshold flag = ResolveBusbwThreshold(5.0, req);
  EXPECT_EQ(flag.gbps, 5.0);
  EXPECT_EQ(flag.source, "--min-busbw");

  BusbwThreshold small = ResolveBusbwThreshold(std::nullopt, req);
  EXPECT_DOUBLE_EQ(small.gbps, 0.1);
  EXPECT_EQ(small.source, "profile tier small (profiles.yaml:64)");
  req.model_size = "70B";
  BusbwThreshold medium = ResolveBusbwThreshold(std::nullopt, req);
  EXPECT_DOUBLE_EQ(medium.gbps, 0.5);
  EXPECT_EQ(medium.source, "profile tier medium (profiles.yaml:73)");
  req.model_size = "235B";
  BusbwThreshold large = ResolveBusbwThreshold(std::nullopt, req);
  EXPECT_DOUBLE_EQ(large.gbps, 1.0);
  EXPECT_EQ(large.source, "profile tier large (profiles.yaml:85)");

  // A profile without the key: the built-in default, named as such.
  const std::string dir = ::testing::TempDir();
  const std::string bare = dir + "/diag_busbw_bare.yaml";
  std::ofstream(bare) << "schema: 1\ntiers:\n  - name: only\n    params: any\n";
  req.file = bare;
  BusbwThreshold builtin = ResolveBusbwThreshold(std::nullopt, req);
  EXPECT_DOUBLE_EQ(builtin.gbps, 0.1);
  EXPECT_EQ(builtin.source, "built-in default (profile tier only sets none)");
  // A profile that sets it in defaults, and an invalid value refused with its line.
  const std::string custom = dir + "/diag_busbw_custom.yaml";
  std::ofstream(custom) << "schema: 1\ndefaults:\n  diagnose:\n    min_busbw_gbps: 12.5\n"
                           "tiers:\n  - name: only\n    params: any\n";
  req.file = custom;
  BusbwThreshold set = ResolveBusbwThreshold(std::nullopt, req);
  EXPECT_DOUBLE_EQ(set.gbps, 12.5);
  EXPECT_EQ(set.source, "profile tier only (diag_busbw_custom.yaml:4)");
  const std::string bad = dir + "/diag_busbw_bad.yaml";
  std::ofstream(bad) << "schema: 1\ndefaults:\n  diagnose:\n    min_busbw_gbps: -1\n"
                        "tiers:\n  - name: only\n    params: any\n";
  req.file = bad;
  BusbwThreshold refused = ResolveBusbwThreshold(std::nullopt, req);
  EXPECT_DOUBLE_EQ(refused.gbps, 0.1);
  EXPECT_NE(refused.source.find("built-in default (profile not loaded: "), std::string::npos)
      << refused.source;
  EXPECT_NE(refused.source.find("diag_busbw_bad.yaml:4"), std::string::npos) << refused.source;
  EXPECT_NE(refused.source.find("min_busbw_gbps"), std::string::npos) << refused.source;
}

// The threshold and its source reach the ranks.busbw row: an unreachable threshold warns.
TEST(RankChecksTest, BusbwRowNamesItsThresholdSource) {
  for (double threshold : {1e6, 1e-6}) {
    std::vector<std::vector<CheckResult>> results(2);
    testing::RunRanks(
        testing::RankMode::kThreads, 2,
        [&](const testing::RankEnv& env) {
          RankCheckOptions o;
          o.comm = env.options;
          o.small_iters = 2;
          o.large_bytes = 256 << 10;
          o.large_iters = 2;
          o.min_busbw_gbps = threshold;
          o.min_busbw_source = "profile tier small (profiles.yaml:64)";
          results[env.rank] = RunRankChecks(o);
        },
        absl::Seconds(60));
    for (int r = 0; r < 2; ++r) {
      const CheckResult* bw = Find(results[r], "ranks.busbw");
      ASSERT_NE(bw, nullptr);
      EXPECT_EQ(bw->status, threshold > 1 ? CheckStatus::kWarn : CheckStatus::kPass) << bw->detail;
      EXPECT_NE(bw->detail.find("from profile tier small (profiles.yaml:64))"), std::string::npos)
          << bw->detail;
    }
  }
}

}  // namespace
}  // namespace adaptcomm::diag

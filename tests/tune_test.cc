// Issue #15: `adaptcomm tune` writes a table that loads for this topology, a communicator created
// with it applies it and Explain()s every tuned value with its file:line and measurement; tables
// for another topology, corrupt ones and ranks with different tables are refused by name. The
// per-band knobs give the right results at every band edge (their speed is bench material:
// `adaptcomm tune --compare`). Its decision rule (lib/diag/paired_speedup.h) on synthetic rounds:
// a candidate must beat the noise of an A/A control measured in the same rounds.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/cpu_binding.h"
#include "lib/config/tuned_table.h"
#include "lib/config/tuning.h"
#include "lib/core/selection/backend_selection.h"
#include "lib/diag/paired_speedup.h"
#include "lib/shm/shm_backend.h"
#include "nlohmann/json.hpp"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Temp(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/tune_test_", getpid(), "_", name);
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Result {
  int code = -1;
  std::string out, err;
};

Result RunCli(const std::string& args) {
  const std::string bin = testing::BuildDir() + "/tools/adaptcomm";
  const std::string stem = Temp("cli");
  const std::string cmd = absl::StrCat("timeout -k 5 120 ", bin, " ", args, " > ", stem, ".out 2> ",
                                       stem, ".err < /dev/null");
  const int rc = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = ReadFile(stem + ".out");
  r.err = ReadFile(stem + ".err");
  return r;
}

// Sets ADAPTCOMM_TUNED_TABLE for the scope.
class ScopedTable {
 public:
  explicit ScopedTable(const std::string& path) { setenv(config::kTunedTableEnv, path.c_str(), 1); }
  ~ScopedTable() { unsetenv(config::kTunedTableEnv); }
};

struct Created {
  std::unique_ptr<Communicator> comm;
  absl::Status status;
};

// `n` ranks as threads over one in-process store, each with backend=shm; runs body on each.
std::vector<absl::Status> OnRanks(int n, const std::function<absl::Status(Communicator&)>& body) {
  std::shared_ptr<Store> store = CreateHashStore();
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions o;
      o.rank = r;
      o.world_size = n;
      o.store = store;
      o.master_addr = "127.0.0.1";
      o.name = "tune_test";
      o.backend = BackendChoice::kShm;
      o.fallback = Fallback::kDeny;
      o.timeout = absl::Seconds(30);
      o.init_timeout = absl::Seconds(30);
      auto comm = Communicator::Create(o);
      if (!comm.ok()) {
        st[r] = comm.status();
        return;
      }
      st[r] = body(**comm);
    });
  }
  for (auto& t : threads) t.join();
  return st;
}

// Allreduce of (rank+1)+(i%5) over `count` floats, checked element by element.
absl::Status CheckedAllreduce(Communicator& comm, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(comm.rank() + 1 + i % 5);
  if (absl::Status s = comm.Allreduce(HostView(v.data(), v.size())).Wait(); !s.ok()) return s;
  const int n = comm.size();
  for (size_t i = 0; i < count; ++i) {
    const float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 5));
    if (v[i] != want) {
      return absl::DataLossError(
          absl::StrCat("count ", count, " element ", i, ": ", v[i], " instead of ", want));
    }
  }
  return absl::OkStatus();
}

std::string TableFor(const config::TopologyFingerprint& fp, const std::string& entries) {
  return absl::StrCat("schema: 1\nkind: adaptcomm-tuned\nfingerprint: {hosts: ", fp.hosts,
                      ", ranks_per_host: ", fp.ranks_per_host, ", cores: ", fp.cores,
                      ", backend: ", fp.backend, ", gloo: \"", fp.gloo,
                      "\", nccl: \"\", gpu: \"\", interconnect: \"\"}\nentries:\n", entries);
}

TEST(Tune, WritesATableThatACommunicatorLoadsAppliesAndExplains) {
  const std::string path = Temp("tuned.yaml");
  Result r = RunCli(absl::StrCat("tune --ranks 2 --sizes 4KiB,64KiB --rounds 3 --out ", path));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("wrote " + path));

  const config::TopologyFingerprint here =
      internal::selection::CurrentFingerprint("shm", /*hosts=*/1, /*ranks_per_host=*/2);
  absl::StatusOr<config::TunedTable> table = config::LoadTunedTableFor(path, here);
  ASSERT_TRUE(table.ok()) << table.status();
  // Two knobs x two bands; the last band reaches to any size.
  ASSERT_EQ(table->entries.size(), 4u);
  for (const config::TunedEntry& e : table->entries) {
    EXPECT_EQ(e.backend, "shm");
    EXPECT_EQ(e.op, "allreduce");
    EXPECT_THAT(e.source, HasSubstr("adaptcomm tune "));
  }
  EXPECT_EQ(table->FindKnob("shm", "allreduce", "chunk_bytes", 4096)->max_bytes, 4096u);
  EXPECT_EQ(table->FindKnob("shm", "allreduce", "chunk_bytes", uint64_t{1} << 30)->max_bytes,
            config::kTunedMaxBytesUnbounded);

  ScopedTable use(path);
  std::string explain, reason;
  std::vector<absl::Status> st = OnRanks(2, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      explain = comm.Explain();
      reason = comm.selection_reason();
    }
    // Both bands and beyond them, at odd sizes too.
    for (size_t count : {1u, 1000u, 1024u, 1025u, 16384u, 16385u, 300000u}) {
      if (absl::Status s = CheckedAllreduce(comm, count); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : st) ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(reason, HasSubstr("tuned table " + path));
  // Every tuned value with its band, value, file:line and measurement.
  const std::string base = path.substr(path.rfind('/') + 1);
  EXPECT_THAT(explain, HasSubstr("tuned.shm.allreduce.chunk_bytes (0 B, 4 KiB]"));
  EXPECT_THAT(explain, HasSubstr("tuned.shm.allreduce.flat_max_bytes (4 KiB, max]"));
  EXPECT_THAT(explain, HasSubstr(base + ":"));
  EXPECT_THAT(explain, HasSubstr("(adaptcomm tune "));
  EXPECT_THAT(explain, HasSubstr("tuning.table_digest"));
  EXPECT_THAT(explain, HasSubstr("backend: shm ("));
}

// A round where the machine was loaded slows every candidate of that round alike: speedups are
// paired by round, and a round without both times is left out.
TEST(TuneDecision, SpeedupsArePairedRoundByRound) {
  const diag::PairedSpeedup s = diag::PairSpeedups({10, 40, 12, 0, 8}, {5, 20, 6, 3, 2});
  EXPECT_EQ(s.rounds, 4);
  EXPECT_DOUBLE_EQ(s.p25, 2.0);
  EXPECT_DOUBLE_EQ(s.median, 2.0);
  EXPECT_DOUBLE_EQ(s.p75, 2.5);  // rounds 2, 2, 2, 4: interpolated between the closest ranks
  EXPECT_EQ(diag::PairSpeedups({}, {1, 2}).rounds, 0);
}

TEST(TuneDecision, ACandidateMustBeatTheNoiseOfTheAAControl) {
  const diag::PairedSpeedup candidate{31, 1.08, 1.02, 1.14};  // 8% faster in the median round
  const diag::PairedSpeedup quiet{31, 1.00, 0.98, 1.02};      // identical settings, quiet machine
  const diag::PairedSpeedup noisy{31, 1.01, 0.91, 1.10};      // identical settings, 10% apart
  EXPECT_TRUE(diag::FasterBeyondNoise(candidate, quiet, /*threshold_pct=*/3));
  EXPECT_FALSE(diag::FasterBeyondNoise(candidate, noisy, 3));
  // The threshold still holds where the control is quiet.
  const diag::PairedSpeedup slight{31, 1.025, 1.01, 1.04};
  EXPECT_FALSE(diag::FasterBeyondNoise(slight, quiet, 3));
  EXPECT_TRUE(diag::FasterBeyondNoise(slight, quiet, 1));
  // Slower in more than a round of four: refused whatever its median.
  EXPECT_FALSE(diag::FasterBeyondNoise({31, 1.30, 0.99, 1.50}, quiet, 3));
  // Nothing measured: nothing chosen.
  EXPECT_FALSE(diag::FasterBeyondNoise({}, quiet, 3));
}

// Every band reports the A/A control it was judged against (text and --json).
TEST(Tune, EveryBandReportsItsAAControl) {
  const std::string path = Temp("tuned_aa.yaml");
  Result r =
      RunCli(absl::StrCat("tune --ranks 2 --sizes 4KiB,64KiB --rounds 3 --json --out ", path));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["bands"].size(), 2u) << r.out;
  for (const nlohmann::json& band : j["bands"]) {
    EXPECT_GT(band["aa_p25"].get<double>(), 0) << band.dump();
    EXPECT_LE(band["aa_p25"].get<double>(), band["aa_median"].get<double>()) << band.dump();
    EXPECT_LE(band["aa_median"].get<double>(), band["aa_p75"].get<double>()) << band.dump();
    EXPECT_NE(band["chosen"], "static (A/A)") << band.dump();  // the control is never chosen
  }
  EXPECT_THAT(ReadFile(path), HasSubstr("A/A ["));  // each entry's source names its noise
}

// Gloo's threads take turns on a rank's only CPU at every op: `auto` measures Gloo ranks unbound
// where it would give each one CPU (as the ranks' own warning advises a job to run), and says so;
// `core` binds them anyway, and each rank's selection reason then carries the warning.
TEST(Tune, GlooRanksStayUnboundWhereAutoWouldGiveEachOneCpu) {
  const std::vector<std::vector<int>> cores = AllowedCores();
  const int ranks = static_cast<int>(cores.size());
  if (ranks < 2 || ranks > 4) GTEST_SKIP() << ranks << " cores: a rank per core is 2 to 4 here";
  absl::StatusOr<std::vector<int>> fewest =
      CpusForLocalRank(cores, CpuBindMode::kAuto, ranks - 1, ranks);
  ASSERT_TRUE(fewest.ok()) << fewest.status();
  if (fewest->size() != 1) GTEST_SKIP() << "a core here has several hardware threads";
  const std::string cmd = absl::StrCat("tune --backend gloo --ranks ", ranks,
                                       " --sizes 4KiB --rounds 3 --out ", Temp("tuned_gloo.yaml"));
  Result unbound = RunCli(cmd);
  ASSERT_EQ(unbound.code, 0) << unbound.err << unbound.out;
  EXPECT_THAT(unbound.err, HasSubstr("tune: gloo ranks left unbound"));
  EXPECT_THAT(unbound.err, Not(HasSubstr("may run on one CPU only")));
  Result bound = RunCli(cmd + " --bind-to core");
  ASSERT_EQ(bound.code, 0) << bound.err << bound.out;
  EXPECT_THAT(bound.err, Not(HasSubstr("gloo ranks left unbound")));
  EXPECT_THAT(bound.err, HasSubstr("this rank may run on one CPU only (its affinity)"));
}

// Gloo's segment caps change nothing up to 2 * ranks * cap bytes (GlooRingSegmentCapInEffect):
// there the ring candidates run the static allreduce and are not measured again, and a cap equal
// to Gloo's default (the profile's 0) is no candidate at all.
TEST(Tune, GlooCandidatesThatRunTheSameAllreduceAreMeasuredOnce) {
  Result r = RunCli(absl::StrCat("tune --backend gloo --ranks 2 --bind-to none --sizes 4KiB,8MiB ",
                                 "--rounds 3 --json --out ", Temp("tuned_gloo_twins.yaml")));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["bands"].size(), 2u) << r.out;
  // 4 KiB: no cap is reached; 8 MiB: the default 1 MiB cap is, 4 and 16 MiB caps are not.
  EXPECT_THAT(j["bands"][0]["measured"].get<std::vector<std::string>>(),
              ::testing::ElementsAre("static", "bcube", "static (A/A)"))
      << j["bands"][0].dump();
  EXPECT_THAT(j["bands"][1]["measured"].get<std::vector<std::string>>(),
              ::testing::ElementsAre("static", "bcube", "ring/seg 4MiB", "static (A/A)"))
      << j["bands"][1].dump();
}

TEST(Tune, HelpStatesTheDecisionRuleAndBadArgumentsExitTwo) {
  Result help = RunCli("tune --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("paired round by round"));
  EXPECT_THAT(help.out, HasSubstr("A/A control's 75th percentile"));
  EXPECT_THAT(help.out, HasSubstr("--compare"));
  EXPECT_EQ(RunCli("tune --backend nccl").code, 2);
  EXPECT_EQ(RunCli("tune --ops broadcast").code, 2);
  EXPECT_EQ(RunCli("tune --sizes 3").code, 2);
  EXPECT_EQ(RunCli("tune --ranks 1").code, 2);
}

TEST(Tune, PerBandKnobsGiveTheSameResultsAtEveryBandEdge) {
  // Flat below 4 KiB, two-phase in 4 KiB chunks up to 64 KiB, 16 KiB chunks above: every path
  // and every edge, checked element by element.
  const config::TopologyFingerprint here = internal::selection::CurrentFingerprint("shm", 1, 3);
  const std::string path = Temp("bands.yaml");
  Write(path,
        TableFor(here,
                 "  - {backend: shm, op: allreduce, max_bytes: 4KiB, knob: flat_max_bytes, value: "
                 "4KiB}\n"
                 "  - {backend: shm, op: allreduce, max_bytes: max, knob: flat_max_bytes, value: "
                 "0}\n"
                 "  - {backend: shm, op: allreduce, max_bytes: 64KiB, knob: chunk_bytes, value: "
                 "4KiB}\n"
                 "  - {backend: shm, op: allreduce, max_bytes: max, knob: chunk_bytes, value: "
                 "16KiB}\n"));
  ScopedTable use(path);
  std::vector<absl::Status> st = OnRanks(3, [&](Communicator& comm) {
    if (comm.selection_reason().find("tuned table " + path) == std::string::npos) {
      return absl::InternalError(absl::StrCat("table not applied: ", comm.selection_reason()));
    }
    for (size_t count : {1u, 1023u, 1024u, 1025u, 4095u, 16384u, 16385u, 100001u}) {
      if (absl::Status s = CheckedAllreduce(comm, count); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
}

TEST(Tune, ATableForAnotherTopologyIsRefusedByFieldAndTheStaticProfileApplies) {
  config::TopologyFingerprint other = internal::selection::CurrentFingerprint("shm", 1, 2);
  other.ranks_per_host = 4;
  const std::string path = Temp("other.yaml");
  Write(path, TableFor(other,
                       "  - {backend: shm, op: allreduce, max_bytes: max, knob: chunk_bytes, "
                       "value: 64KiB}\n"));
  ScopedTable use(path);
  std::string reason;
  std::vector<absl::Status> st = OnRanks(2, [&](Communicator& comm) {
    if (comm.rank() == 0) reason = comm.selection_reason();
    return CheckedAllreduce(comm, 70000);
  });
  for (const absl::Status& s : st) ASSERT_TRUE(s.ok()) << s;
  const std::string base = path.substr(path.rfind('/') + 1);
  EXPECT_THAT(reason, HasSubstr("tuned table refused: ranks 0, 1: "));
  EXPECT_THAT(reason, HasSubstr(base + ":3:"));  // where the fingerprint sets ranks_per_host
  EXPECT_THAT(reason, HasSubstr("tuned for ranks_per_host=4, this job has 2"));
  EXPECT_THAT(reason, HasSubstr("the static profile applies"));
}

TEST(Tune, ACorruptOrHandEditedTableIsRefusedWithFileLineAndTheReason) {
  const config::TopologyFingerprint here = internal::selection::CurrentFingerprint("shm", 1, 2);
  struct Case {
    std::string entries;
    std::string reason;
  } cases[] = {
      {"  - {backend: shm, op: allreduce, max_bytes: max, knob: chunk_size, value: 64KiB}\n",
       "unknown shm knob 'chunk_size'"},
      {"  - {backend: shm, op: allreduce, max_bytes: max, knob: chunk_bytes, value: 64MiB}\n",
       "out of range"},
      {"  - {backend: shm, op: allreduce, max_bytes: max, knob: chunk_bytes, value: [\n", ""},
  };
  for (const Case& c : cases) {
    const std::string path = Temp("corrupt.yaml");
    Write(path, TableFor(here, c.entries));
    ScopedTable use(path);
    ProfileRequest req;
    req.world_size = 2;
    absl::StatusOr<EffectiveConfig> cfg = ResolveProfile(req);
    ASSERT_TRUE(cfg.ok()) << cfg.status();  // the profile itself still resolves
    EXPECT_EQ(cfg->tuning.loaded, nullptr);
    EXPECT_THAT(cfg->tuning.refused, HasSubstr(path + ":"));
    EXPECT_THAT(cfg->tuning.refused, HasSubstr(c.reason));
    ASSERT_FALSE(cfg->warnings.empty());
    EXPECT_THAT(cfg->warnings.back(), HasSubstr("the static profile applies"));
    EXPECT_THAT(cfg->Explain(), Not(HasSubstr("tuned.shm")));
    // A communicator still comes up, without the table.
    std::vector<absl::Status> st = OnRanks(2, [&](Communicator& comm) {
      if (comm.selection_reason().find("tuned table") != std::string::npos) {
        return absl::InternalError(comm.selection_reason());
      }
      return CheckedAllreduce(comm, 5000);
    });
    for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(Tune, RanksWithDifferentTablesAreNamedByTheConfigurationCheck) {
  const config::TopologyFingerprint here = internal::selection::CurrentFingerprint("shm", 1, 2);
  const std::string a = Temp("a.yaml"), b = Temp("b.yaml");
  Write(a, TableFor(here,
                    "  - {backend: shm, op: allreduce, max_bytes: max, knob: chunk_bytes, "
                    "value: 64KiB}\n"));
  Write(b, TableFor(here,
                    "  - {backend: shm, op: allreduce, max_bytes: max, knob: chunk_bytes, "
                    "value: 256KiB}\n"));
  std::vector<EffectiveConfig> cfgs;
  for (const std::string& path : {a, b}) {
    ScopedTable use(path);
    ProfileRequest req;
    req.world_size = 2;
    absl::StatusOr<EffectiveConfig> cfg = ResolveProfile(req);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    ASSERT_NE(cfg->tuning.loaded, nullptr) << cfg->tuning.refused;
    cfgs.push_back(*cfg);
  }
  std::shared_ptr<Store> store = CreateHashStore();
  std::vector<absl::Status> st(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back(
        [&, r] { st[r] = CheckSameConfigOnAllRanks(*store, r, 2, cfgs[r], absl::Seconds(10)); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : st) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("rank 1 differs from rank 0 on"));
    EXPECT_THAT(s.message(), HasSubstr("tuning.table_digest"));
  }
}

}  // namespace
}  // namespace adaptcomm

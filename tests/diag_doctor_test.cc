// `adaptcomm doctor`: the knowledge base, classification of the log fixtures, extraction of
// ranks and peers, and bounded memory on a large generated log.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "lib/diag/kb_similarity.h"
#include "lib/diag/knowledge_base.h"
#include "lib/diag/log_doctor.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::diag {
namespace {

std::string SourceDir() {
  const char* dir = std::getenv("ADAPTCOMM_SOURCE_DIR");
  if (dir != nullptr) return dir;
  std::string file = __FILE__;  // <source>/tests/diag_doctor_test.cc when run outside ctest
  return file.substr(0, file.rfind("/tests/"));
}

const KnowledgeBase& Kb() {
  static const KnowledgeBase* kb = [] {
    auto loaded = KnowledgeBase::Load(SourceDir() + "/configs/knowledge_base.yaml");
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status();
      return new KnowledgeBase();
    }
    return new KnowledgeBase(*std::move(loaded));
  }();
  return *kb;
}

TEST(KnowledgeBaseTest, EverySignatureHasClassCauseFixDocSourceAndExample) {
  ASSERT_GE(Kb().entries().size(), 40u);
  std::set<std::string> ids;
  for (const KbEntry& e : Kb().entries()) {
    EXPECT_TRUE(ids.insert(e.id).second) << "duplicate id " << e.id;
    EXPECT_FALSE(e.failure_class.empty()) << e.id;
    EXPECT_FALSE(e.cause.empty()) << e.id;
    EXPECT_FALSE(e.fix.empty()) << e.id;
    EXPECT_EQ(e.doc.rfind("https://", 0), 0u) << e.id;
    EXPECT_FALSE(e.source.empty()) << e.id;
    EXPECT_FALSE(e.examples.empty()) << e.id;
  }
}

// Entries whose lines are not (yet) backed by a public log line: adaptcomm's own formats, and
// signatures kept from before for which no real line was found. Every other entry must have a
// fixture of real lines.
const std::set<std::string>& EntriesWithoutPublicLines() {
  static const auto* ids = new std::set<std::string>{"adaptcomm_rendezvous_missing_rank",
                                                     "adaptcomm_op_timeout",
                                                     "adaptcomm_fallback",
                                                     "nccl_version_mismatch",
                                                     "cuda_illegal_address",
                                                     "nccl_remote_error"};
  return *ids;
}

// tests/fixtures/doctor/<id>.log holds real log lines from the public threads named in its
// comments (and in the entry's `source`) or, for signatures taken from the NCCL, PyTorch and Gloo
// sources, lines in the exact format the source file named prints; every line must be
// classified as <id>.
TEST(KnowledgeBaseTest, EveryRealLogLineClassifiesToItsEntry) {
  const std::filesystem::path dir = SourceDir() + "/tests/fixtures/doctor";
  std::set<std::string> covered;
  size_t checked = 0;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    if (file.path().extension() != ".log") continue;
    const std::string id = file.path().stem().string();
    covered.insert(id);
    const auto& entries = Kb().entries();
    EXPECT_TRUE(
        std::any_of(entries.begin(), entries.end(), [&](const KbEntry& e) { return e.id == id; }))
        << file.path() << " names no entry";
    std::ifstream in(file.path());
    std::string line;
    size_t lines_in_file = 0;
    for (int number = 1; std::getline(in, line); ++number) {
      if (line.empty() || line.rfind("# ", 0) == 0) continue;
      ++lines_in_file;
      const KbEntry* got = Kb().Classify(line);
      EXPECT_EQ(got == nullptr ? "(none)" : got->id, id)
          << file.path().filename().string() << ":" << number << ": " << line;
    }
    EXPECT_GT(lines_in_file, 0u) << file.path();
    checked += lines_in_file;
  }
  EXPECT_GE(checked, 100u);
  for (const KbEntry& e : Kb().entries()) {
    if (EntriesWithoutPublicLines().count(e.id) > 0) continue;
    EXPECT_EQ(covered.count(e.id), 1u)
        << e.id << " has no tests/fixtures/doctor/" << e.id << ".log";
  }
}

// The two classes the doctor missed in issue #11 (it said "No known failure signature found" and
// exited 0): PyTorch's heartbeat monitor and an NCCL library older than libtorch_cuda.so expects.
TEST(LogDoctorTest, HeartbeatTimeoutAndNcclSymbolSkewAreNamed) {
  LogDoctor doctor(Kb());
  std::istringstream in(
      // hiyouga/LlamaFactory#6953
      "[rank144]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 144] Heartbeat monitor timed out! "
      "Process will be terminated after dumping debug info. workMetaList_.size()=1\n"
      // pytorch/pytorch#119072
      "ImportError: /home/user/.local/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so: "
      "undefined symbol: ncclCommRegister\n");
  doctor.FeedStream(in, "mem");
  DoctorReport r = doctor.Report();
  ASSERT_EQ(r.causes.size(), 2u) << RenderDoctorText(r);
  EXPECT_EQ(r.causes[0].entry->id, "nccl_symbol_skew");  // the root cause first
  EXPECT_EQ(r.causes[1].entry->id, "watchdog_heartbeat_timeout");
  EXPECT_EQ(r.causes[1].origins.count("rank 144"), 1u);
  EXPECT_EQ(DoctorExitCode(r), 1);
  EXPECT_NE(RenderDoctorText(r).find("source:  pytorch/pytorch#119072"), std::string::npos);
}

// "last completed work" per rank: the rank that completed least is behind.
TEST(LogDoctorTest, WatchdogProgressNamesTheRankBehind) {
  LogDoctor doctor(Kb());
  std::istringstream in(
      "[rank0]:[E1206 18:44:16.994932383 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 0] Timeout at NCCL "
      "work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.\n"
      "[rank2]:[E1206 18:44:16.994961143 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 2] Timeout at NCCL "
      "work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7750.\n");
  doctor.FeedStream(in, "mem");
  DoctorReport r = doctor.Report();
  ASSERT_EQ(r.causes.size(), 1u);
  EXPECT_EQ(r.causes[0].entry->id, "nccl_watchdog_progress");
  EXPECT_EQ(r.causes[0].behind_origin, "rank 2");
  EXPECT_EQ(r.causes[0].lowest_seq.at("rank 2"), 7750u);
}

// Each example line must land on its own entry: proves both the pattern and the ordering.
TEST(KnowledgeBaseTest, EveryExampleClassifiesToItsOwnEntry) {
  for (const KbEntry& e : Kb().entries()) {
    for (const std::string& line : e.examples) {
      const KbEntry* got = Kb().Classify(line);
      ASSERT_NE(got, nullptr) << e.id << " does not match its example: " << line;
      EXPECT_EQ(got->id, e.id) << line;
    }
  }
}

TEST(KnowledgeBaseTest, OrdinaryLinesAreNotClassified) {
  for (const char* line :
       {"node1:1:1 [0] NCCL INFO Channel 00/32 : 0 1 2 3", "step 100 loss 2.31 tokens/s 40000",
        "[adaptcomm r0 I 10:00:00.000] creating communicator 'default'", ""}) {
    EXPECT_EQ(Kb().Classify(line), nullptr) << line;
  }
}

TEST(KnowledgeBaseTest, RejectsBadEntries) {
  auto bad_regex =
      KnowledgeBase::Parse("entries:\n  - {id: x, pattern: 'a(b', cause: c, fix: f}\n", "kb.yaml");
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_NE(bad_regex.status().message().find("bad pattern"), absl::string_view::npos);
  auto missing = KnowledgeBase::Parse("entries:\n  - {id: x, pattern: a, cause: c}\n", "kb.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'fix'"), absl::string_view::npos);
  // yaml-cpp keeps both copies of a repeated key (and `pattern` lookups see the first): refused.
  auto duplicate = KnowledgeBase::Parse(
      "entries:\n  - id: x\n    pattern: a\n    cause: c\n    fix: f\n    pattern: b\n", "kb.yaml");
  ASSERT_FALSE(duplicate.ok());
  EXPECT_EQ(duplicate.status().message(),
            "kb.yaml:6:5: duplicate key 'pattern' (first at kb.yaml:3:5): a key may appear only "
            "once in a map");
  EXPECT_EQ(KnowledgeBase::Load("/nonexistent/kb.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(LogDoctorTest, ExtractsOrigins) {
  EXPECT_EQ(ExtractOrigin("[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog"), "rank 3");
  EXPECT_EQ(ExtractOrigin("[Rank 12] Watchdog caught"), "rank 12");
  EXPECT_EQ(ExtractOrigin("[adaptcomm r5 E 04:12:55.123] timed out"), "rank 5");
  EXPECT_EQ(ExtractOrigin("node1:1234:5678 [3] NCCL WARN x"), "node1 gpu3");
  EXPECT_EQ(ExtractOrigin("gpu-node-07:88412:88577 [2] NCCL WARN Call"), "gpu-node-07 gpu2");
  EXPECT_EQ(ExtractOrigin("error on rank 7 while sending"), "rank 7");
  EXPECT_EQ(ExtractOrigin("RuntimeError: Socket Timeout"), "");
}

TEST(LogDoctorTest, ExtractsPeers) {
  EXPECT_EQ(ExtractPeers("Got completion from peer 10.20.1.14<47185> with error 12"),
            std::vector<std::string>{"10.20.1.14:47185"});
  EXPECT_EQ(ExtractPeers("Connection closed by peer [10.3.0.7]:36677"),
            std::vector<std::string>{"10.3.0.7:36677"});
  EXPECT_EQ(ExtractPeers("while trying to connect to (10.0.0.1, 29500)"),
            std::vector<std::string>{"10.0.0.1:29500"});
  EXPECT_EQ(ExtractPeers("a 1.2.3.4:5 and 1.2.3.4:5 and 6.7.8.9:10"),
            (std::vector<std::string>{"1.2.3.4:5", "6.7.8.9:10"}));
  EXPECT_TRUE(ExtractPeers("localGid ::ffff:10.20.1.13 version 2.19.3").empty());
}

struct Fixture {
  const char* file;
  const char* top_cause;  // first cause of the report
  const char* origin;     // must be among the top cause's origins ("" = don't check)
  const char* peer;       // must be among the top cause's peers ("" = don't check)
};

class DoctorFixtureTest : public ::testing::TestWithParam<Fixture> {};

TEST_P(DoctorFixtureTest, NamesTheRightCause) {
  const Fixture& f = GetParam();
  LogDoctor doctor(Kb());
  ASSERT_TRUE(doctor.FeedFile(SourceDir() + "/tests/fixtures/logs/" + f.file).ok());
  DoctorReport r = doctor.Report();
  ASSERT_FALSE(r.causes.empty()) << f.file;
  EXPECT_EQ(r.causes[0].entry->id, f.top_cause) << RenderDoctorText(r);
  if (*f.origin != '\0') {
    EXPECT_EQ(r.causes[0].origins.count(f.origin), 1u) << RenderDoctorText(r);
  }
  if (*f.peer != '\0') {
    EXPECT_EQ(r.causes[0].peers.count(f.peer), 1u) << RenderDoctorText(r);
  }
  // Root causes always precede symptoms.
  bool seen_symptom = false;
  for (const CauseSummary& c : r.causes) {
    if (!c.entry->root_cause) seen_symptom = true;
    EXPECT_FALSE(seen_symptom && c.entry->root_cause) << c.entry->id << " after a symptom";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, DoctorFixtureTest,
    ::testing::Values(
        Fixture{"watchdog_straggler.log", "watchdog_timeout", "rank 2", ""},
        Fixture{"ib_retry_exceeded.log", "ib_retry_exceeded", "node3 gpu5", "10.20.1.14:47185"},
        Fixture{"socket_ifname_missing.log", "socket_no_interface", "gpu-a1 gpu1", ""},
        Fixture{"gloo_peer_closed.log", "socket_closed_by_peer", "rank 1", "10.3.0.7:36677"},
        Fixture{"c10d_store_timeout.log", "c10d_store_timeout", "", "10.0.0.1:29500"},
        Fixture{"shm_too_small.log", "shm_create_failed", "node1 gpu1", ""},
        Fixture{"nccl_version_mismatch.log", "nccl_version_mismatch", "node2 gpu0", ""},
        Fixture{"cuda_driver_old.log", "cuda_driver_insufficient", "rank 0", ""},
        Fixture{"nccl_oom.log", "nccl_cuda_oom", "node1 gpu3", ""},
        Fixture{"nvlink_xid.log", "nvlink_error", "", ""},
        Fixture{"ib_hca_typo.log", "ib_hca_no_device", "node1 gpu0", ""},
        Fixture{"adaptcomm_rendezvous.log", "adaptcomm_rendezvous_missing_rank", "rank 2", ""},
        Fixture{"duplicate_gpu.log", "nccl_duplicate_gpu", "node1 gpu0", ""},
        Fixture{"ib_reg_mr.log", "ib_reg_mr_failed", "gpu-node-07 gpu2", ""}),
    [](const auto& info) {
      std::string name = info.param.file;
      name = name.substr(0, name.find('.'));
      for (char& c : name) {
        if (c == '_') c = 'X';
      }
      return name;
    });

TEST(LogDoctorTest, WatchdogNamesTheRankBehindAndJsonCarriesIt) {
  LogDoctor doctor(Kb());
  ASSERT_TRUE(doctor.FeedFile(SourceDir() + "/tests/fixtures/logs/watchdog_straggler.log").ok());
  DoctorReport r = doctor.Report();
  ASSERT_FALSE(r.causes.empty());
  EXPECT_EQ(r.causes[0].behind_origin, "rank 2");
  EXPECT_EQ(r.causes[0].lowest_seq.at("rank 2"), 4209u);
  EXPECT_EQ(r.causes[0].lines, 4u);
  auto j = nlohmann::json::parse(RenderDoctorJson(r));
  EXPECT_EQ(j["verdict"], "known_failure");
  EXPECT_EQ(j["exit_code"], 1);
  EXPECT_EQ(j["causes"][0]["id"], "watchdog_timeout");
  EXPECT_EQ(j["causes"][0]["class"], "timeout");
  EXPECT_EQ(j["causes"][0]["behind"]["origin"], "rank 2");
  EXPECT_EQ(j["causes"][0]["origins"]["rank 0"], 1);
  EXPECT_EQ(j["lines"], 10);
  EXPECT_NE(RenderDoctorText(r).find("behind:  rank 2 (lowest sequence number 4209)"),
            std::string::npos);
}

TEST(LogDoctorTest, UnknownNcclWarningsAreReported) {
  LogDoctor doctor(Kb());
  std::istringstream in(
      "node1:1:1 [0] NCCL WARN something nobody has seen before\n"
      "node1:1:1 [0] NCCL INFO fine\n");
  doctor.FeedStream(in, "mem");
  DoctorReport r = doctor.Report();
  EXPECT_TRUE(r.causes.empty());
  EXPECT_EQ(r.unclassified_warnings, 1u);
  EXPECT_EQ(r.unclassified_errors, 1u);
  ASSERT_EQ(r.unclassified_examples.size(), 1u);
  EXPECT_EQ(r.unclassified_examples[0].rfind("mem:1: ", 0), 0u);
  EXPECT_EQ(DoctorExitCode(r), 3);
}

// Error lines no entry explains make the run "not clean": counted, the first one quoted, exit 3
// (not 0) when nothing else was found, and the JSON says the same.
TEST(LogDoctorTest, UnexplainedErrorLinesAreCountedAndNotClean) {
  LogDoctor doctor(Kb());
  std::istringstream in(
      "step 100 loss 2.31 tokens/s 40000\n"
      "node1:1:1 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : "
      "libnccl-net.so: cannot open shared object file: No such file or directory\n"
      "RuntimeError: something this knowledge base has never seen\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/elastic/multiprocessing/errors/"
      "__init__.py\", line 355, in wrapper\n"
      "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96\n"
      "FATAL: worker 3 exited\n");
  doctor.FeedStream(in, "mem");
  DoctorReport r = doctor.Report();
  EXPECT_TRUE(r.causes.empty());
  EXPECT_EQ(r.unclassified_errors, 2u);
  EXPECT_EQ(r.unclassified_warnings, 0u);
  EXPECT_EQ(Verdict(r), DoctorVerdict::kUnrecognizedErrors);
  EXPECT_EQ(DoctorExitCode(r), 3);
  const std::string text = RenderDoctorText(r);
  EXPECT_NE(text.find("2 error line(s) matched no known signature; first: mem:3: RuntimeError: "
                      "something this knowledge base has never seen\n  then: mem:6: FATAL"),
            std::string::npos)
      << text;
  auto j = nlohmann::json::parse(RenderDoctorJson(r));
  EXPECT_EQ(j["verdict"], "unrecognized_errors");
  EXPECT_EQ(j["exit_code"], 3);
  EXPECT_EQ(j["unclassified_errors"], 2);
  EXPECT_EQ(j["unclassified_examples"].size(), 2u);

  LogDoctor clean(Kb());
  std::istringstream quiet("step 1 loss 2.0\nnode1:1:1 [0] NCCL INFO Connected all rings\n");
  clean.FeedStream(quiet, "mem");
  EXPECT_EQ(DoctorExitCode(clean.Report()), 0);
  EXPECT_EQ(nlohmann::json::parse(RenderDoctorJson(clean.Report()))["verdict"], "clean");
}

// A Python traceback counts once, and only when its exception line is neither explained nor an
// error line itself (KeyboardInterrupt); a traceback ending in a known error adds nothing.
TEST(LogDoctorTest, TracebacksCountOnlyWhenTheirExceptionIsUnexplained) {
  LogDoctor doctor(Kb());
  std::istringstream in(
      "[rank0]: Traceback (most recent call last):\n"
      "[rank0]:   File \"train.py\", line 12, in <module>\n"
      "[rank0]: RuntimeError: Socket Timeout\n"
      "Traceback (most recent call last):\n"
      "  File \"train.py\", line 40, in <module>\n"
      "KeyboardInterrupt\n");
  doctor.FeedStream(in, "mem");
  DoctorReport r = doctor.Report();
  ASSERT_EQ(r.causes.size(), 1u);
  EXPECT_EQ(r.causes[0].entry->id, "c10d_store_timeout");
  EXPECT_EQ(r.unclassified_errors, 1u);
  ASSERT_EQ(r.unclassified_examples.size(), 1u);
  EXPECT_EQ(r.unclassified_examples[0], "mem:4: Traceback (most recent call last):");
  EXPECT_EQ(DoctorExitCode(r), 1);  // a known cause was found
}

TEST(LogDoctorTest, HealthyLinesDoNotLookLikeErrors) {
  for (const char* line :
       {"step 100 loss 2.31",
        "node1:1:1 [0] NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v8 symbol.",
        "  File \"/x/errors/__init__.py\", line 355, in wrapper",
        "frame #1: <unknown function> + 0xe5c6fc (0x7fb3be0796fc in libtorch_cuda.so)",
        "Exception raised from checkTimeout at ProcessGroupNCCL.cpp:632 (most recent call "
        "first):"}) {
    EXPECT_FALSE(LooksLikeError(line)) << line;
  }
  for (const char* line : {"RuntimeError: boom", "node1:1:1 [0] NCCL WARN whatever",
                           "ERROR:root:failed", "Segmentation fault (core dumped)"}) {
    EXPECT_TRUE(LooksLikeError(line)) << line;
  }
}

// Every entry belongs to a declared family, every family has entries, and the signatures taken
// from the sources say which file prints them.
TEST(KnowledgeBaseTest, EveryEntryBelongsToADeclaredFamily) {
  ASSERT_GE(Kb().families().size(), 15u);
  std::map<std::string, size_t> per_family;
  for (const KbEntry& e : Kb().entries()) {
    EXPECT_NE(Kb().Family(e.family), nullptr) << e.id << " has family '" << e.family << "'";
    ++per_family[e.family];
    if (e.culprit_group > 0) {
      EXPECT_FALSE(e.emitted_by.empty()) << e.id;
    }
  }
  for (const KbFamily& f : Kb().families()) {
    EXPECT_GT(per_family[f.id], 0u) << "family " << f.id << " has no entry";
    EXPECT_FALSE(f.title.empty()) << f.id;
    EXPECT_FALSE(f.summary.empty()) << f.id;
  }
  EXPECT_GE(Kb().entries().size(), 69u);
}

TEST(KnowledgeBaseTest, IncludesFamiliesAndCulpritGroupsAreChecked) {
  const std::string dir = ::testing::TempDir() + "/kb_include";
  std::filesystem::create_directories(dir + "/more");
  {
    std::ofstream(dir + "/more/part.yaml")
        << "family: b\nentries:\n  - {id: y, pattern: 'Rank (\\d+) lost', culprit_group: 1,"
           " cause: c, fix: f}\n";
  }
  const std::string main =
      "families:\n  - {id: a, title: A, summary: s}\n  - {id: b, title: B, summary: s}\n"
      "entries:\n  - {id: x, family: a, pattern: lost, cause: c, fix: f}\n"
      "  - include: more/part.yaml\n";
  auto kb = KnowledgeBase::Parse(main, dir + "/kb.yaml");
  ASSERT_TRUE(kb.ok()) << kb.status();
  ASSERT_EQ(kb->entries().size(), 2u);
  EXPECT_EQ(kb->entries()[1].family, "b");          // the included file's default
  EXPECT_EQ(kb->Classify("Rank 4 lost")->id, "x");  // first match wins: the include's place
  EXPECT_EQ(ExtractCulprits(kb->entries()[1], "Rank 4 lost"), std::vector<std::string>{"rank 4"});

  auto undeclared = KnowledgeBase::Parse(
      "families:\n  - {id: a, title: A, summary: s}\n"
      "entries:\n  - {id: x, family: typo, pattern: p, cause: c, fix: f}\n",
      dir + "/kb.yaml");
  ASSERT_FALSE(undeclared.ok());
  EXPECT_NE(undeclared.status().message().find("undeclared family 'typo'"), std::string::npos);
  auto bad_group = KnowledgeBase::Parse(
      "entries:\n  - {id: x, pattern: 'p(\\d)', culprit_group: 2, cause: c, fix: f}\n", "kb.yaml");
  ASSERT_FALSE(bad_group.ok());
  EXPECT_NE(bad_group.status().message().find("culprit_group 2"), std::string::npos);
  auto missing = KnowledgeBase::Parse("entries:\n  - include: nowhere.yaml\n", dir + "/kb.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(LogDoctorTest, ExtractsTheRanksAtFault) {
  const KbEntry* e =
      Kb().Classify("[Rank 0]: Ranks 2, 5, 11 failed to pass monitoredBarrier in 30 ms");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(
      ExtractCulprits(*e, "[Rank 0]: Ranks 2, 5, 11 failed to pass monitoredBarrier in 30 ms"),
      (std::vector<std::string>{"rank 2", "rank 5", "rank 11"}));
  const std::string self =
      "[PG ID 0 PG GUID 0 Rank 3] Received a dump signal due to a collective timeout from this "
      "local rank and we will try our best to dump the debug info.";
  e = Kb().Classify(self);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->id, "watchdog_dump_signal");
  EXPECT_TRUE(ExtractCulprits(*e, self).empty());  // no other rank named
}

// One source-derived line per family: the family, the advice and the rank at fault.
struct FamilyCase {
  const char* fixture;  // tests/fixtures/doctor/<fixture>.log, also the expected entry
  const char* family;
  const char* advice;   // must occur in the fix
  const char* culprit;  // must be among the ranks at fault ("" = none named)
};

class DoctorFamilyTest : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(DoctorFamilyTest, NamesFamilyAdviceAndRankAtFault) {
  const FamilyCase& f = GetParam();
  LogDoctor doctor(Kb());
  std::ifstream in(SourceDir() + "/tests/fixtures/doctor/" + f.fixture + ".log");
  ASSERT_TRUE(in.good()) << f.fixture;
  std::string line;
  for (uint64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.rfind("# ", 0) != 0) doctor.FeedLine(line, f.fixture, number);
  }
  DoctorReport r = doctor.Report();
  ASSERT_EQ(r.causes.size(), 1u) << RenderDoctorText(r);
  const CauseSummary& c = r.causes[0];
  EXPECT_EQ(c.entry->id, f.fixture);
  EXPECT_EQ(c.entry->family, f.family);
  EXPECT_NE(c.entry->fix.find(f.advice), std::string::npos) << c.entry->fix;
  if (*f.culprit != '\0') {
    EXPECT_EQ(c.culprits.count(f.culprit), 1u) << RenderDoctorText(r);
    const std::string text = RenderDoctorText(r);
    const size_t at = text.find("   culprit: ");
    ASSERT_NE(at, std::string::npos) << text;
    EXPECT_NE(text.substr(at, text.find('\n', at) - at).find(std::string(f.culprit) + " ("),
              std::string::npos)
        << text;
  } else {
    EXPECT_TRUE(c.culprits.empty()) << RenderDoctorText(r);
  }
  EXPECT_EQ(r.unclassified_errors, 0u);
  auto j = nlohmann::json::parse(RenderDoctorJson(r));
  EXPECT_EQ(j["causes"][0]["family"], f.family);
  EXPECT_EQ(j["causes"][0]["culprits"].size(), c.culprits.size());
}

INSTANTIATE_TEST_SUITE_P(
    Families, DoctorFamilyTest,
    ::testing::Values(
        FamilyCase{"monitored_barrier_rank_failed", "monitored-barrier", "at fault", "rank 3"},
        FamilyCase{"monitored_barrier_peer_side", "monitored-barrier", "rank 0's log", ""},
        FamilyCase{"nccl_socket_truncated", "socket", "NCCL_PROTO", ""},
        FamilyCase{"nccl_socket_connect_exhausted", "socket", "NCCL_SOCKET_IFNAME", ""},
        FamilyCase{"gloo_pair_io_error", "socket", "GLOO_SOCKET_IFNAME", ""},
        FamilyCase{"nccl_proxy_service_failed", "proxy", "WARN just before", "rank 11"},
        FamilyCase{"nccl_proxy_call_failed", "proxy", "WARN lines logged just before", "rank 1"},
        FamilyCase{"ib_async_event", "ib", "ibstat", ""},
        FamilyCase{"nccl_bootstrap_root_mismatch", "bootstrap", "leftover processes", ""},
        FamilyCase{"nccl_ring_no_loopback", "config", "identical on all ranks", ""},
        FamilyCase{"ib_incompatible_devices", "config", "NCCL_IB_HCA", ""},
        FamilyCase{"nccl_library_too_old", "version", "LD_LIBRARY_PATH", ""},
        FamilyCase{"nccl_proxy_cuda_context", "cuda", "Xid", ""},
        FamilyCase{"watchdog_dump_signal", "timeout", "lowest", "rank 7"},
        FamilyCase{"nccl_comm_aborted", "timeout", "first failure", ""},
        FamilyCase{"gloo_store_wait_timeout", "store", "init_method", ""},
        FamilyCase{"c10d_store_barrier_timeout", "store", "num_workers_joined", ""},
        FamilyCase{"remote_process_exited", "peer", "dmesg", ""},
        FamilyCase{"nccl_cuda_oom", "memory", "headroom", ""},
        FamilyCase{"gpu_fell_off_bus", "gpu-hardware", "Drain the node", ""},
        FamilyCase{"p2p_failure", "p2p", "NCCL_P2P_LEVEL", ""},
        FamilyCase{"collective_mismatch", "usage", "same order", ""},
        FamilyCase{"nccl_duplicate_gpu", "usage", "CUDA_VISIBLE_DEVICES", "rank 2"},
        FamilyCase{"nccl_argument_check", "usage", "communicator's GPU", ""},
        FamilyCase{"nccl_net_count_mismatch", "config", "NCCL_IB_HCA", ""},
        FamilyCase{"nccl_unhandled_system_error", "nccl-result", "NCCL_DEBUG=INFO", ""},
        FamilyCase{"elastic_child_killed", "process", "killed process", ""}),
    [](const auto& info) {
      std::string name = info.param.fixture;
      for (char& c : name) {
        if (c == '_') c = 'X';
      }
      return name;
    });

// The three reports the doctor used to meet with silence (exit 3): a socket-transport size
// mismatch, a proxy-thread connect failure and Gloo's monitored barrier naming a faulty rank.
TEST(LogDoctorTest, FormerlyMissedReportsAreNamed) {
  struct Case {
    const char* file;
    const char* id;
    const char* family;
    const char* origin;
    const char* culprit;
    const char* peer;
  };
  for (const Case& k : {Case{"socket_truncated.log", "nccl_socket_truncated", "socket",
                             "node1 gpu0", "", "10.0.0.2:43215"},
                        Case{"proxy_connect.log", "nccl_proxy_service_failed", "proxy",
                             "gpu-a3 gpu3", "rank 3", ""},
                        Case{"gloo_monitored_barrier.log", "monitored_barrier_rank_failed",
                             "monitored-barrier", "rank 0", "rank 3", ""}}) {
    LogDoctor doctor(Kb());
    ASSERT_TRUE(doctor.FeedFile(SourceDir() + "/tests/fixtures/logs/" + k.file).ok());
    DoctorReport r = doctor.Report();
    const std::string text = RenderDoctorText(r);
    ASSERT_FALSE(r.causes.empty()) << k.file;
    EXPECT_EQ(DoctorExitCode(r), 1) << text;
    EXPECT_EQ(r.unclassified_errors, 0u) << text;
    const CauseSummary& top = r.causes[0];
    EXPECT_EQ(top.entry->id, k.id) << text;
    EXPECT_EQ(top.entry->family, k.family);
    EXPECT_EQ(top.origins.count(k.origin), 1u) << text;
    if (*k.culprit != '\0') {
      EXPECT_EQ(top.culprits.count(k.culprit), 1u) << text;
    }
    if (*k.peer != '\0') {
      EXPECT_EQ(top.peers.count(k.peer), 1u) << text;
    }
    EXPECT_NE(text.find(std::string("] ") + k.id + " (" + k.family), std::string::npos) << text;
    auto j = nlohmann::json::parse(RenderDoctorJson(r));
    EXPECT_EQ(j["causes"][0]["id"], k.id);
    EXPECT_EQ(j["causes"][0]["family"], k.family);
    if (*k.culprit != '\0') {
      EXPECT_EQ(j["causes"][0]["culprits"].count(k.culprit), 1u) << j.dump(2);
    }
  }
}

// A reworded message of a known family (NCCL changing its wording between releases) matches no
// pattern, but the report names the family it resembles, with its cause and fix, and exits 4.
TEST(LogDoctorTest, AVariantOfAKnownFamilyIsSaidToResembleIt) {
  const std::string variant =
      "node5:2201:2290 [4] NCCL WARN NET/IB : mlx5_4:1 Got fatal async event : local "
      "catastrophic error";
  ASSERT_EQ(Kb().Classify(variant), nullptr);
  LogDoctor doctor(Kb());
  std::istringstream in("node5:2201:2201 [4] NCCL INFO Channel 00/02 : 0 1\n" + variant + "\n");
  doctor.FeedStream(in, "mem");
  DoctorReport r = doctor.Report();
  EXPECT_TRUE(r.causes.empty());
  EXPECT_EQ(r.unclassified_errors, 1u);
  ASSERT_EQ(r.resemblances.size(), 1u) << RenderDoctorText(r);
  const ResemblanceSummary& s = r.resemblances[0];
  EXPECT_EQ(s.family, "ib");
  EXPECT_EQ(s.closest->id, "ib_async_event");
  EXPECT_GE(s.score, kResemblanceThreshold);
  EXPECT_EQ(s.first_location, "mem:2");
  EXPECT_NE(std::find(s.shared.begin(), s.shared.end(), "catastrophic"), s.shared.end());
  EXPECT_EQ(Verdict(r), DoctorVerdict::kResemblesKnownFamily);
  EXPECT_EQ(DoctorExitCode(r), 4);
  const std::string text = RenderDoctorText(r);
  EXPECT_NE(text.find("  - ib (InfiniBand / RoCE / SHARP): 1 line(s), first at mem:2; closest "
                      "ib_async_event (similarity "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("    fix:     On the node and device named"), std::string::npos) << text;
  auto j = nlohmann::json::parse(RenderDoctorJson(r));
  EXPECT_EQ(j["verdict"], "resembles_known_family");
  EXPECT_EQ(j["exit_code"], 4);
  ASSERT_EQ(j["resembles"].size(), 1u);
  EXPECT_EQ(j["resembles"][0]["family"], "ib");
  EXPECT_EQ(j["resembles"][0]["closest"], "ib_async_event");

  // Further rewordings, one per family: each is closest to its own family.
  for (const auto& [line, family] : std::vector<std::pair<std::string, std::string>>{
           {"[Rank 0]: Rank 4 did not pass the monitoredBarrier within 30000 ms",
            "monitored-barrier"},
           {"gpu-a3:918:1204 [3] NCCL WARN [Proxy Service 3] Could not execute operation Connect "
            "for rank 5, error 3",
            "proxy"},
           {"node1:2351:2410 [0] NCCL WARN NET/Socket : peer 10.0.0.2<43215> message size "
            "mismatch : receiving 1048576 bytes instead of 524288",
            "socket"}}) {
    ASSERT_EQ(Kb().Classify(line), nullptr) << line;
    std::optional<Resemblance> got = Kb().similarity().Resembles(line);
    const Resemblance closest = Kb().similarity().Closest(line);
    ASSERT_TRUE(got.has_value()) << line << ": closest " << closest.entry->id << " at "
                                 << closest.score;
    EXPECT_EQ(got->entry->family, family) << line;
  }
}

// A line of no family at all stays an unknown failure: exit 3, nothing said to resemble it.
TEST(LogDoctorTest, ALineOfNoFamilyStillExitsThreeWithoutAFalseMatch) {
  const std::vector<std::string> lines = {
      "ValueError: invalid literal for int() with base 10: 'abc'",
      "RuntimeError: something this knowledge base has never seen", "FATAL: worker 3 exited",
      "KeyError: 'model.layers.12.mlp.gate_proj.weight' not found in checkpoint shard",
      "misc/socket.cc:441 NCCL WARN socketFinalizeAccept: wrong type 4 != 3"};
  for (const std::string& line : lines) {
    EXPECT_FALSE(Kb().similarity().Resembles(line).has_value())
        << line << " resembles " << Kb().similarity().Closest(line).entry->id;
  }
  LogDoctor doctor(Kb());
  ASSERT_TRUE(doctor.FeedFile(SourceDir() + "/tests/fixtures/logs/unknown_failure.log").ok());
  for (size_t i = 0; i < lines.size(); ++i) doctor.FeedLine(lines[i], "mem", i + 1);
  DoctorReport r = doctor.Report();
  EXPECT_TRUE(r.causes.empty());
  EXPECT_TRUE(r.resemblances.empty()) << RenderDoctorText(r);
  EXPECT_EQ(r.unclassified_errors, 2u + lines.size());
  EXPECT_EQ(DoctorExitCode(r), 3);
  auto j = nlohmann::json::parse(RenderDoctorJson(r));
  EXPECT_EQ(j["verdict"], "unrecognized_errors");
  EXPECT_TRUE(j["resembles"].empty());
}

TEST(KnowledgeBaseTest, SignatureWordsDropNumbersHostsAndFramingWords) {
  EXPECT_EQ(SignatureWords("node3:21457:21530 [5] NCCL WARN Ranks 1, 3 failed in 30000 ms"),
            (std::vector<std::string>{"rank", "failed"}));
  EXPECT_EQ(SignatureWords("Proxy Call to rank 0 failed (Connect)"),
            (std::vector<std::string>{"proxy", "call", "rank", "failed", "connect"}));
  EXPECT_TRUE(SignatureWords("12 0x7f 10.0.0.1:29500").empty());
}

long PeakRssKiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// A ~17 MB log with 4000 distinct ranks and 10000 distinct peers plus one 2 MB line without a
// newline: the report stays within its caps and peak memory grows by far less than the file.
TEST(LogDoctorTest, LargeLogInBoundedMemory) {
  const std::string path = ::testing::TempDir() + "/doctor_large.log";
  {
    std::ofstream out(path);
    const std::string noise =
        "node1:1:1 [0] NCCL INFO Channel 03/32 : 0[0] -> 1[1] via P2P/IPC/read " +
        std::string(40, 'x') + "\n";
    for (int i = 0; i < 150000; ++i) {
      out << noise;
      if (i % 15 == 0) {
        out << "[rank" << (i / 15) % 4000 << "]: RuntimeError: [pair.cc:598] Connection closed "
            << "by peer [10.0." << (i / 15) % 250 << ".1]:" << (1000 + (i / 15) % 10000) << "\n";
      }
    }
    out << "NCCL WARN Cuda failure 'out of memory' " << std::string(2 << 20, 'y');
  }
  const long before = PeakRssKiB();
  LogDoctor doctor(Kb());
  ASSERT_TRUE(doctor.FeedFile(path).ok());
  DoctorReport r = doctor.Report();
  const long grown_kib = PeakRssKiB() - before;
  std::remove(path.c_str());

  EXPECT_EQ(r.lines, 150000u + 10000u + 1u);
  EXPECT_EQ(r.truncated_lines, 1u);
  ASSERT_EQ(r.causes.size(), 2u);
  // The truncated last line still counts (its start holds the signature).
  EXPECT_EQ(r.causes[0].entry->id, "socket_closed_by_peer");
  EXPECT_EQ(r.causes[0].lines, 10000u);
  // Ranks cycle 0..3999 over 10000 lines (2.5 cycles): the first kMaxOriginsPerCause ranks are
  // kept and counted in each of the 3 passes over them; every other line is dropped.
  EXPECT_EQ(r.causes[0].origins.size(), kMaxOriginsPerCause);
  EXPECT_EQ(r.causes[0].origins_dropped, 10000u - 3 * kMaxOriginsPerCause);
  EXPECT_EQ(r.causes[0].peers.size(), kMaxPeersPerCause);
  EXPECT_EQ(r.causes[0].peers_dropped, 10000u - kMaxPeersPerCause);
  EXPECT_EQ(r.causes[1].entry->id, "nccl_cuda_oom");
  EXPECT_LE(r.causes[1].first_example.size(), kMaxExampleBytes + 3);
  EXPECT_LT(grown_kib, 16 * 1024) << "peak RSS grew by " << grown_kib << " KiB";
}

}  // namespace
}  // namespace adaptcomm::diag

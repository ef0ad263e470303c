// `adaptcomm doctor`: the knowledge base, classification of the log fixtures, extraction of
// ranks and peers, and bounded memory on a large generated log.
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
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

TEST(KnowledgeBaseTest, HasTwentyOrMoreSignaturesEachWithCauseFixDocAndExample) {
  ASSERT_GE(Kb().entries().size(), 20u);
  std::set<std::string> ids;
  for (const KbEntry& e : Kb().entries()) {
    EXPECT_TRUE(ids.insert(e.id).second) << "duplicate id " << e.id;
    EXPECT_FALSE(e.cause.empty()) << e.id;
    EXPECT_FALSE(e.fix.empty()) << e.id;
    EXPECT_EQ(e.doc.rfind("https://", 0), 0u) << e.id;
    EXPECT_FALSE(e.examples.empty()) << e.id;
  }
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
  EXPECT_EQ(j["causes"][0]["id"], "watchdog_timeout");
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
  ASSERT_EQ(r.unclassified_examples.size(), 1u);
  EXPECT_EQ(r.unclassified_examples[0].rfind("mem:1: ", 0), 0u);
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

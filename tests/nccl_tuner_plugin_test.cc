// The NCCL tuner plugin (plugins/nccl_tuner, issue #15 item 4) called through its C interface
// the way NCCL 2.28 calls it (src/plugin/tuner.cc, enqueue.cc): dlopen() the built .so, look up
// ncclTunerPlugin_v5 (and the older versions), init with nRanks/nNodes, then getCollInfo with
// NCCL's float[7][3] cost table cast to float**. No GPU needed.
#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/nccl_tuner/nccl_tuner_abi.h"
#include "tests/profile_test_util.h"

namespace adaptcomm::nccl_tuner {
namespace {

using ::testing::HasSubstr;

constexpr int kAlgos = kNcclNumAlgorithms;
constexpr int kProtos = kNcclNumProtocols;
constexpr float kIgnore = kNcclAlgoProtoIgnore;

std::vector<std::string>& Logged() {
  static auto* lines = new std::vector<std::string>;
  return *lines;
}

void Logger(NcclLogLevel level, unsigned long /*flags*/, const char* /*file*/, int /*line*/,
            const char* fmt, ...) {
  char buffer[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(buffer, sizeof(buffer), fmt, args);
  va_end(args);
  Logged().push_back(std::string(level == kNcclLogWarn ? "WARN " : "INFO ") + buffer);
}

size_t CountLogged(const std::string& part) {
  size_t n = 0;
  for (const std::string& line : Logged()) n += line.find(part) != std::string::npos;
  return n;
}

std::string Fixture(const std::string& name) {
  return adaptcomm::testing::SourceDir() + "/tests/fixtures/tuned/" + name;
}

// NCCL's cost table: positive estimated times, -1 where NCCL cannot run the combination.
struct CostTable {
  float cell[kAlgos][kProtos];
  CostTable() {
    for (int a = 0; a < kAlgos; ++a) {
      for (int p = 0; p < kProtos; ++p) cell[a][p] = 10.0f + a * kProtos + p;
    }
    // CollNet, NVLS and PAT unavailable, as on a single node without NVSwitch.
    for (int a : {kNcclAlgoCollnetDirect, kNcclAlgoCollnetChain, kNcclAlgoNvls, kNcclAlgoNvlsTree,
                  kNcclAlgoPat}) {
      for (int p = 0; p < kProtos; ++p) cell[a][p] = kIgnore;
    }
  }
  float** AsNccl() { return reinterpret_cast<float**>(cell); }
};

// Every cell equals the untouched table except (algo, proto), which is 0.
void ExpectOnlyChosen(const CostTable& got, int algo, int proto, const std::string& what) {
  const CostTable fresh;
  for (int a = 0; a < kAlgos; ++a) {
    for (int p = 0; p < kProtos; ++p) {
      float want = (a == algo && p == proto) ? 0.0f : fresh.cell[a][p];
      EXPECT_EQ(got.cell[a][p], want) << what << " algo " << a << " proto " << p;
    }
  }
}
void ExpectUntouched(const CostTable& got, const std::string& what) {
  ExpectOnlyChosen(got, -1, -1, what);
}

class TunerPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef ADAPTCOMM_NCCL_TUNER_PLUGIN
    GTEST_SKIP() << "the NCCL tuner plugin is built only where nccl.h is found";
#else
    // RTLD_NODELETE: what the plugin's libraries keep in globals (yaml-cpp, abseil) stays
    // reachable after dlclose, so LeakSanitizer reports only what the plugin itself loses.
    handle_ = dlopen(ADAPTCOMM_NCCL_TUNER_PLUGIN, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    ASSERT_NE(handle_, nullptr) << dlerror();
    v5_ = static_cast<const NcclTunerV5*>(dlsym(handle_, "ncclTunerPlugin_v5"));
    ASSERT_NE(v5_, nullptr);
    Logged().clear();
#endif
  }
  void TearDown() override {
    unsetenv("ADAPTCOMM_NCCL_TUNER_TABLE");
    if (handle_ != nullptr) dlclose(handle_);
  }

  void* InitV5(const std::string& table, size_t ranks, size_t nodes) {
    if (table.empty()) {
      unsetenv("ADAPTCOMM_NCCL_TUNER_TABLE");
    } else {
      setenv("ADAPTCOMM_NCCL_TUNER_TABLE", table.c_str(), 1);
    }
    NcclNvlDomainInfoV5 nvl{1, static_cast<int>(ranks), static_cast<int>(ranks)};
    NcclTunerConstantsV5 constants{};
    constants.baseLatencies[kNcclAlgoRing][kNcclProtoSimple] = 8.4;
    void* context = reinterpret_cast<void*>(0x1);  // must be overwritten
    EXPECT_EQ(v5_->init(&context, /*commId=*/0x1234, ranks, nodes, Logger, &nvl, &constants),
              kNcclSuccess);
    EXPECT_EQ(constants.baseLatencies[kNcclAlgoRing][kNcclProtoSimple], 8.4);  // left alone
    EXPECT_NE(context, reinterpret_cast<void*>(0x1));
    return context;
  }

  // getCollInfo as NCCL 2.28 calls it: nChannels starts at 0.
  int Ask(void* context, NcclFunc func, size_t bytes, CostTable& table) {
    int channels = 0;
    EXPECT_EQ(v5_->getCollInfo(context, func, bytes, /*numPipeOps=*/1, table.AsNccl(), kAlgos,
                               kProtos, /*regBuff=*/0, &channels),
              kNcclSuccess);
    return channels;
  }

  void* handle_ = nullptr;
  const NcclTunerV5* v5_ = nullptr;
};

TEST_F(TunerPlugin, ExportsOnlyThePluginSymbolsWithItsName) {
  EXPECT_STREQ(v5_->name, "adaptcomm");
  for (const char* name :
       {"ncclTunerPlugin_v5", "ncclTunerPlugin_v4", "ncclTunerPlugin_v3", "ncclTunerPlugin_v2"}) {
    EXPECT_NE(dlsym(handle_, name), nullptr) << name;
  }
  // Not v6: NCCL releases that know v6 try it first, and its getChunkSize member is not ours.
  // (The nccl_tuner_exports test checks that nothing else is exported.)
  EXPECT_EQ(dlsym(handle_, "ncclTunerPlugin_v6"), nullptr);
}

TEST_F(TunerPlugin, V5ChoosesTheTunedAlgorithmProtocolAndChannelsPerBand) {
  void* context = InitV5(Fixture("good.yaml"), /*ranks=*/2, /*nodes=*/1);
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(CountLogged("INFO adaptcomm tuner: 4 NCCL bands from"), 1u);

  // good.yaml allreduce: (0, 64 KiB] tree/ll 8 ch; (64 KiB, 4 MiB] ring/ll128; above ring/simple
  // 32 ch.
  struct Case {
    size_t bytes;
    int algo, proto, channels;
  } cases[] = {
      {8, kNcclAlgoTree, kNcclProtoLl, 8},
      {64 << 10, kNcclAlgoTree, kNcclProtoLl, 8},
      {(64 << 10) + 1, kNcclAlgoRing, kNcclProtoLl128, 0},
      {1 << 20, kNcclAlgoRing, kNcclProtoLl128, 0},
      {size_t{256} << 20, kNcclAlgoRing, kNcclProtoSimple, 32},
  };
  for (const Case& c : cases) {
    CostTable table;
    int channels = Ask(context, kNcclFuncAllReduce, c.bytes, table);
    ExpectOnlyChosen(table, c.algo, c.proto, "allreduce " + std::to_string(c.bytes));
    EXPECT_EQ(channels, c.channels) << c.bytes;
  }

  // allgather (0, 1 MiB]: channels only; the cost table is NCCL's.
  CostTable gather;
  EXPECT_EQ(Ask(context, kNcclFuncAllGather, 64 << 10, gather), 4);
  ExpectUntouched(gather, "allgather 64 KiB");
  CostTable big_gather;
  EXPECT_EQ(Ask(context, kNcclFuncAllGather, 2 << 20, big_gather), 0);  // above its last band
  ExpectUntouched(big_gather, "allgather 2 MiB");

  // No band for broadcast, and none for send/recv (not a tuned function).
  for (NcclFunc f : {kNcclFuncBroadcast, kNcclFuncSendRecv}) {
    CostTable table;
    EXPECT_EQ(Ask(context, f, 1 << 20, table), 0);
    ExpectUntouched(table, "func " + std::to_string(f));
  }
  EXPECT_EQ(CountLogged("WARN"), 0u);
  EXPECT_EQ(v5_->finalize(context), kNcclSuccess);
}

TEST_F(TunerPlugin, IgnoredEntryStaysIgnoredAndIsReportedOnce) {
  const std::string path = ::testing::TempDir() + "tuner_nvls.yaml";
  {
    FILE* f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs(
        "schema: 1\nkind: adaptcomm-tuned\n"
        "fingerprint: {hosts: 2, ranks_per_host: 4, cores: 2, backend: nccl, gloo: \"\", "
        "nccl: \"2.28.9\", gpu: \"H100\", interconnect: \"\"}\n"
        "entries:\n"
        "  - {backend: nccl, op: allreduce, max_bytes: max, algorithm: nvls, protocol: simple, "
        "channels: 16}\n",
        f);
    fclose(f);
  }
  void* context = InitV5(path, /*ranks=*/8, /*nodes=*/2);
  ASSERT_NE(context, nullptr);
  for (int i = 0; i < 3; ++i) {
    CostTable table;
    EXPECT_EQ(Ask(context, kNcclFuncAllReduce, 1 << 20, table), 0);  // no channels either
    ExpectUntouched(table, "nvls unavailable");
    EXPECT_EQ(table.cell[kNcclAlgoNvls][kNcclProtoSimple], kIgnore);
  }
  EXPECT_EQ(CountLogged("NCCL cannot run this algorithm/protocol here"), 1u);
  EXPECT_EQ(CountLogged("nccl allreduce (0 B, max]: nvls/simple, 16 channels"), 1u);

  // Where NCCL can run NVLS, the same band chooses it.
  CostTable nvls;
  nvls.cell[kNcclAlgoNvls][kNcclProtoSimple] = 3.0f;
  EXPECT_EQ(Ask(context, kNcclFuncAllReduce, 1 << 20, nvls), 16);
  EXPECT_EQ(nvls.cell[kNcclAlgoNvls][kNcclProtoSimple], 0.0f);
  EXPECT_EQ(nvls.cell[kNcclAlgoRing][kNcclProtoSimple], CostTable().cell[kNcclAlgoRing][2]);
  EXPECT_EQ(v5_->finalize(context), kNcclSuccess);
  std::remove(path.c_str());
}

TEST_F(TunerPlugin, OtherTopologyLeavesNcclAloneAndSaysWhyOnce) {
  // good.yaml is tuned for 1 host x 2 ranks.
  for (int i = 0; i < 2; ++i) {
    void* context = InitV5(Fixture("good.yaml"), /*ranks=*/4, /*nodes=*/1);
    CostTable table;
    EXPECT_EQ(Ask(context, kNcclFuncAllReduce, 8, table), 0);
    ExpectUntouched(table, "4 ranks");
    EXPECT_EQ(v5_->finalize(context), kNcclSuccess);
  }
  EXPECT_EQ(CountLogged("WARN adaptcomm tuner: " + Fixture("good.yaml") +
                        ":7:19: tuned for hosts=1 ranks_per_host=2 (2 ranks), this communicator "
                        "has 4 ranks on 1 node; NCCL's own choices are used"),
            1u)
      << ::testing::PrintToString(Logged());
  void* two_nodes = InitV5(Fixture("good.yaml"), /*ranks=*/2, /*nodes=*/2);
  CostTable table;
  EXPECT_EQ(Ask(two_nodes, kNcclFuncAllReduce, 8, table), 0);
  ExpectUntouched(table, "2 nodes");
  EXPECT_EQ(CountLogged(":6:10: tuned for hosts=1"), 1u) << ::testing::PrintToString(Logged());
  EXPECT_EQ(v5_->finalize(two_nodes), kNcclSuccess);
}

TEST_F(TunerPlugin, BadOrAbsentTablesLeaveNcclAloneAndNeverFailInit) {
  struct Case {
    std::string path;
    std::string logged;
  } cases[] = {
      {Fixture("corrupt.yaml"), "corrupt.yaml:6:"},
      {Fixture("out_of_range.yaml"), "channels 128 is out of range [1, 64]"},
      {Fixture("unknown_knob.yaml"), "unknown shm knob 'flat_max_byte'"},
      {Fixture("no_such_table.yaml"), "cannot open configuration file"},
  };
  for (const Case& c : cases) {
    Logged().clear();
    for (int i = 0; i < 2; ++i) {  // a second communicator: no second message
      void* context = InitV5(c.path, /*ranks=*/2, /*nodes=*/1);
      for (size_t bytes : {size_t{8}, size_t{64} << 10, size_t{1} << 20, size_t{256} << 20}) {
        CostTable table;
        EXPECT_EQ(Ask(context, kNcclFuncAllReduce, bytes, table), 0) << c.path;
        ExpectUntouched(table, c.path);
      }
      EXPECT_EQ(v5_->finalize(context), kNcclSuccess);
    }
    EXPECT_EQ(
        CountLogged("WARN adaptcomm tuner: ADAPTCOMM_NCCL_TUNER_TABLE=" + c.path + " refused: "),
        1u)
        << ::testing::PrintToString(Logged());
    EXPECT_EQ(CountLogged(c.logged), 1u) << ::testing::PrintToString(Logged());
  }

  Logged().clear();
  void* unset = InitV5("", 2, 1);
  CostTable table;
  EXPECT_EQ(Ask(unset, kNcclFuncAllReduce, 8, table), 0);
  ExpectUntouched(table, "unset");
  EXPECT_EQ(v5_->finalize(unset), kNcclSuccess);
  // A null context (NCCL never passes one, but init may have failed to allocate) is harmless.
  CostTable null_table;
  EXPECT_EQ(Ask(nullptr, kNcclFuncAllReduce, 8, null_table), 0);
  ExpectUntouched(null_table, "null context");
  EXPECT_EQ(v5_->finalize(nullptr), kNcclSuccess);
}

TEST_F(TunerPlugin, OlderInterfacesAnswerTheSame) {
  setenv("ADAPTCOMM_NCCL_TUNER_TABLE", Fixture("good.yaml").c_str(), 1);
  const auto* v4 = static_cast<const NcclTunerV4*>(dlsym(handle_, "ncclTunerPlugin_v4"));
  const auto* v3 = static_cast<const NcclTunerV3*>(dlsym(handle_, "ncclTunerPlugin_v3"));
  const auto* v2 = static_cast<const NcclTunerV2*>(dlsym(handle_, "ncclTunerPlugin_v2"));
  ASSERT_NE(v4, nullptr);
  ASSERT_NE(v3, nullptr);
  ASSERT_NE(v2, nullptr);

  void* c4 = nullptr;
  ASSERT_EQ(v4->init(2, 1, Logger, &c4), kNcclSuccess);
  CostTable t4;
  int ch4 = 0;
  EXPECT_EQ(v4->getCollInfo(c4, kNcclFuncAllReduce, 8, 1, t4.AsNccl(), kAlgos, kProtos, 1, &ch4),
            kNcclSuccess);
  ExpectOnlyChosen(t4, kNcclAlgoTree, kNcclProtoLl, "v4");
  EXPECT_EQ(ch4, 8);
  EXPECT_EQ(v4->destroy(c4), kNcclSuccess);

  void* c3 = nullptr;
  ASSERT_EQ(v3->init(2, 1, Logger, &c3), kNcclSuccess);
  CostTable t3;
  int ch3 = 0;
  EXPECT_EQ(v3->getCollInfo(c3, kNcclFuncAllReduce, size_t{256} << 20, 1, t3.AsNccl(), kAlgos,
                            kProtos, &ch3),
            kNcclSuccess);
  ExpectOnlyChosen(t3, kNcclAlgoRing, kNcclProtoSimple, "v3");
  EXPECT_EQ(ch3, 32);
  // A smaller table (an NCCL with fewer algorithms): rows are numProto wide, still row-major.
  float narrow[2][kProtos] = {{5, 6, 7}, {8, 9, 10}};
  int ch_narrow = 0;
  EXPECT_EQ(v3->getCollInfo(c3, kNcclFuncAllReduce, 1 << 20, 1, reinterpret_cast<float**>(narrow),
                            2, kProtos, &ch_narrow),
            kNcclSuccess);
  EXPECT_EQ(narrow[kNcclAlgoRing][kNcclProtoLl128], 0.0f);
  EXPECT_EQ(narrow[kNcclAlgoRing][kNcclProtoSimple], 10.0f);
  EXPECT_EQ(narrow[kNcclAlgoTree][kNcclProtoLl128], 6.0f);
  EXPECT_EQ(v3->destroy(c3), kNcclSuccess);

  void* c2 = nullptr;
  ASSERT_EQ(v2->init(2, 1, Logger, &c2), kNcclSuccess);
  int algo = -1, proto = -1, ch2 = 0;
  EXPECT_EQ(v2->getCollInfo(c2, kNcclFuncAllReduce, 8, 0, 0, 1, &algo, &proto, &ch2), kNcclSuccess);
  EXPECT_EQ(algo, kNcclAlgoTree);
  EXPECT_EQ(proto, kNcclProtoLl);
  EXPECT_EQ(ch2, 8);
  algo = proto = -1;
  ch2 = 0;
  EXPECT_EQ(v2->getCollInfo(c2, kNcclFuncBroadcast, 8, 0, 0, 1, &algo, &proto, &ch2), kNcclSuccess);
  EXPECT_EQ(algo, -1);  // no band: untouched
  EXPECT_EQ(proto, -1);
  EXPECT_EQ(ch2, 0);
  EXPECT_EQ(v2->destroy(c2), kNcclSuccess);
}

}  // namespace
}  // namespace adaptcomm::nccl_tuner

// The tuned table (lib/config/tuned_table.h, issue #15): the format, its validation with
// file:line, the fingerprint check, and the writer's round trip.
#include "lib/config/tuned_table.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/profile_test_util.h"

namespace adaptcomm::config {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Fixture(const std::string& name) {
  return adaptcomm::testing::SourceDir() + "/tests/fixtures/tuned/" + name;
}

TopologyFingerprint TwoRanksOneHost() {
  TopologyFingerprint fp;
  fp.hosts = 1;
  fp.ranks_per_host = 2;
  fp.cores = 2;
  fp.backend = "shm";
  fp.gloo = "0.5.0";
  fp.nccl = "2.28.9";
  return fp;
}

constexpr char kHeader[] =
    "schema: 1\n"
    "kind: adaptcomm-tuned\n"
    "fingerprint: {hosts: 1, ranks_per_host: 2, cores: 2, backend: shm, gloo: \"0.5.0\", "
    "nccl: \"\", gpu: \"\", interconnect: \"\"}\n"
    "entries:\n";  // entries start on line 5

absl::Status ParseEntries(const std::string& entries) {
  return ParseTunedTable(std::string(kHeader) + entries, "t.yaml").status();
}

TEST(TunedTable, GoodFixtureLoadsEveryEntryWithBandsAndSources) {
  auto table = LoadTunedTableFor(Fixture("good.yaml"), TwoRanksOneHost());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->description, "fixture: 2 ranks, one host");
  EXPECT_EQ(table->fingerprint, TwoRanksOneHost());
  ASSERT_EQ(table->entries.size(), 8u);

  const TunedEntry& first = table->entries[0];
  EXPECT_EQ(first.backend, "nccl");
  EXPECT_EQ(first.op, "allreduce");
  EXPECT_EQ(first.min_bytes, 0u);
  EXPECT_EQ(first.max_bytes, 65536u);
  EXPECT_EQ(first.algorithm, NcclAlgorithm::kTree);
  EXPECT_EQ(first.protocol, NcclProtocol::kLl);
  EXPECT_EQ(first.channels, 8);
  EXPECT_EQ(first.where, "good.yaml:15");
  EXPECT_EQ(first.source, "adaptcomm tune 2026-12-02: 41.2 us vs 55.0 us static (median of 30)");

  const TunedEntry& second = table->entries[1];
  EXPECT_EQ(second.min_bytes, 65536u);
  EXPECT_EQ(second.max_bytes, 4u << 20);
  EXPECT_EQ(second.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(second.protocol, NcclProtocol::kLl128);
  EXPECT_EQ(second.channels, 0);
  EXPECT_EQ(second.source, "");

  const TunedEntry& third = table->entries[2];
  EXPECT_EQ(third.min_bytes, 4u << 20);
  EXPECT_EQ(third.max_bytes, kTunedMaxBytesUnbounded);
  EXPECT_EQ(third.Describe(), "nccl allreduce (4 MiB, max]: ring/simple, 32 channels");

  const TunedEntry& channels_only = table->entries[3];
  EXPECT_EQ(channels_only.op, "allgather");
  EXPECT_EQ(channels_only.min_bytes, 0u);  // its own group: a new band list
  EXPECT_FALSE(channels_only.algorithm.has_value());
  EXPECT_FALSE(channels_only.protocol.has_value());
  EXPECT_EQ(channels_only.channels, 4);

  const TunedEntry& flat = table->entries[4];
  EXPECT_EQ(flat.knob, "flat_max_bytes");
  EXPECT_EQ(flat.value, "131072");
  EXPECT_EQ(flat.number, 131072);
  EXPECT_EQ(flat.where, "good.yaml:20");
  EXPECT_EQ(flat.Describe(), "shm allreduce (0 B, 256 KiB]: flat_max_bytes=131072");

  const TunedEntry& chunk = table->entries[5];  // another knob: another band list
  EXPECT_EQ(chunk.min_bytes, 0u);
  EXPECT_EQ(chunk.value, "2097152");
  EXPECT_EQ(table->entries[6].value, "bcube");
  EXPECT_EQ(table->entries[6].number, 1);
  EXPECT_EQ(table->entries[7].value, "false");
  EXPECT_EQ(table->entries[7].number, 0);
}

TEST(TunedTable, LookupsFindTheBandHoldingTheSize) {
  auto table = LoadTunedTable(Fixture("good.yaml"));
  ASSERT_TRUE(table.ok()) << table.status();
  // Band edges: (0, 64 KiB], (64 KiB, 4 MiB], (4 MiB, max].
  const std::pair<uint64_t, size_t> cases[] = {
      {1, 0},       {8, 0},       {65536, 0},         {65537, 1},
      {1 << 20, 1}, {4 << 20, 1}, {(4 << 20) + 1, 2}, {uint64_t{256} << 20, 2}};
  for (const auto& [bytes, index] : cases) {
    const TunedEntry* e = table->FindNccl("allreduce", bytes);
    ASSERT_NE(e, nullptr) << bytes;
    EXPECT_EQ(e, &table->entries[index]) << bytes;
  }
  EXPECT_EQ(table->FindNccl("allreduce", 0), nullptr);        // no band holds 0 bytes
  EXPECT_EQ(table->FindNccl("allgather", 2 << 20), nullptr);  // above its last band
  EXPECT_EQ(table->FindNccl("broadcast", 8), nullptr);
  EXPECT_EQ(table->FindKnob("shm", "allreduce", "flat_max_bytes", 262144), &table->entries[4]);
  EXPECT_EQ(table->FindKnob("shm", "allreduce", "flat_max_bytes", 262145), nullptr);
  EXPECT_EQ(table->FindKnob("shm", "reduce", "flat_max_bytes", 8), nullptr);
}

TEST(TunedTable, CorruptFileIsRefusedWithFileLine) {
  auto table = LoadTunedTable(Fixture("corrupt.yaml"));
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(table.status().message()), StartsWith(Fixture("corrupt.yaml") + ":"));
  EXPECT_THAT(std::string(table.status().message()), HasSubstr("YAML error"));
}

TEST(TunedTable, MissingFileIsNotFound) {
  auto table = LoadTunedTable(Fixture("no_such_table.yaml"));
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(table.status().message()), HasSubstr("no_such_table.yaml"));
}

TEST(TunedTable, HandEditedUnknownKnobNamesLineAndSuggests) {
  auto table = LoadTunedTable(Fixture("unknown_knob.yaml"));
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(table.status().message()),
              StartsWith(Fixture("unknown_knob.yaml") + ":7:"));
  EXPECT_THAT(std::string(table.status().message()), HasSubstr("unknown shm knob 'flat_max_byte'"));
  EXPECT_THAT(std::string(table.status().message()), HasSubstr("did you mean 'flat_max_bytes'"));
}

TEST(TunedTable, HandEditedOutOfRangeChannelsNamesLineAndRange) {
  auto table = LoadTunedTable(Fixture("out_of_range.yaml"));
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(table.status().message()),
              StartsWith(Fixture("out_of_range.yaml") + ":7:"));
  EXPECT_THAT(std::string(table.status().message()),
              HasSubstr("channels 128 is out of range [1, 64]"));
}

TEST(TunedTable, OtherTopologyIsRefusedNamingTheField) {
  auto table = LoadTunedTableFor(Fixture("other_topology.yaml"), TwoRanksOneHost());
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(table.status().message()),
              StartsWith(Fixture("other_topology.yaml") + ":6:"));
  EXPECT_THAT(std::string(table.status().message()),
              HasSubstr("tuned for ranks_per_host=4, this job has 2"));
  // The same file loads without a fingerprint to compare (adaptcomm tune reads it that way).
  EXPECT_TRUE(LoadTunedTable(Fixture("other_topology.yaml")).ok());
}

TEST(TunedFingerprint, FirstDifferenceInBlockOrder) {
  TopologyFingerprint a = TwoRanksOneHost();
  EXPECT_TRUE(a.Matches(a));
  EXPECT_FALSE(FirstDifference(a, a).has_value());
  TopologyFingerprint b = a;
  b.gpu = "H100";
  b.cores = 16;
  auto diff = FirstDifference(a, b);
  ASSERT_TRUE(diff.has_value());
  EXPECT_EQ(diff->field, "cores");
  EXPECT_EQ(diff->Describe(), "tuned for cores=2, this job has 16");
  b.cores = 2;
  diff = FirstDifference(a, b);
  ASSERT_TRUE(diff.has_value());
  EXPECT_EQ(diff->Describe(), "tuned for gpu=\"\", this job has H100");
  EXPECT_FALSE(a.Matches(b));
  EXPECT_EQ(a.Describe(),
            "hosts=1 ranks_per_host=2 cores=2 backend=shm gloo=0.5.0 nccl=2.28.9 gpu= "
            "interconnect=");
}

struct BadCase {
  const char* name;
  std::string text;  // entries (after kHeader), or a whole file when whole_file
  bool whole_file;
  std::string prefix;  // "t.yaml:L:C" the message starts with
  std::string reason;  // part of the message
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class TunedTableRefuses : public ::testing::TestWithParam<BadCase> {};

TEST_P(TunedTableRefuses, WithFileLineAndReason) {
  const BadCase& c = GetParam();
  absl::Status s = c.whole_file ? ParseTunedTable(c.text, "t.yaml").status() : ParseEntries(c.text);
  ASSERT_FALSE(s.ok()) << c.name;
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), StartsWith(c.prefix + ":")) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(c.reason)) << s;
}

const std::string kFp =
    "fingerprint: {hosts: 1, ranks_per_host: 2, cores: 2, backend: shm, gloo: \"\", nccl: \"\", "
    "gpu: \"\", interconnect: \"\"}\n";

INSTANTIATE_TEST_SUITE_P(
    Cases, TunedTableRefuses,
    ::testing::Values(
        BadCase{"schema", "schema: 2\nkind: adaptcomm-tuned\n" + kFp + "entries: []\n", true,
                "t.yaml:1:9", "schema 2 is not one this adaptcomm reads (1)"},
        BadCase{"kind", "schema: 1\nkind: adaptcomm-profile\n" + kFp + "entries: []\n", true,
                "t.yaml:2:7", "kind 'adaptcomm-profile' is not 'adaptcomm-tuned'"},
        BadCase{"top key", "schema: 1\nkind: adaptcomm-tuned\n" + kFp + "entrys: []\n", true,
                "t.yaml:4:1", "unknown key 'entrys' in a tuned table (did you mean 'entries'?)"},
        BadCase{"not a map", "- 1\n- 2\n", true, "t.yaml:1:1", "not a tuned table"},
        BadCase{"missing fingerprint field",
                "schema: 1\nkind: adaptcomm-tuned\nfingerprint: {hosts: 1, ranks_per_host: 2, "
                "cores: 2, backend: shm}\nentries: []\n",
                true, "t.yaml:3:14", "fingerprint lacks 'gloo'"},
        BadCase{"fingerprint range",
                "schema: 1\nkind: adaptcomm-tuned\nfingerprint: {hosts: 0, ranks_per_host: 2, "
                "cores: 2, backend: shm, gloo: \"\", nccl: \"\", gpu: \"\", interconnect: \"\"}\n"
                "entries: []\n",
                true, "t.yaml:3:22", "fingerprint.hosts 0 is out of range"},
        BadCase{"unknown entry key",
                "  - {backend: nccl, op: allreduce, max_bytes: 1KiB, algorithm: ring, "
                "protocol: ll, chanels: 2}\n",
                false, "t.yaml:5:84",
                "unknown key 'chanels' in an nccl entry (did you mean "
                "'channels'?)"},
        BadCase{
            "unknown algorithm",
            "  - {backend: nccl, op: allreduce, max_bytes: 1KiB, algorithm: rings, protocol: ll}\n",
            false, "t.yaml:5:64", "unknown NCCL algorithm 'rings' (did you mean 'ring'?)"},
        BadCase{"unknown protocol",
                "  - {backend: nccl, op: allreduce, max_bytes: 1KiB, algorithm: ring, protocol: "
                "LL}\n",
                false, "t.yaml:5:80", "unknown NCCL protocol 'LL'"},
        BadCase{"algorithm without protocol",
                "  - {backend: nccl, op: allreduce, max_bytes: 1KiB, algorithm: ring}\n", false,
                "t.yaml:5:5", "sets algorithm and protocol together"},
        BadCase{"nothing to set", "  - {backend: nccl, op: allreduce, max_bytes: 1KiB}\n", false,
                "t.yaml:5:5", "needs algorithm and protocol, channels, or all three"},
        BadCase{"channels zero",
                "  - {backend: nccl, op: allreduce, max_bytes: 1KiB, channels: 0}\n", false,
                "t.yaml:5:63", "channels 0 is out of range [1, 64]"},
        BadCase{"nccl op", "  - {backend: nccl, op: alltoall, max_bytes: 1KiB, channels: 2}\n",
                false, "t.yaml:5:25", "nccl has no tuned op 'alltoall'"},
        BadCase{"unknown backend",
                "  - {backend: shmem, op: allreduce, max_bytes: 1KiB, knob: chunk_bytes, value: "
                "1MiB}\n",
                false, "t.yaml:5:15", "unknown backend 'shmem' (did you mean 'shm'?)"},
        BadCase{
            "knob on nccl",
            "  - {backend: nccl, op: allreduce, max_bytes: 1KiB, knob: chunk_bytes, value: 1}\n",
            false, "t.yaml:5:59", "an nccl entry sets algorithm, protocol and channels"},
        BadCase{"channels on shm",
                "  - {backend: shm, op: allreduce, max_bytes: 1KiB, channels: 4}\n", false,
                "t.yaml:5:62", "channels is a field of nccl entries"},
        BadCase{"knob value out of range",
                "  - {backend: shm, op: allreduce, max_bytes: 1MiB, knob: chunk_bytes, value: "
                "64MiB}\n",
                false, "t.yaml:5:78", "shm chunk_bytes 67108864 is out of range [4096, 4194304]"},
        BadCase{"knob value not bytes",
                "  - {backend: shm, op: allreduce, max_bytes: 1MiB, knob: chunk_bytes, value: "
                "big}\n",
                false, "t.yaml:5:78", "shm chunk_bytes takes a byte size"},
        BadCase{"choice",
                "  - {backend: gloo, op: allreduce, max_bytes: 1MiB, knob: algorithm, value: "
                "rign}\n",
                false, "t.yaml:5:77",
                "gloo algorithm must be one of ring, bcube, recursive_doubling (did you mean "
                "'ring'?)"},
        BadCase{"bool",
                "  - {backend: hier, op: allreduce, max_bytes: 1MiB, knob: enabled, value: 2}\n",
                false, "t.yaml:5:75", "hier enabled takes true or false"},
        BadCase{"knob op",
                "  - {backend: shm, op: broadcast, max_bytes: 1MiB, knob: flat_max_bytes, value: "
                "1KiB}\n",
                false, "t.yaml:5:24", "shm knob flat_max_bytes does not apply to broadcast"},
        BadCase{"max_bytes zero", "  - {backend: nccl, op: allreduce, max_bytes: 0, channels: 2}\n",
                false, "t.yaml:5:47", "max_bytes must be a positive byte size"},
        BadCase{"unsorted bands",
                "  - {backend: nccl, op: allreduce, max_bytes: 1MiB, channels: 2}\n"
                "  - {backend: nccl, op: allgather, max_bytes: 1KiB, channels: 2}\n"
                "  - {backend: nccl, op: allreduce, max_bytes: 64KiB, channels: 4}\n",
                false, "t.yaml:7:47",
                "bands of nccl allreduce are not sorted: max_bytes 64 KiB is not above the 1 MiB "
                "of line 5"},
        BadCase{
            "repeated band",
            "  - {backend: shm, op: allreduce, max_bytes: max, knob: chunk_bytes, value: 1MiB}\n"
            "  - {backend: shm, op: allreduce, max_bytes: max, knob: chunk_bytes, value: 2MiB}\n",
            false, "t.yaml:6:46", "bands of shm allreduce chunk_bytes are not sorted"},
        BadCase{"duplicate key",
                "  - {backend: nccl, op: allreduce, max_bytes: 1KiB, channels: 2, channels: 3}\n",
                false, "t.yaml:5:66", "duplicate key 'channels'"},
        BadCase{"entry not a map", "  - nccl\n", false, "t.yaml:5:5", "an entry must be a map"}),
    [](const ::testing::TestParamInfo<BadCase>& info) {
      std::string name = info.param.name;
      for (char& ch : name) {
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

TEST(TunedTable, EmptyEntriesIsAValidTable) {
  auto table = ParseTunedTable(std::string(kHeader) + "  []\n", "t.yaml");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_TRUE(table->entries.empty());
}

TEST(TunedTable, FormatReadsBackToTheSameTable) {
  auto table = LoadTunedTable(Fixture("good.yaml"));
  ASSERT_TRUE(table.ok()) << table.status();
  table->description = "quotes \" and: colons, newline\nkept";
  table->fingerprint.interconnect = "NVLink: 18 links";
  const std::string text = FormatTunedTable(*table);
  auto again = ParseTunedTable(text, "written.yaml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << text;
  EXPECT_EQ(again->description, table->description);
  EXPECT_EQ(again->fingerprint, table->fingerprint);
  ASSERT_EQ(again->entries.size(), table->entries.size());
  for (size_t i = 0; i < table->entries.size(); ++i) {
    const TunedEntry& a = table->entries[i];
    const TunedEntry& b = again->entries[i];
    EXPECT_EQ(a.Describe(), b.Describe()) << i;
    EXPECT_EQ(a.min_bytes, b.min_bytes) << i;
    EXPECT_EQ(a.max_bytes, b.max_bytes) << i;
    EXPECT_EQ(a.algorithm, b.algorithm) << i;
    EXPECT_EQ(a.protocol, b.protocol) << i;
    EXPECT_EQ(a.channels, b.channels) << i;
    EXPECT_EQ(a.knob, b.knob) << i;
    EXPECT_EQ(a.value, b.value) << i;
    EXPECT_EQ(a.number, b.number) << i;
    EXPECT_EQ(a.source, b.source) << i;
  }
}

TEST(TunedKnobs, RegistryIsConsistent) {
  for (const TunedKnobSpec& k : TunedKnobs()) {
    EXPECT_EQ(FindTunedKnob(k.backend, k.knob), &k) << k.knob;
    EXPECT_FALSE(k.ops.empty()) << k.knob;
    EXPECT_NE(k.backend, "nccl") << "NCCL is tuned through algorithm/protocol/channels";
    if (k.type == KnobType::kChoice) {
      EXPECT_GE(k.choices.size(), 2u) << k.knob;
    } else {
      EXPECT_LE(k.min, k.max) << k.knob;
    }
  }
  EXPECT_EQ(FindTunedKnob("shm", "no_such_knob"), nullptr);
}

}  // namespace
}  // namespace adaptcomm::config

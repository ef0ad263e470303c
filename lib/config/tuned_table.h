// The tuned table (issue #15): measured winners per backend, op and message-size band, keyed by
// the topology they were measured on. `adaptcomm tune` writes it (FormatTunedTable), the library
// and the NCCL tuner plugin (plugins/nccl_tuner) read it (ParseTunedTable / LoadTunedTable).
//
//   schema: 1
//   kind: adaptcomm-tuned
//   description: "2 ranks on one host, shm"          # optional
//   fingerprint: {hosts: 1, ranks_per_host: 2, cores: 2, backend: shm, gloo: "0.5.0",
//                 nccl: "", gpu: "", interconnect: ""}
//   entries:
//     - {backend: nccl, op: allreduce, max_bytes: 64KiB, algorithm: tree, protocol: ll,
//        channels: 8, source: "adaptcomm tune 2026-12-02: 41.2 us vs 55.0 us static"}
//     - {backend: nccl, op: allreduce, max_bytes: max, algorithm: ring, protocol: simple}
//     - {backend: shm, op: allreduce, max_bytes: 256KiB, knob: flat_max_bytes, value: 128KiB}
//
// Bands: the entries of one (backend, op) for NCCL, or one (backend, op, knob) otherwise, are
// listed with strictly increasing max_bytes; an entry covers (previous max_bytes, max_bytes]
// (the first one from 0). A size above the last band has no tuned value: the static profile
// applies. max_bytes takes a byte size ("64KiB", "1048576") or `max`.
// NCCL entries set algorithm and protocol together (NCCL's tuner interface refuses one without
// the other), channels alone, or all three. Other backends set one registered knob per entry
// (TunedKnobs(): the tuning space, with each knob's type, range and ops).
// Every error names file:line:column and the reason (InvalidArgument); a table measured on
// another topology is refused by LoadTunedTable naming the first field that differs
// (FailedPrecondition).
#ifndef ADAPTCOMM_LIB_CONFIG_TUNED_TABLE_H_
#define ADAPTCOMM_LIB_CONFIG_TUNED_TABLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/config/size_bands.h"

namespace adaptcomm::config {

inline constexpr int kTunedTableSchema = 1;
inline constexpr char kTunedTableKind[] = "adaptcomm-tuned";
inline constexpr uint64_t kTunedMaxBytesUnbounded = UINT64_MAX;  // `max_bytes: max`
inline constexpr int kTunedMaxEntries = 4096;

// What a table was measured on. Two fingerprints match when every field is equal.
struct TopologyFingerprint {
  int hosts = 0;
  int ranks_per_host = 0;
  int cores = 0;             // online CPU cores per host
  std::string backend;       // "gloo", "nccl", "shm", "hier" (what the job ran)
  std::string gloo;          // Gloo version, "" when not used
  std::string nccl;          // NCCL version ("2.28.9"), "" when not used
  std::string gpu;           // GPU model, "" without GPUs
  std::string interconnect;  // NVLink/IB layout in words, "" when none

  bool operator==(const TopologyFingerprint&) const = default;
  bool Matches(const TopologyFingerprint& current) const { return *this == current; }
  // "hosts=1 ranks_per_host=2 cores=2 backend=shm gloo=0.5.0 nccl= gpu= interconnect="
  std::string Describe() const;
};

// One field on which two fingerprints differ, with both values as text.
struct FingerprintDifference {
  std::string field;    // "ranks_per_host"
  std::string tuned;    // "4"
  std::string current;  // "2"
  // "tuned for ranks_per_host=4, this job has 2"
  std::string Describe() const;
};
// The first differing field in the order of the YAML block; nullopt when they match.
std::optional<FingerprintDifference> FirstDifference(const TopologyFingerprint& tuned,
                                                     const TopologyFingerprint& current);

// NCCL's algorithm and protocol numbers (NCCL_ALGO_* / NCCL_PROTO_* of NCCL's tuner interface,
// nccl_tuner.h in NCCL 2.28): the values index NCCL's cost table directly.
enum class NcclAlgorithm : int {
  kTree = 0,
  kRing = 1,
  kCollnetDirect = 2,
  kCollnetChain = 3,
  kNvls = 4,
  kNvlsTree = 5,
  kPat = 6,
};
enum class NcclProtocol : int { kLl = 0, kLl128 = 1, kSimple = 2 };
const char* NcclAlgorithmName(NcclAlgorithm a);  // "tree", "collnet_direct", ...
const char* NcclProtocolName(NcclProtocol p);    // "ll", "ll128", "simple"
inline constexpr int kNcclMinChannels = 1;
inline constexpr int kNcclMaxChannels = 64;

// The ops an NCCL entry may name: the collectives NCCL asks its tuner about.
const std::vector<std::string>& TunedNcclOps();

enum class KnobType { kBytes, kInt, kBool, kChoice };

// One tunable setting of a non-NCCL backend.
struct TunedKnobSpec {
  std::string backend;  // "gloo", "shm", "hier"
  std::string knob;     // "flat_max_bytes"
  KnobType type = KnobType::kInt;
  int64_t min = 0;  // kBytes/kInt: inclusive range
  int64_t max = 0;
  std::vector<std::string> choices;  // kChoice
  std::vector<std::string> ops;      // OpKindName() names it applies to
  std::string applies_as;            // where the value goes ("ShmBackendOptions::flat_max_bytes")
};
// The registry of knobs (the tuning space of the non-NCCL backends).
const std::vector<TunedKnobSpec>& TunedKnobs();
const TunedKnobSpec* FindTunedKnob(std::string_view backend, std::string_view knob);

struct TunedEntry {
  std::string backend;     // "nccl", or a TunedKnobSpec::backend
  std::string op;          // OpKindName() form: "allreduce", "reduce_scatter", ...
  uint64_t min_bytes = 0;  // exclusive: the previous band's max_bytes (0 for the first band)
  uint64_t max_bytes = 0;  // inclusive; kTunedMaxBytesUnbounded for `max`
  // NCCL entries.
  std::optional<NcclAlgorithm> algorithm;  // set together with protocol
  std::optional<NcclProtocol> protocol;
  int channels = 0;  // 0: NCCL decides
  // Other backends.
  std::string knob;
  std::string value;   // canonical text: bytes and ints as decimal, bools "true"/"false"
  int64_t number = 0;  // kBytes/kInt: the value; kBool: 0/1; kChoice: index into choices
  // Where it came from.
  std::string source;  // the measurement, as the file says ("" if none was given)
  std::string where;   // "tuned.yaml:12" (base name and line, as Explain shows sources)

  bool Covers(uint64_t bytes) const { return bytes > min_bytes && bytes <= max_bytes; }
  // "nccl allreduce (64 KiB, 1 MiB]: ring/simple, 8 channels" or
  // "shm allreduce (0 B, 256 KiB]: flat_max_bytes=131072"
  std::string Describe() const;
};

struct TunedTable {
  std::string file;  // as given to the loader
  std::string description;
  TopologyFingerprint fingerprint;
  // Field name -> "file:line:column" of its value, for messages about a differing fingerprint.
  std::map<std::string, std::string> fingerprint_where;
  std::vector<TunedEntry> entries;  // file order

  // The NCCL entry whose band holds `bytes` for `op`; null when none does.
  const TunedEntry* FindNccl(std::string_view op, uint64_t bytes) const;
  // The entry of `knob` whose band holds `bytes`; null when none does.
  const TunedEntry* FindKnob(std::string_view backend, std::string_view op, std::string_view knob,
                             uint64_t bytes) const;
  // Every band of `knob` for `op`, in order, with TunedEntry::number as the value: what a backend
  // option takes (ShmBackendOptions, GlooBackendOptions). Empty when the table has none.
  SizeBands KnobBands(std::string_view backend, std::string_view op, std::string_view knob) const;
};

// Parses and validates a table. InvalidArgument "file:line:column: reason" for a YAML error,
// a wrong schema or kind, an unknown key or knob, a value out of range, or unsorted bands.
absl::StatusOr<TunedTable> ParseTunedTable(const std::string& text, const std::string& file);
// Reads `path` and parses it: NotFound when it cannot be opened, else as ParseTunedTable.
absl::StatusOr<TunedTable> LoadTunedTable(const std::string& path);
// As LoadTunedTable, and FailedPrecondition when the table was tuned on another topology:
// "tuned.yaml:5:20: tuned for ranks_per_host=4, this job has 2 (re-run adaptcomm tune)".
absl::StatusOr<TunedTable> LoadTunedTableFor(const std::string& path,
                                             const TopologyFingerprint& current);

// OK when `table` was tuned on `current`; else FailedPrecondition naming the first differing
// field where the file sets it: "tuned.yaml:5:20: tuned for ranks_per_host=4, this job has 2
// (re-run adaptcomm tune for this topology)".
absl::Status CheckFingerprint(const TunedTable& table, const TopologyFingerprint& current);

// YAML text that ParseTunedTable reads back to the same table (what `adaptcomm tune` writes).
std::string FormatTunedTable(const TunedTable& table);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_TUNED_TABLE_H_

#include "lib/config/tuned_table.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/byte_text.h"
#include "lib/config/nccl_registry.h"
#include "lib/config/units.h"
#include "lib/config/yaml_util.h"

namespace adaptcomm::config {
namespace {

const std::vector<std::string> kTopKeys = {"schema", "kind", "description", "fingerprint",
                                           "entries"};
const std::vector<std::string> kFingerprintKeys = {
    "hosts", "ranks_per_host", "cores", "backend", "gloo", "nccl", "gpu", "interconnect"};
const std::vector<std::string> kNcclEntryKeys = {"backend",  "op",       "max_bytes", "algorithm",
                                                 "protocol", "channels", "source"};
const std::vector<std::string> kKnobEntryKeys = {"backend", "op",    "max_bytes",
                                                 "knob",    "value", "source"};

struct NamedAlgorithm {
  const char* name;
  NcclAlgorithm value;
};
constexpr NamedAlgorithm kAlgorithms[] = {
    {"tree", NcclAlgorithm::kTree},
    {"ring", NcclAlgorithm::kRing},
    {"collnet_direct", NcclAlgorithm::kCollnetDirect},
    {"collnet_chain", NcclAlgorithm::kCollnetChain},
    {"nvls", NcclAlgorithm::kNvls},
    {"nvls_tree", NcclAlgorithm::kNvlsTree},
    {"pat", NcclAlgorithm::kPat},
};
struct NamedProtocol {
  const char* name;
  NcclProtocol value;
};
constexpr NamedProtocol kProtocols[] = {
    {"ll", NcclProtocol::kLl},
    {"ll128", NcclProtocol::kLl128},
    {"simple", NcclProtocol::kSimple},
};

std::string DidYouMean(const std::string& name, const std::vector<std::string>& candidates) {
  std::string hint = ClosestName(name, candidates);
  return hint.empty() ? "" : absl::StrCat(" (did you mean '", hint, "'?)");
}

std::string OneOf(const std::vector<std::string>& names) {
  return absl::StrCat("one of ", absl::StrJoin(names, ", "));
}

std::string BytesText(uint64_t bytes) {
  return bytes == kTunedMaxBytesUnbounded ? "max" : ByteSizeText(bytes);
}

// Line numbers for band messages ("line 7").
int LineOf(const YAML::Node& node) {
  return node.IsDefined() && !node.Mark().is_null() ? node.Mark().line + 1 : 0;
}

absl::Status CheckKeys(const std::string& file, const YAML::Node& map,
                       const std::vector<std::string>& allowed, const std::string& what) {
  for (const auto& kv : map) {
    auto key = ScalarAt(file, kv.first, absl::StrCat("a key of ", what));
    if (!key.ok()) return key.status();
    if (std::find(allowed.begin(), allowed.end(), *key) == allowed.end()) {
      return ErrorAt(file, kv.first,
                     absl::StrCat("unknown key '", *key, "' in ", what, DidYouMean(*key, allowed),
                                  "; known keys: ", absl::StrJoin(allowed, ", ")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> IntAt(const std::string& file, const YAML::Node& node,
                              const std::string& what, int64_t min, int64_t max) {
  auto text = ScalarAt(file, node, what);
  if (!text.ok()) return text.status();
  auto value = ParseInt(*text);
  if (!value.ok()) return ErrorAt(file, node, absl::StrCat(what, " must be a whole number"));
  if (*value < min || *value > max) {
    return ErrorAt(file, node,
                   absl::StrCat(what, " ", *value, " is out of range [", min, ", ", max, "]"));
  }
  return *value;
}

// A fingerprint string field: a scalar, possibly empty ("" or a YAML null).
absl::StatusOr<std::string> TextAt(const std::string& file, const YAML::Node& node,
                                   const std::string& what) {
  if (node.IsNull()) return std::string();
  return ScalarAt(file, node, what);
}

absl::Status ParseFingerprint(const std::string& file, const YAML::Node& node, TunedTable& table) {
  if (!node.IsMap()) {
    return ErrorAt(
        file, node,
        absl::StrCat("fingerprint must be a map of ", absl::StrJoin(kFingerprintKeys, ", ")));
  }
  if (absl::Status s = CheckKeys(file, node, kFingerprintKeys, "fingerprint"); !s.ok()) return s;
  for (const std::string& key : kFingerprintKeys) {
    if (!node[key]) {
      return ErrorAt(file, node,
                     absl::StrCat("fingerprint lacks '", key,
                                  "' (every field is required; use \"\" for none)"));
    }
  }
  TopologyFingerprint& fp = table.fingerprint;
  const std::string what = "fingerprint.";
  auto hosts = IntAt(file, node["hosts"], what + "hosts", 1, 1 << 20);
  if (!hosts.ok()) return hosts.status();
  auto per_host = IntAt(file, node["ranks_per_host"], what + "ranks_per_host", 1, 1 << 16);
  if (!per_host.ok()) return per_host.status();
  auto cores = IntAt(file, node["cores"], what + "cores", 1, 1 << 16);
  if (!cores.ok()) return cores.status();
  fp.hosts = static_cast<int>(*hosts);
  fp.ranks_per_host = static_cast<int>(*per_host);
  fp.cores = static_cast<int>(*cores);
  const std::pair<const char*, std::string*> texts[] = {{"backend", &fp.backend},
                                                        {"gloo", &fp.gloo},
                                                        {"nccl", &fp.nccl},
                                                        {"gpu", &fp.gpu},
                                                        {"interconnect", &fp.interconnect}};
  for (const auto& [key, out] : texts) {
    auto text = TextAt(file, node[key], what + key);
    if (!text.ok()) return text.status();
    *out = *text;
  }
  static const std::vector<std::string> kBackends = {"gloo", "nccl", "shm", "hier"};
  if (std::find(kBackends.begin(), kBackends.end(), fp.backend) == kBackends.end()) {
    return ErrorAt(file, node["backend"],
                   absl::StrCat("fingerprint.backend must be ", OneOf(kBackends),
                                DidYouMean(fp.backend, kBackends)));
  }
  for (const std::string& key : kFingerprintKeys)
    table.fingerprint_where[key] = Where(file, node[key]);
  return absl::OkStatus();
}

absl::Status ParseNcclFields(const std::string& file, const YAML::Node& node, TunedEntry& entry) {
  if (absl::Status s = CheckKeys(file, node, kNcclEntryKeys, "an nccl entry"); !s.ok()) {
    if (node["knob"] || node["value"]) {
      return ErrorAt(file, node["knob"] ? node["knob"] : node["value"],
                     "an nccl entry sets algorithm, protocol and channels, not a knob/value");
    }
    return s;
  }
  const bool has_algo = static_cast<bool>(node["algorithm"]);
  const bool has_proto = static_cast<bool>(node["protocol"]);
  if (has_algo != has_proto) {
    return ErrorAt(file, node,
                   "an nccl entry sets algorithm and protocol together (NCCL's tuner interface "
                   "takes both or neither)");
  }
  if (!has_algo && !node["channels"]) {
    return ErrorAt(file, node,
                   "an nccl entry needs algorithm and protocol, channels, or all three");
  }
  if (has_algo) {
    auto algo = ScalarAt(file, node["algorithm"], "algorithm");
    if (!algo.ok()) return algo.status();
    std::vector<std::string> names;
    for (const auto& a : kAlgorithms) {
      names.emplace_back(a.name);
      if (*algo == a.name) entry.algorithm = a.value;
    }
    if (!entry.algorithm) {
      return ErrorAt(file, node["algorithm"],
                     absl::StrCat("unknown NCCL algorithm '", *algo, "'", DidYouMean(*algo, names),
                                  "; use ", OneOf(names)));
    }
    auto proto = ScalarAt(file, node["protocol"], "protocol");
    if (!proto.ok()) return proto.status();
    names.clear();
    for (const auto& p : kProtocols) {
      names.emplace_back(p.name);
      if (*proto == p.name) entry.protocol = p.value;
    }
    if (!entry.protocol) {
      return ErrorAt(file, node["protocol"],
                     absl::StrCat("unknown NCCL protocol '", *proto, "'", DidYouMean(*proto, names),
                                  "; use ", OneOf(names)));
    }
  }
  if (node["channels"]) {
    auto channels = IntAt(file, node["channels"], "channels", kNcclMinChannels, kNcclMaxChannels);
    if (!channels.ok()) return channels.status();
    entry.channels = static_cast<int>(*channels);
  }
  return absl::OkStatus();
}

absl::Status ParseKnobFields(const std::string& file, const YAML::Node& node, TunedEntry& entry) {
  if (absl::Status s =
          CheckKeys(file, node, kKnobEntryKeys, absl::StrCat("a ", entry.backend, " entry"));
      !s.ok()) {
    for (const char* nccl_only : {"algorithm", "protocol", "channels"}) {
      if (node[nccl_only]) {
        return ErrorAt(file, node[nccl_only],
                       absl::StrCat(nccl_only, " is a field of nccl entries; a ", entry.backend,
                                    " entry sets a knob and its value"));
      }
    }
    return s;
  }
  if (!node["knob"] || !node["value"]) {
    return ErrorAt(file, node, absl::StrCat("a ", entry.backend, " entry needs knob and value"));
  }
  auto knob = ScalarAt(file, node["knob"], "knob");
  if (!knob.ok()) return knob.status();
  const TunedKnobSpec* spec = FindTunedKnob(entry.backend, *knob);
  if (spec == nullptr) {
    std::vector<std::string> names;
    for (const TunedKnobSpec& k : TunedKnobs()) {
      if (k.backend == entry.backend) names.push_back(k.knob);
    }
    return ErrorAt(file, node["knob"],
                   absl::StrCat("unknown ", entry.backend, " knob '", *knob, "'",
                                DidYouMean(*knob, names), "; known: ", absl::StrJoin(names, ", ")));
  }
  entry.knob = *knob;
  if (std::find(spec->ops.begin(), spec->ops.end(), entry.op) == spec->ops.end()) {
    return ErrorAt(file, node["op"],
                   absl::StrCat(entry.backend, " knob ", entry.knob, " does not apply to ",
                                entry.op, "; it applies to ", absl::StrJoin(spec->ops, ", ")));
  }
  const YAML::Node value_node = node["value"];
  auto text = ScalarAt(file, value_node, "value");
  if (!text.ok()) return text.status();
  const std::string what = absl::StrCat(entry.backend, " ", entry.knob);
  switch (spec->type) {
    case KnobType::kBytes:
    case KnobType::kInt: {
      absl::StatusOr<int64_t> v;
      if (spec->type == KnobType::kBytes) {
        auto bytes = ParseByteSize(*text);
        if (!bytes.ok()) {
          return ErrorAt(file, value_node,
                         absl::StrCat(what, " takes a byte size (\"64KiB\", \"1048576\")"));
        }
        if (*bytes > static_cast<uint64_t>(INT64_MAX)) {
          return ErrorAt(file, value_node,
                         absl::StrCat(what, " is out of range [", spec->min, ", ", spec->max, "]"));
        }
        v = static_cast<int64_t>(*bytes);
      } else {
        v = ParseInt(*text);
        if (!v.ok()) return ErrorAt(file, value_node, absl::StrCat(what, " takes a whole number"));
      }
      if (*v < spec->min || *v > spec->max) {
        return ErrorAt(
            file, value_node,
            absl::StrCat(what, " ", *v, " is out of range [", spec->min, ", ", spec->max, "]"));
      }
      entry.number = *v;
      entry.value = absl::StrCat(*v);
      break;
    }
    case KnobType::kBool: {
      auto b = ParseBool(*text);
      if (!b.ok()) return ErrorAt(file, value_node, absl::StrCat(what, " takes true or false"));
      entry.number = *b ? 1 : 0;
      entry.value = *b ? "true" : "false";
      break;
    }
    case KnobType::kChoice: {
      auto it = std::find(spec->choices.begin(), spec->choices.end(), *text);
      if (it == spec->choices.end()) {
        return ErrorAt(file, value_node,
                       absl::StrCat(what, " must be ", OneOf(spec->choices),
                                    DidYouMean(*text, spec->choices)));
      }
      entry.number = it - spec->choices.begin();
      entry.value = *text;
      break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TunedEntry> ParseEntry(const std::string& file, const YAML::Node& node) {
  if (!node.IsMap()) {
    return ErrorAt(file, node, "an entry must be a map (backend, op, max_bytes, ...)");
  }
  TunedEntry entry;
  entry.where = WhereLine(file, node);
  for (const char* key : {"backend", "op", "max_bytes"}) {
    if (!node[key]) return ErrorAt(file, node, absl::StrCat("entry lacks '", key, "'"));
  }
  auto backend = ScalarAt(file, node["backend"], "backend");
  if (!backend.ok()) return backend.status();
  std::vector<std::string> backends = {"nccl"};
  for (const TunedKnobSpec& k : TunedKnobs()) {
    if (std::find(backends.begin(), backends.end(), k.backend) == backends.end()) {
      backends.push_back(k.backend);
    }
  }
  if (std::find(backends.begin(), backends.end(), *backend) == backends.end()) {
    return ErrorAt(file, node["backend"],
                   absl::StrCat("unknown backend '", *backend, "'", DidYouMean(*backend, backends),
                                "; use ", OneOf(backends)));
  }
  entry.backend = *backend;

  auto op = ScalarAt(file, node["op"], "op");
  if (!op.ok()) return op.status();
  entry.op = *op;
  if (entry.backend == "nccl") {
    const std::vector<std::string>& ops = TunedNcclOps();
    if (std::find(ops.begin(), ops.end(), entry.op) == ops.end()) {
      return ErrorAt(
          file, node["op"],
          absl::StrCat("nccl has no tuned op '", entry.op, "'", DidYouMean(entry.op, ops),
                       "; NCCL's tuner is asked about ", absl::StrJoin(ops, ", ")));
    }
  }

  auto max_text = ScalarAt(file, node["max_bytes"], "max_bytes");
  if (!max_text.ok()) return max_text.status();
  if (*max_text == "max") {
    entry.max_bytes = kTunedMaxBytesUnbounded;
  } else {
    auto bytes = ParseByteSize(*max_text);
    if (!bytes.ok() || *bytes == 0) {
      return ErrorAt(file, node["max_bytes"],
                     "max_bytes must be a positive byte size (\"64KiB\", \"1048576\") or max");
    }
    entry.max_bytes = *bytes;
  }
  if (node["source"]) {
    auto source = TextAt(file, node["source"], "source");
    if (!source.ok()) return source.status();
    entry.source = *source;
  }
  absl::Status fields = entry.backend == "nccl" ? ParseNcclFields(file, node, entry)
                                                : ParseKnobFields(file, node, entry);
  if (!fields.ok()) return fields;
  return entry;
}

// Bands of one group are listed with strictly increasing max_bytes; fills in min_bytes.
absl::Status CheckBands(const std::string& file, const YAML::Node& entries_node,
                        std::vector<TunedEntry>& entries) {
  struct Previous {
    uint64_t max_bytes;
    int line;
  };
  std::map<std::string, Previous> last;  // group -> its previous entry
  size_t i = 0;
  for (const auto& node : entries_node) {
    TunedEntry& e = entries[i++];
    std::string group = absl::StrCat(e.backend, " ", e.op, e.knob.empty() ? "" : " ", e.knob);
    auto it = last.find(group);
    if (it != last.end()) {
      if (e.max_bytes <= it->second.max_bytes) {
        return ErrorAt(
            file, node["max_bytes"],
            absl::StrCat("bands of ", group, " are not sorted: max_bytes ", BytesText(e.max_bytes),
                         " is not above the ", BytesText(it->second.max_bytes), " of line ",
                         it->second.line, " (list each group's bands by increasing max_bytes)"));
      }
      e.min_bytes = it->second.max_bytes;
    }
    last[group] = Previous{e.max_bytes, LineOf(node)};
  }
  return absl::OkStatus();
}

}  // namespace

std::string TopologyFingerprint::Describe() const {
  return absl::StrCat("hosts=", hosts, " ranks_per_host=", ranks_per_host, " cores=", cores,
                      " backend=", backend, " gloo=", gloo, " nccl=", nccl, " gpu=", gpu,
                      " interconnect=", interconnect);
}

std::string FingerprintDifference::Describe() const {
  auto shown = [](const std::string& v) { return v.empty() ? std::string("\"\"") : v; };
  return absl::StrCat("tuned for ", field, "=", shown(tuned), ", this job has ", shown(current));
}

std::optional<FingerprintDifference> FirstDifference(const TopologyFingerprint& tuned,
                                                     const TopologyFingerprint& current) {
  const std::pair<const char*, std::pair<std::string, std::string>> fields[] = {
      {"hosts", {absl::StrCat(tuned.hosts), absl::StrCat(current.hosts)}},
      {"ranks_per_host",
       {absl::StrCat(tuned.ranks_per_host), absl::StrCat(current.ranks_per_host)}},
      {"cores", {absl::StrCat(tuned.cores), absl::StrCat(current.cores)}},
      {"backend", {tuned.backend, current.backend}},
      {"gloo", {tuned.gloo, current.gloo}},
      {"nccl", {tuned.nccl, current.nccl}},
      {"gpu", {tuned.gpu, current.gpu}},
      {"interconnect", {tuned.interconnect, current.interconnect}},
  };
  for (const auto& [name, values] : fields) {
    if (values.first != values.second) {
      return FingerprintDifference{name, values.first, values.second};
    }
  }
  return std::nullopt;
}

const char* NcclAlgorithmName(NcclAlgorithm a) {
  for (const auto& named : kAlgorithms) {
    if (named.value == a) return named.name;
  }
  return "unknown-algorithm";
}

const char* NcclProtocolName(NcclProtocol p) {
  for (const auto& named : kProtocols) {
    if (named.value == p) return named.name;
  }
  return "unknown-protocol";
}

const std::vector<std::string>& TunedNcclOps() {
  static const auto* ops = new std::vector<std::string>{"allreduce", "broadcast", "reduce",
                                                        "allgather", "reduce_scatter"};
  return *ops;
}

const std::vector<TunedKnobSpec>& TunedKnobs() {
  // The non-NCCL tuning space (issue #15 item 1). A knob belongs here once something applies it;
  // ranges are what the backend accepts, not what is worth trying.
  static const auto* knobs = new std::vector<TunedKnobSpec>{
      {"gloo",
       "algorithm",
       KnobType::kChoice,
       0,
       0,
       {"ring", "bcube", "recursive_doubling"},
       {"allreduce"},
       "gloo::AllreduceOptions::setAlgorithm"},
      // 0: Gloo's default segment (as the profile's gloo.max_segment_bytes), what a band keeps
      // when the static profile wins it.
      {"gloo",
       "max_segment_bytes",
       KnobType::kBytes,
       0,
       int64_t{1} << 30,
       {},
       {"allreduce"},
       "gloo::AllreduceOptions::setMaxSegmentSize"},
      // Half a slot (8 MiB by default) is the most one step moves.
      {"shm",
       "flat_max_bytes",
       KnobType::kBytes,
       0,
       4 << 20,
       {},
       {"allreduce", "reduce"},
       "ShmBackendOptions::flat_max_bytes"},
      {"shm",
       "chunk_bytes",
       KnobType::kBytes,
       4 * 1024,
       4 << 20,
       {},
       {"allreduce", "reduce"},
       "ShmBackendOptions::chunk_bytes"},
      {"hier",
       "enabled",
       KnobType::kBool,
       0,
       1,
       {},
       {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall"},
       "not applied: the hierarchical backend is chosen at creation, not per op and size"},
  };
  return *knobs;
}

const TunedKnobSpec* FindTunedKnob(std::string_view backend, std::string_view knob) {
  for (const TunedKnobSpec& k : TunedKnobs()) {
    if (k.backend == backend && k.knob == knob) return &k;
  }
  return nullptr;
}

std::string TunedEntry::Describe() const {
  std::string band = absl::StrCat("(", BytesText(min_bytes), ", ", BytesText(max_bytes), "]");
  std::string what;
  if (backend == "nccl") {
    if (algorithm && protocol) {
      what = absl::StrCat(NcclAlgorithmName(*algorithm), "/", NcclProtocolName(*protocol));
    }
    if (channels > 0) {
      absl::StrAppend(&what, what.empty() ? "" : ", ", channels, " channels");
    }
  } else {
    what = absl::StrCat(knob, "=", value);
  }
  return absl::StrCat(backend, " ", op, " ", band, ": ", what);
}

const TunedEntry* TunedTable::FindNccl(std::string_view op, uint64_t bytes) const {
  for (const TunedEntry& e : entries) {
    if (e.backend == "nccl" && e.op == op && e.Covers(bytes)) return &e;
  }
  return nullptr;
}

const TunedEntry* TunedTable::FindKnob(std::string_view backend, std::string_view op,
                                       std::string_view knob, uint64_t bytes) const {
  for (const TunedEntry& e : entries) {
    if (e.backend == backend && e.op == op && e.knob == knob && e.Covers(bytes)) return &e;
  }
  return nullptr;
}

SizeBands TunedTable::KnobBands(std::string_view backend, std::string_view op,
                                std::string_view knob) const {
  SizeBands bands;
  for (const TunedEntry& e : entries) {
    if (e.backend == backend && e.op == op && e.knob == knob) {
      bands.push_back({e.min_bytes, e.max_bytes, e.number});
    }
  }
  return bands;
}

absl::StatusOr<TunedTable> ParseTunedTable(const std::string& text, const std::string& file) {
  auto root_or = ParseYaml(text, file);
  if (!root_or.ok()) return root_or.status();
  const YAML::Node root = *root_or;
  if (!root.IsMap()) {
    return ErrorAt(file, root,
                   "not a tuned table: expected a map with schema, kind, fingerprint and entries");
  }
  if (absl::Status s = CheckKeys(file, root, kTopKeys, "a tuned table"); !s.ok()) return s;
  for (const char* key : {"schema", "kind", "fingerprint", "entries"}) {
    if (!root[key]) return ErrorAt(file, root, absl::StrCat("a tuned table needs '", key, "'"));
  }
  auto schema = ScalarAt(file, root["schema"], "schema");
  if (!schema.ok()) return schema.status();
  if (*schema != absl::StrCat(kTunedTableSchema)) {
    return ErrorAt(file, root["schema"],
                   absl::StrCat("schema ", *schema, " is not one this adaptcomm reads (",
                                kTunedTableSchema, "); re-run adaptcomm tune"));
  }
  auto kind = ScalarAt(file, root["kind"], "kind");
  if (!kind.ok()) return kind.status();
  if (*kind != kTunedTableKind) {
    return ErrorAt(file, root["kind"],
                   absl::StrCat("kind '", *kind, "' is not '", kTunedTableKind,
                                "': this file is not a tuned table"));
  }
  TunedTable table;
  table.file = file;
  if (root["description"]) {
    auto d = TextAt(file, root["description"], "description");
    if (!d.ok()) return d.status();
    table.description = *d;
  }
  if (absl::Status s = ParseFingerprint(file, root["fingerprint"], table); !s.ok()) return s;

  const YAML::Node entries = root["entries"];
  if (!entries.IsSequence() && !entries.IsNull()) {
    return ErrorAt(file, entries, "entries must be a list");
  }
  if (entries.IsSequence() && entries.size() > static_cast<size_t>(kTunedMaxEntries)) {
    return ErrorAt(
        file, entries,
        absl::StrCat(entries.size(), " entries is more than the limit of ", kTunedMaxEntries));
  }
  if (entries.IsSequence()) {
    for (const auto& node : entries) {
      auto entry = ParseEntry(file, node);
      if (!entry.ok()) return entry.status();
      table.entries.push_back(*std::move(entry));
    }
    if (absl::Status s = CheckBands(file, entries, table.entries); !s.ok()) return s;
  }
  return table;
}

absl::StatusOr<TunedTable> LoadTunedTable(const std::string& path) {
  auto text = ReadConfigFile(path);
  if (!text.ok()) return text.status();
  return ParseTunedTable(*text, path);
}

absl::StatusOr<TunedTable> LoadTunedTableFor(const std::string& path,
                                             const TopologyFingerprint& current) {
  auto table = LoadTunedTable(path);
  if (!table.ok()) return table.status();
  if (absl::Status s = CheckFingerprint(*table, current); !s.ok()) return s;
  return table;
}

absl::Status CheckFingerprint(const TunedTable& table, const TopologyFingerprint& current) {
  if (auto diff = FirstDifference(table.fingerprint, current)) {
    auto where = table.fingerprint_where.find(diff->field);
    return absl::FailedPreconditionError(
        absl::StrCat(where != table.fingerprint_where.end() ? where->second : table.file, ": ",
                     diff->Describe(), " (re-run adaptcomm tune for this topology)"));
  }
  return absl::OkStatus();
}

std::string FormatTunedTable(const TunedTable& table) {
  // Quoted with YAML's double-quoted escapes, so any text reads back unchanged.
  auto quoted = [](const std::string& s) {
    YAML::Emitter out;
    out << YAML::DoubleQuoted << s;
    return std::string(out.c_str());
  };
  const TopologyFingerprint& fp = table.fingerprint;
  std::ostringstream out;
  out << "# Written by adaptcomm tune: measured winners per size band (lib/config/tuned_table.h).\n"
      << "schema: " << kTunedTableSchema << "\n"
      << "kind: " << kTunedTableKind << "\n";
  if (!table.description.empty()) out << "description: " << quoted(table.description) << "\n";
  out << "fingerprint:\n"
      << "  hosts: " << fp.hosts << "\n"
      << "  ranks_per_host: " << fp.ranks_per_host << "\n"
      << "  cores: " << fp.cores << "\n"
      << "  backend: " << quoted(fp.backend) << "\n"
      << "  gloo: " << quoted(fp.gloo) << "\n"
      << "  nccl: " << quoted(fp.nccl) << "\n"
      << "  gpu: " << quoted(fp.gpu) << "\n"
      << "  interconnect: " << quoted(fp.interconnect) << "\n";
  if (table.entries.empty()) {
    out << "entries: []\n";
    return out.str();
  }
  out << "entries:\n";
  for (const TunedEntry& e : table.entries) {
    out << "  - {backend: " << e.backend << ", op: " << e.op << ", max_bytes: "
        << (e.max_bytes == kTunedMaxBytesUnbounded ? std::string("max")
                                                   : absl::StrCat(e.max_bytes));
    if (e.backend == "nccl") {
      if (e.algorithm && e.protocol) {
        out << ", algorithm: " << NcclAlgorithmName(*e.algorithm)
            << ", protocol: " << NcclProtocolName(*e.protocol);
      }
      if (e.channels > 0) out << ", channels: " << e.channels;
    } else {
      out << ", knob: " << e.knob << ", value: " << quoted(e.value);
    }
    if (!e.source.empty()) out << ",\n     source: " << quoted(e.source);
    out << "}\n";
  }
  return out.str();
}

}  // namespace adaptcomm::config

#include "lib/config/tuning.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/config/tuned_table.h"
#include "lib/config/yaml_util.h"

namespace adaptcomm::config {
namespace {

void SetRow(EffectiveConfig& cfg, const std::string& key, const std::string& value,
            const std::string& source, const std::string& applied_as) {
  auto it = std::find_if(cfg.settings.begin(), cfg.settings.end(),
                         [&](const SettingRecord& s) { return s.key == key; });
  if (it == cfg.settings.end()) {
    cfg.settings.push_back({key, value, source, applied_as, ""});
  } else {
    *it = {key, value, source, applied_as, it->overridden};
  }
}

// "tuned.shm.allreduce.chunk_bytes (1 MiB, 4 MiB]": the entry's knob and band, unique per table.
std::string RowKey(const TunedEntry& e) {
  const std::string described = e.Describe();  // "shm allreduce (1 MiB, 4 MiB]: chunk_bytes=..."
  const size_t open = described.find('(');
  const size_t close = described.find(']');
  const std::string band = open == std::string::npos || close == std::string::npos
                               ? ""
                               : described.substr(open, close - open + 1);
  const std::string knob = e.backend == "nccl" ? "nccl" : e.knob;
  return absl::StrCat("tuned.", e.backend, ".", e.op, ".", knob, " ", band);
}

std::string RowValue(const TunedEntry& e) {
  if (e.backend != "nccl") return e.value;
  const std::string described = e.Describe();
  const size_t colon = described.rfind(": ");
  return colon == std::string::npos ? described : described.substr(colon + 2);
}

std::string AppliedAs(const TunedEntry& e) {
  if (e.backend == "nccl") {
    return "NCCL tuner plugin (ADAPTCOMM_NCCL_TUNER_TABLE), this band";
  }
  const TunedKnobSpec* spec = FindTunedKnob(e.backend, e.knob);
  if (spec != nullptr && absl::StartsWith(spec->applies_as, "not applied")) return spec->applies_as;
  return absl::StrCat(spec != nullptr ? spec->applies_as : e.knob,
                      ", this band, when the fingerprint matches");
}

}  // namespace

std::string TunedTableDigest(const std::string& bytes) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a 64
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return absl::StrFormat("%016x", h);
}

void AttachTunedTable(EffectiveConfig& cfg, const std::string& path, const std::string& source) {
  if (path.empty()) return;
  TuningSettings& t = cfg.tuning;
  t.table = path;
  t.source = source;
  SetRow(cfg, "tuning.table", path, source,
         "tuned values per size band (adaptcomm tune), on the topology they were measured on");
  absl::StatusOr<std::string> text = ReadConfigFile(path);
  if (!text.ok()) {
    t.digest = "unreadable";
    t.refused = std::string(text.status().message());
  } else {
    t.digest = TunedTableDigest(*text);
    absl::StatusOr<TunedTable> table = ParseTunedTable(*text, path);
    if (table.ok()) {
      t.loaded = std::make_shared<const TunedTable>(*std::move(table));
    } else {
      t.refused = std::string(table.status().message());
    }
  }
  // The digest's source is the table itself, never "env ...": CanonicalListing compares it on
  // every rank wherever the path came from.
  SetRow(cfg, "tuning.table_digest", t.digest, absl::StrCat("tuned table ", path),
         "FNV-1a 64 of the table's bytes: every rank must load the same table");
  if (!t.refused.empty()) {
    cfg.warnings.push_back(absl::StrCat("tuned table ", path, " (", source,
                                        ") refused: ", t.refused, "; the static profile applies"));
  } else {
    for (const TunedEntry& e : t.loaded->entries) {
      std::string from = e.where;
      if (!e.source.empty()) absl::StrAppend(&from, " (", e.source, ")");
      SetRow(cfg, RowKey(e), RowValue(e), from, AppliedAs(e));
    }
  }
  std::sort(cfg.settings.begin(), cfg.settings.end(),
            [](const SettingRecord& a, const SettingRecord& b) { return a.key < b.key; });
}

}  // namespace adaptcomm::config

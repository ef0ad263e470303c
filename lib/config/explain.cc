// The effective-configuration report: a table for people, JSON for tools, and the canonical
// listing whose hash every rank compares.
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "adaptcomm/profile.h"
#include "lib/config/units.h"
#include "nlohmann/json.hpp"

namespace adaptcomm {
namespace {

std::string HashText(uint64_t h) { return absl::StrFormat("%016x", h); }

std::string ModelText(const EffectiveConfig& c) {
  if (c.model_params == 0) return "(no size given)";
  return absl::StrCat(config::FormatModelSize(c.model_params), " (", c.model_params,
                      " parameters)");
}

}  // namespace

std::string EffectiveConfig::CanonicalListing() const {
  // NCCL variables the user exported may legitimately differ between hosts (interface names);
  // the tuned table's path may too, and its digest is compared instead. Every other setting,
  // wherever it came from, must match.
  std::string out = absl::StrCat("profile.tier=", tier, "\n");
  for (const SettingRecord& s : settings) {
    const bool nccl_row = absl::StartsWith(s.key, "nccl.") || absl::StartsWith(s.key, "env.");
    if (nccl_row && absl::StartsWith(s.source, "env ")) continue;
    if (s.key == "tuning.table") continue;
    absl::StrAppend(&out, s.key, "=", s.value, "\n");
  }
  return out;
}

uint64_t EffectiveConfig::Hash() const {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a 64
  for (unsigned char c : CanonicalListing()) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::string EffectiveConfig::Explain() const {
  std::string out = "adaptcomm effective configuration\n";
  absl::StrAppend(&out, "  profile file: ", file, "\n");
  absl::StrAppend(&out, "  tier:         ", tier, " (", tier_range, ")\n");
  absl::StrAppend(&out, "  model:        ", ModelText(*this), "\n");
  absl::StrAppend(&out, "  world size:   ", world_size, "\n");
  absl::StrAppend(&out, "  strict:       ", strict ? "yes" : "no", "\n");
  absl::StrAppend(&out, "  hash:         ", HashText(Hash()), "\n");
  for (const std::string& n : notes) absl::StrAppend(&out, "  * ", n, "\n");
  absl::StrAppend(&out,
                  "  precedence:   API > exported environment > tier > defaults/"
                  "infrastructure > built-in default\n\n");
  // A value that beat another source's names it: "API; profiles.yaml:35 said 3".
  auto source = [](const SettingRecord& s) {
    return s.overridden.empty() ? s.source : absl::StrCat(s.source, "; ", s.overridden);
  };
  size_t wk = 7, wv = 5, ws = 6;
  for (const SettingRecord& s : settings) {
    wk = std::max(wk, s.key.size());
    wv = std::max(wv, s.value.size());
    ws = std::max(ws, source(s).size());
  }
  auto row = [&](const std::string& k, const std::string& v, const std::string& s,
                 const std::string& a) {
    absl::StrAppend(&out, absl::StrFormat("%-*s  %-*s  %-*s  %s\n", static_cast<int>(wk), k,
                                          static_cast<int>(wv), v, static_cast<int>(ws), s, a));
  };
  row("SETTING", "VALUE", "SOURCE", "APPLIED AS");
  for (const SettingRecord& s : settings)
    row(s.key, s.value.empty() ? "\"\"" : s.value, source(s), s.applied_as);
  absl::StrAppend(&out, "\nwarnings (", warnings.size(), ")", warnings.empty() ? "" : ":", "\n");
  for (const std::string& w : warnings) absl::StrAppend(&out, "  - ", w, "\n");
  return out;
}

std::string EffectiveConfig::ExplainJson() const {
  nlohmann::json j;
  j["file"] = file;
  j["tier"] = tier;
  j["tier_range"] = tier_range;
  j["model_params"] = model_params;
  j["world_size"] = world_size;
  j["strict"] = strict;
  j["hash"] = HashText(Hash());
  j["world_factor"] = timeouts.world_factor;
  j["notes"] = notes;
  j["warnings"] = warnings;
  nlohmann::json rows = nlohmann::json::array();
  for (const SettingRecord& s : settings) {
    nlohmann::json row = {
        {"key", s.key}, {"value", s.value}, {"source", s.source}, {"applied_as", s.applied_as}};
    if (!s.overridden.empty()) row["overridden"] = s.overridden;
    rows.push_back(std::move(row));
  }
  j["settings"] = rows;
  // Invalid UTF-8 from a profile must not throw here.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace adaptcomm

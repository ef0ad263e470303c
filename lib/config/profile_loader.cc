#include "lib/config/profile_loader.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "lib/base/log.h"
#include "lib/config/profile_schema.h"
#include "lib/config/resolve_internal.h"
#include "lib/config/units.h"
#include "lib/config/yaml_util.h"

namespace adaptcomm::config {
namespace {

constexpr uint64_t kNoUpperBound = std::numeric_limits<uint64_t>::max();

// One section (infrastructure, defaults, or a tier) after validation.
struct Layer {
  std::map<std::string, Layered> values;                  // schema key -> value
  std::vector<std::pair<std::string, NcclLayered>> nccl;  // canonical name -> value, in order
  std::vector<std::string> warnings;
  std::vector<std::string> refusals;  // what strict mode refuses
};

struct TierDef {
  std::string name;
  std::string range_text = "any";
  uint64_t lo = 0;
  uint64_t hi = kNoUpperBound;
  YAML::Node node;
  YAML::Node params_node;
};

std::string DidYouMeanSuffix(const std::string& hint) {
  return hint.empty() ? "" : absl::StrCat(" (did you mean '", hint, "'?)");
}

// One NCCL_* entry (scalar or {value, force}) checked against the registry.
absl::Status ParseNcclEntry(const std::string& file, const YAML::Node& key, const YAML::Node& body,
                            bool env_block, const NcclRegistry& reg, Layer* layer) {
  auto name_or = ScalarAt(file, key, "a variable name");
  if (!name_or.ok()) return name_or.status();
  const std::string name = *name_or;
  NcclLayered entry;
  if (body.IsMap()) {
    for (const auto& kv : body) {
      const std::string k = kv.first.Scalar();
      if (k == "value") {
        continue;
      } else if (k == "force") {
        auto b = ParseBool(kv.second.IsScalar() ? kv.second.Scalar() : "");
        if (!b.ok()) return ErrorAt(file, kv.second, "force must be true or false");
        entry.force = *b;
      } else if (k != "why") {
        return ErrorAt(file, kv.first,
                       absl::StrCat("unknown field '", k, "' of ", name,
                                    DidYouMeanSuffix(ClosestName(k, {"value", "force", "why"}))));
      }
    }
    if (!body["value"]) return ErrorAt(file, body, absl::StrCat(name, " needs a value"));
  }
  // Copy-constructed, never assigned: assigning a yaml-cpp node rewrites the tree it points into.
  const YAML::Node value_node = body.IsMap() ? body["value"] : body;
  auto value_or = ScalarAt(file, value_node, name);
  if (!value_or.ok()) return value_or.status();
  entry.source = WhereLine(file, value_node);
  entry.where = Where(file, value_node);
  const std::string at = Where(file, key);

  if (!absl::StartsWith(name, "NCCL_")) {
    if (!env_block) {
      return ErrorAt(file, key,
                     absl::StrCat("'", name,
                                  "' is not an NCCL_* variable; put other "
                                  "variables under infrastructure.env"));
    }
    entry.value = *value_or;
    layer->nccl.emplace_back(name, entry);
    return absl::OkStatus();
  }
  const NcclParam* param = reg.Lookup(name);
  if (param == nullptr) {
    std::string hint = reg.DidYouMean(name);
    std::string msg = absl::StrCat(at, ": ", name, " is unknown to NCCL",
                                   hint.empty() ? "" : absl::StrCat(" (did you mean ", hint, "?)"),
                                   "; passed on unchanged");
    layer->warnings.push_back(msg);
    layer->refusals.push_back(msg);
    entry.value = *value_or;
    layer->nccl.emplace_back(name, entry);
    return absl::OkStatus();
  }
  if (param->status == ParamStatus::kNeverRead || param->status == ParamStatus::kMetadata) {
    std::string hint = reg.DidYouMean(name);
    std::string msg = absl::StrCat(
        at, ": ", name,
        param->status == ParamStatus::kMetadata ? " is not an NCCL setting ("
                                                : " is never read by NCCL (",
        param->note, "); dropped", hint.empty() ? "" : absl::StrCat("; did you mean ", hint, "?"));
    layer->warnings.push_back(msg);
    layer->refusals.push_back(msg);
    return absl::OkStatus();
  }
  const NcclParam* canonical = reg.Canonical(name);
  if (canonical == nullptr)
    return ErrorAt(file, key, absl::StrCat(name, ": broken registry alias"));
  auto normalized = reg.Normalize(*canonical, *value_or);
  if (!normalized.ok()) {
    return ErrorAt(file, value_node, std::string(normalized.status().message()));
  }
  entry.value = *normalized;
  if (param->status == ParamStatus::kDeprecated) {
    layer->warnings.push_back(
        absl::StrCat(at, ": ", name, " is a deprecated alias of ", canonical->name, " since NCCL ",
                     param->since, ": using ", canonical->name, "=", entry.value,
                     canonical->config_field.empty()
                         ? ""
                         : absl::StrCat(" (ncclConfig_t.", canonical->config_field, ")")));
  } else if (param->status == ParamStatus::kPluginOnly) {
    layer->warnings.push_back(absl::StrCat(at, ": ", name, " is read only by ", param->plugin,
                                           ", not by NCCL; set for the plugin"));
  }
  if (canonical->name == "NCCL_BUFFSIZE") {
    uint64_t bytes = 0;
    if (absl::SimpleAtoi(entry.value, &bytes) && (bytes & (bytes - 1)) != 0) {
      layer->warnings.push_back(absl::StrCat(at, ": NCCL_BUFFSIZE=", entry.value,
                                             " is not a power of two (NCCL recommends one)"));
    }
  }
  for (const auto& [existing, unused] : layer->nccl) {
    if (existing == canonical->name) {
      return ErrorAt(
          file, key,
          absl::StrCat(name, " sets ", canonical->name, ", which this block already sets"));
    }
  }
  layer->nccl.emplace_back(canonical->name, entry);
  return absl::OkStatus();
}

absl::Status ParseNcclMap(const std::string& file, const YAML::Node& node, bool env_block,
                          const NcclRegistry& reg, Layer* layer) {
  if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return ErrorAt(file, node, "expected a map of VARIABLE: value");
  for (const auto& kv : node) {
    absl::Status s = ParseNcclEntry(file, kv.first, kv.second, env_block, reg, layer);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The names one level below `prefix` in the schema: "tuning" -> table, online.
std::vector<std::string> KeysBelow(const std::string& prefix) {
  std::vector<std::string> keys;
  for (const KeySpec& spec : Schema()) {
    const std::string key = spec.key;
    if (!absl::StartsWith(key, prefix + ".")) continue;
    std::string next = key.substr(prefix.size() + 1);
    next = next.substr(0, next.find('.'));
    if (std::find(keys.begin(), keys.end(), next) == keys.end()) keys.push_back(next);
  }
  return keys;
}

// One schema key's value (`node`), checked and put into `layer`.
absl::Status ParseValue(const std::string& file, const KeySpec& spec, const YAML::Node& node,
                        Layer* layer) {
  std::string text;
  const bool list = spec.kind == Kind::kCodeList || spec.kind == Kind::kNameList;
  if (list && node.IsSequence()) {
    std::vector<std::string> items;
    for (const auto& item : node) {
      auto s = ScalarAt(file, item, spec.key);
      if (!s.ok()) return s.status();
      items.push_back(*s);
    }
    text = absl::StrJoin(items, ",");
  } else {
    auto s = ScalarAt(file, node, spec.key);
    if (!s.ok()) return s.status();
    text = *s;
  }
  auto canonical = CanonicalValue(spec, text);
  if (!canonical.ok()) return ErrorAt(file, node, std::string(canonical.status().message()));
  layer->values[spec.key] = {*canonical, WhereLine(file, node), Where(file, node), ""};
  return absl::OkStatus();
}

// The schema keys of the map `node` at `prefix` ("tuning"), and those of the maps inside it
// ("tuning.online": {enabled: true, ...}).
absl::Status ParseKeys(const std::string& file, const std::string& prefix, const YAML::Node& node,
                       Layer* layer) {
  const std::vector<std::string> keys = KeysBelow(prefix);
  for (const auto& entry : node) {
    auto key_or = ScalarAt(file, entry.first, "a key");
    if (!key_or.ok()) return key_or.status();
    const std::string full = absl::StrCat(prefix, ".", *key_or);
    const KeySpec* spec = FindKey(full);
    if (spec == nullptr) {
      const std::vector<std::string> inner = KeysBelow(full);
      if (inner.empty()) {
        return ErrorAt(
            file, entry.first,
            absl::StrCat("unknown key '", full, "'", DidYouMeanSuffix(ClosestName(*key_or, keys))));
      }
      if (!entry.second.IsMap()) {
        return ErrorAt(file, entry.second,
                       absl::StrCat(full, " must be a map of ", absl::StrJoin(inner, ", ")));
      }
      if (absl::Status s = ParseKeys(file, full, entry.second, layer); !s.ok()) return s;
      continue;
    }
    if (absl::Status s = ParseValue(file, *spec, entry.second, layer); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A defaults block or a tier: sections of schema keys plus `nccl`. `extra` are keys handled by
// the caller (name, params, description).
absl::Status ParseSection(const std::string& file, const YAML::Node& node,
                          const std::vector<std::string>& extra, const NcclRegistry& reg,
                          Layer* layer) {
  if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return ErrorAt(file, node, "expected a map");
  std::vector<std::string> allowed = SectionNames();
  allowed.push_back("nccl");
  allowed.insert(allowed.end(), extra.begin(), extra.end());
  for (const auto& kv : node) {
    auto section_or = ScalarAt(file, kv.first, "a key");
    if (!section_or.ok()) return section_or.status();
    const std::string section = *section_or;
    if (std::find(extra.begin(), extra.end(), section) != extra.end()) continue;
    if (section == "nccl") {
      absl::Status s = ParseNcclMap(file, kv.second, /*env_block=*/false, reg, layer);
      if (!s.ok()) return s;
      continue;
    }
    if (std::find(allowed.begin(), allowed.end(), section) == allowed.end()) {
      return ErrorAt(file, kv.first,
                     absl::StrCat("unknown key '", section, "'",
                                  DidYouMeanSuffix(ClosestName(section, allowed))));
    }
    if (section == "store" && kv.second.IsScalar()) {  // `store: redis://...` is store.url
      if (absl::Status s = ParseValue(file, *FindKey("store.url"), kv.second, layer); !s.ok()) {
        return s;
      }
      continue;
    }
    if (!kv.second.IsMap())
      return ErrorAt(file, kv.second, absl::StrCat(section, " must be a map"));
    if (absl::Status s = ParseKeys(file, section, kv.second, layer); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// "<=7B", "<7B", ">=100B", ">100B", "30B-100B" (30B <= p < 100B), "any".
absl::Status ParseRange(const std::string& file, const YAML::Node& node, TierDef* tier) {
  auto text_or = ScalarAt(file, node, "params");
  if (!text_or.ok()) return text_or.status();
  std::string t(absl::StripAsciiWhitespace(*text_or));
  tier->range_text = t;
  auto size = [&](const std::string& s) -> absl::StatusOr<uint64_t> {
    auto v = ParseModelSize(s);
    if (!v.ok()) return ErrorAt(file, node, std::string(v.status().message()));
    return *v;
  };
  if (t == "any") return absl::OkStatus();
  absl::StatusOr<uint64_t> v;
  if (absl::StartsWith(t, "<=")) {
    if (!(v = size(t.substr(2))).ok()) return v.status();
    tier->hi = *v;
  } else if (absl::StartsWith(t, ">=")) {
    if (!(v = size(t.substr(2))).ok()) return v.status();
    tier->lo = *v;
  } else if (absl::StartsWith(t, "<")) {
    if (!(v = size(t.substr(1))).ok()) return v.status();
    tier->hi = *v - 1;
  } else if (absl::StartsWith(t, ">")) {
    if (!(v = size(t.substr(1))).ok()) return v.status();
    tier->lo = *v + 1;
  } else if (size_t dash = t.find('-'); dash != std::string::npos) {
    auto lo = size(t.substr(0, dash));
    if (!lo.ok()) return lo.status();
    auto hi = size(t.substr(dash + 1));
    if (!hi.ok()) return hi.status();
    if (*lo >= *hi) return ErrorAt(file, node, "range is empty or inverted (low-high)");
    // Half-open, so that "30B-100B" and ">=100B" meet without overlapping.
    tier->lo = *lo;
    tier->hi = *hi - 1;
  } else {
    return ErrorAt(file, node, "params must be '<=7B', '>=100B', '30B-100B' or 'any'");
  }
  return absl::OkStatus();
}

std::string RangeText(const TierDef& t) { return t.range_text; }

absl::StatusOr<std::vector<TierDef>> ParseTiers(const std::string& file, const YAML::Node& node) {
  std::vector<TierDef> tiers;
  if (!node || !node.IsSequence() || node.size() == 0) {
    return ErrorAt(file, node, "tiers must be a non-empty list");
  }
  std::set<std::string> names;
  for (const auto& item : node) {
    TierDef tier;
    tier.node.reset(item);
    if (!item.IsMap()) return ErrorAt(file, item, "a tier must be a map with name and params");
    const YAML::Node name = item["name"];
    if (!name) return ErrorAt(file, item, "tier without a name");
    auto name_or = ScalarAt(file, name, "name");
    if (!name_or.ok()) return name_or.status();
    tier.name = *name_or;
    if (tier.name.empty() || !names.insert(tier.name).second) {
      return ErrorAt(file, name, "tier names must be unique and non-empty");
    }
    if (const YAML::Node params = item["params"]) {
      tier.params_node.reset(params);
      absl::Status s = ParseRange(file, params, &tier);
      if (!s.ok()) return s;
    }
    tiers.push_back(std::move(tier));
  }
  for (size_t i = 1; i < tiers.size(); ++i) {
    const TierDef& prev = tiers[i - 1];
    const TierDef& cur = tiers[i];
    YAML::Node at = cur.params_node ? cur.params_node : cur.node;
    if (cur.lo <= prev.hi) {
      bool overlap = cur.hi >= prev.lo;
      return ErrorAt(file, at,
                     absl::StrCat("tier '", cur.name, "' (", RangeText(cur), ") ",
                                  overlap ? "overlaps" : "must come before", " tier '", prev.name,
                                  "' (", RangeText(prev), ")",
                                  overlap ? "" : ": list tiers from smallest to largest"));
    }
  }
  return tiers;
}

}  // namespace

double WorldScalingFactor(int world, int reference_world, double per_doubling, double max_factor) {
  if (world <= reference_world || reference_world <= 0) return 1.0;
  double f = 1.0 + per_doubling * std::log2(static_cast<double>(world) / reference_world);
  return std::max(1.0, std::min(max_factor, f));
}

namespace {

// The top-level keys a profile file may hold, and its schema version.
absl::Status CheckTopLevel(const std::string& file, const YAML::Node& root) {
  if (!root.IsMap()) return ErrorAt(file, root, "a profile file must be a map");
  const std::vector<std::string> top = {"schema", "description", "infrastructure", "defaults",
                                        "tiers"};
  for (const auto& kv : root) {
    auto key = ScalarAt(file, kv.first, "a key");
    if (!key.ok()) return key.status();
    if (std::find(top.begin(), top.end(), *key) == top.end()) {
      return ErrorAt(file, kv.first,
                     absl::StrCat("unknown top-level key '", *key, "'",
                                  DidYouMeanSuffix(ClosestName(*key, top))));
    }
  }
  if (const YAML::Node schema = root["schema"]) {
    if (!schema.IsScalar() || schema.Scalar() != "1") {
      return ErrorAt(file, schema, "this adaptcomm reads profile schema 1");
    }
  }
  return absl::OkStatus();
}

// The infrastructure block: its NCCL environment (`env`) and a description.
absl::Status ParseInfrastructure(const std::string& file, const YAML::Node& root,
                                 const NcclRegistry& reg, Layer* infra) {
  const YAML::Node node = root["infrastructure"];
  if (!node) return absl::OkStatus();
  if (!node.IsMap()) return ErrorAt(file, node, "infrastructure must be a map");
  for (const auto& kv : node) {
    const std::string k = kv.first.Scalar();
    if (k == "env") {
      absl::Status s = ParseNcclMap(file, kv.second, /*env_block=*/true, reg, infra);
      if (!s.ok()) return s;
    } else if (k != "description") {
      return ErrorAt(file, kv.first,
                     absl::StrCat("unknown key 'infrastructure.", k, "'",
                                  DidYouMeanSuffix(ClosestName(k, {"env"}))));
    }
  }
  return absl::OkStatus();
}

// Every tier's settings, so a broken tier is found whichever one is selected.
absl::StatusOr<std::vector<Layer>> ParseTierLayers(const std::string& file,
                                                   const std::vector<TierDef>& tiers,
                                                   const NcclRegistry& reg) {
  std::vector<Layer> tier_layers(tiers.size());
  for (size_t i = 0; i < tiers.size(); ++i) {
    absl::Status s =
        ParseSection(file, tiers[i].node, {"name", "params", "description"}, reg, &tier_layers[i]);
    if (!s.ok()) return s;
  }
  if (tiers.size() > 1) {
    for (const TierDef& t : tiers) {
      if (!t.params_node) {
        return ErrorAt(file, t.node,
                       absl::StrCat("tier '", t.name,
                                    "' needs params when the "
                                    "file has several tiers"));
      }
    }
  }
  return tier_layers;
}

// The tier of `in`: by name, else by model size (the smallest without one; the next larger one
// in a gap between tiers). Fills `sel` with the choice and why.
absl::StatusOr<size_t> SelectTier(const ResolveInputs& in, const std::vector<TierDef>& ts,
                                  Selection& sel) {
  size_t chosen = 0;
  if (!in.tier_name.empty()) {
    std::vector<std::string> names;
    bool found = false;
    for (size_t i = 0; i < ts.size(); ++i) {
      names.push_back(ts[i].name);
      if (ts[i].name == in.tier_name) {
        chosen = i;
        found = true;
      }
    }
    if (!found) {
      std::string hint = ClosestName(in.tier_name, names);
      return absl::NotFoundError(absl::StrCat(
          "'", in.tier_name, "' is neither a model size (7B, 1.5T, 7000000000) nor a profile in ",
          in.file, " (profiles: ", absl::StrJoin(names, ", "), ")",
          hint.empty() ? "" : absl::StrCat("; did you mean '", hint, "'?")));
    }
    sel.note = absl::StrCat("profile '", ts[chosen].name, "' selected by name");
  } else if (in.model_params == 0) {
    sel.note = absl::StrCat("no model size given (ADAPTCOMM_MODEL_SIZE unset): smallest tier '",
                            ts[0].name, "' (", RangeText(ts[0]), ")");
  } else {
    const uint64_t p = in.model_params;
    const std::string size = FormatModelSize(p);
    bool placed = false;
    for (size_t i = 0; i < ts.size() && !placed; ++i) {
      if (p >= ts[i].lo && p <= ts[i].hi) {
        chosen = i;
        placed = true;
        sel.note = absl::StrCat(size, " is in tier '", ts[i].name, "' (", RangeText(ts[i]), ")");
      } else if (p < ts[i].lo) {
        chosen = i;
        placed = true;
        sel.gap = true;
        sel.note = i == 0 ? absl::StrCat(size, " is below every tier: using the smallest tier '",
                                         ts[i].name, "' (", RangeText(ts[i]), ")")
                          : absl::StrCat(size, " falls between tier '", ts[i - 1].name, "' (",
                                         RangeText(ts[i - 1]), ") and tier '", ts[i].name, "' (",
                                         RangeText(ts[i]), "): using the next larger tier '",
                                         ts[i].name, "'");
      }
    }
    if (!placed) {
      chosen = ts.size() - 1;
      sel.gap = true;
      sel.note = absl::StrCat(size, " is above every tier: using the largest tier '",
                              ts[chosen].name, "' (", RangeText(ts[chosen]), ")");
    }
  }
  sel.tier = ts[chosen].name;
  sel.range = RangeText(ts[chosen]);
  return chosen;
}

// The layers merged, later ones winning key by key (an NCCL entry keeps its first place).
MergeInputs MergeLayers(const std::vector<const Layer*>& layers) {
  MergeInputs merge;
  for (const Layer* layer : layers) {
    for (const auto& [k, v] : layer->values) merge.values[k] = v;
    for (const auto& entry : layer->nccl) {
      const std::string& name = entry.first;  // clang 14 cannot capture a structured binding
      auto it = std::find_if(merge.nccl.begin(), merge.nccl.end(),
                             [&](const auto& e) { return e.first == name; });
      if (it == merge.nccl.end()) {
        merge.nccl.push_back(entry);
      } else {
        it->second = entry.second;
      }
    }
    merge.warnings.insert(merge.warnings.end(), layer->warnings.begin(), layer->warnings.end());
    merge.refusals.insert(merge.refusals.end(), layer->refusals.begin(), layer->refusals.end());
  }
  return merge;
}

}  // namespace

absl::StatusOr<EffectiveConfig> ResolveFromText(const ResolveInputs& in, const NcclRegistry& reg) {
  const std::string& file = in.file;
  if (in.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", in.world_size, " must be >= 1"));
  }
  auto root_or = ParseYaml(in.text, file);
  if (!root_or.ok()) return root_or.status();
  const YAML::Node root = *root_or;
  try {
    if (absl::Status s = CheckTopLevel(file, root); !s.ok()) return s;
    Layer infra;
    if (absl::Status s = ParseInfrastructure(file, root, reg, &infra); !s.ok()) return s;
    Layer defaults;
    absl::Status s = ParseSection(file, root["defaults"], {"description"}, reg, &defaults);
    if (!s.ok()) return s;
    auto tiers = ParseTiers(file, root["tiers"]);
    if (!tiers.ok()) return tiers.status();
    absl::StatusOr<std::vector<Layer>> tier_layers = ParseTierLayers(file, *tiers, reg);
    if (!tier_layers.ok()) return tier_layers.status();

    Selection sel;
    absl::StatusOr<size_t> chosen = SelectTier(in, *tiers, sel);
    if (!chosen.ok()) return chosen.status();
    MergeInputs merge = MergeLayers({&infra, &defaults, &(*tier_layers)[*chosen]});
    if (in.strict && !merge.refusals.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("strict profile mode (ADAPTCOMM_PROFILE_STRICT) refuses ", file, ":\n  ",
                       absl::StrJoin(merge.refusals, "\n  ")));
    }
    return Finish(in, reg, sel, std::move(merge));
  } catch (const std::exception& e) {
    // yaml-cpp throws on malformed access; report instead of crossing the API.
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", e.what()));
  }
}

}  // namespace adaptcomm::config

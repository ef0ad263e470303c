#include "lib/config/nccl_registry.h"

#include <algorithm>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "lib/config/units.h"
#include "lib/config/yaml_util.h"

namespace adaptcomm::config {
namespace {

const std::set<std::string>& EntryKeys() {
  static const auto* keys =
      new std::set<std::string>{"status",   "type",  "range",   "values",
                                "default",  "scope", "config",  "env_overrides_config",
                                "alias_of", "since", "suggest", "plugin",
                                "note"};
  return *keys;
}

absl::Status ParseEntry(const std::string& file, const YAML::Node& key, const YAML::Node& body,
                        NcclParam* p) {
  p->name = key.Scalar();
  if (p->name.rfind("NCCL_", 0) != 0) return ErrorAt(file, key, "registry names start with NCCL_");
  if (!body.IsMap()) return ErrorAt(file, body, absl::StrCat(p->name, ": expected a map"));
  std::vector<std::string> known(EntryKeys().begin(), EntryKeys().end());
  for (const auto& kv : body) {
    const std::string k = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (EntryKeys().count(k) == 0) {
      std::string hint = ClosestName(k, known);
      return ErrorAt(
          file, kv.first,
          absl::StrCat("unknown registry field '", k, "'",
                       hint.empty() ? "" : absl::StrCat(" (did you mean '", hint, "'?)")));
    }
    if (k == "range") {
      if (!v.IsSequence() || v.size() != 2) return ErrorAt(file, v, "range must be [min, max]");
      auto lo = ParseInt(v[0].Scalar());
      auto hi = ParseInt(v[1].Scalar());
      if (!lo.ok() || !hi.ok() || *lo > *hi) return ErrorAt(file, v, "range must be [min, max]");
      p->min = *lo;
      p->max = *hi;
      continue;
    }
    if (k == "values") {
      if (!v.IsSequence()) return ErrorAt(file, v, "values must be a list");
      for (const auto& item : v) {
        auto s = ScalarAt(file, item, "a value");
        if (!s.ok()) return s.status();
        p->values.push_back(*s);
      }
      continue;
    }
    if (k == "config") {
      if (!v.IsMap() || !v["field"] || !v["since"]) {
        return ErrorAt(file, v, "config must be {field: NAME, since: VERSION}");
      }
      p->config_field = v["field"].Scalar();
      p->config_since = NcclVersionCode(v["since"].Scalar());
      if (p->config_field.empty() || p->config_since == 0) {
        return ErrorAt(file, v, "config must be {field: NAME, since: VERSION}");
      }
      continue;
    }
    auto text = ScalarAt(file, v, k);
    if (!text.ok()) return text.status();
    if (k == "status") {
      if (*text == "current") {
        p->status = ParamStatus::kCurrent;
      } else if (*text == "deprecated") {
        p->status = ParamStatus::kDeprecated;
      } else if (*text == "never_read") {
        p->status = ParamStatus::kNeverRead;
      } else if (*text == "plugin_only") {
        p->status = ParamStatus::kPluginOnly;
      } else if (*text == "metadata") {
        p->status = ParamStatus::kMetadata;
      } else {
        return ErrorAt(file, v,
                       "status must be current, deprecated, never_read, plugin_only or metadata");
      }
    } else if (k == "type") {
      if (*text == "int") {
        p->type = ParamType::kInt;
      } else if (*text == "bool") {
        p->type = ParamType::kBool;
      } else if (*text == "bytes") {
        p->type = ParamType::kBytes;
      } else if (*text == "string") {
        p->type = ParamType::kString;
      } else {
        return ErrorAt(file, v, "type must be int, bool, bytes or string");
      }
    } else if (k == "scope") {
      if (*text != "process" && *text != "communicator") {
        return ErrorAt(file, v, "scope must be process or communicator");
      }
      p->per_process = *text == "process";
    } else if (k == "env_overrides_config") {
      auto b = ParseBool(*text);
      if (!b.ok()) return ErrorAt(file, v, "expected true or false");
      p->env_overrides_config = *b;
    } else if (k == "default") {
      p->default_value = *text;
    } else if (k == "alias_of") {
      p->alias_of = *text;
    } else if (k == "since") {
      p->since = *text;
    } else if (k == "suggest") {
      p->suggest = *text;
    } else if (k == "plugin") {
      p->plugin = *text;
    } else if (k == "note") {
      p->note = *text;
    }
  }
  if (p->status == ParamStatus::kDeprecated && p->alias_of.empty()) {
    return ErrorAt(file, key, absl::StrCat(p->name, ": a deprecated entry needs alias_of"));
  }
  return absl::OkStatus();
}

}  // namespace

int NcclVersionCode(const std::string& version) {
  std::vector<std::string> parts = absl::StrSplit(version, '.');
  if (parts.size() < 2 || parts.size() > 3) return 0;
  int v[3] = {0, 0, 0};
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!absl::SimpleAtoi(parts[i], &v[i]) || v[i] < 0 || v[i] > 99) return 0;
  }
  // NCCL_VERSION(X,Y,Z) for 2.9 and later: X*10000 + Y*100 + Z.
  return v[0] * 10000 + v[1] * 100 + v[2];
}

std::string NcclVersionText(int code) {
  if (code % 100 == 0) return absl::StrCat(code / 10000, ".", (code / 100) % 100);
  return absl::StrCat(code / 10000, ".", (code / 100) % 100, ".", code % 100);
}

int EditDistance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int sub =
          prev[j - 1] + (absl::ascii_toupper(a[i - 1]) == absl::ascii_toupper(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string ClosestName(const std::string& name, const std::vector<std::string>& candidates) {
  // Allow roughly one edit per four characters, at least two.
  int limit = std::max(2, static_cast<int>(name.size()) / 4);
  std::string best;
  int best_distance = limit + 1;
  for (const std::string& c : candidates) {
    if (name.size() > 200) break;  // keep a fuzzed key cheap
    int d = EditDistance(name, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

absl::StatusOr<NcclRegistry> NcclRegistry::Parse(const std::string& text, const std::string& name) {
  auto root = ParseYaml(text, name);
  if (!root.ok()) return root.status();
  NcclRegistry reg;
  try {
    const YAML::Node params = (*root)["params"];
    if (!root->IsMap() || !params || !params.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected a 'params:' map"));
    }
    for (const auto& kv : params) {
      NcclParam p;
      absl::Status s = ParseEntry(name, kv.first, kv.second, &p);
      if (!s.ok()) return s;
      if (reg.params_.count(p.name) > 0) {
        return ErrorAt(name, kv.first, absl::StrCat("duplicate entry ", p.name));
      }
      reg.params_[p.name] = std::move(p);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", e.what()));
  }
  for (const auto& [n, p] : reg.params_) {
    for (const std::string* target : {&p.alias_of, &p.suggest}) {
      if (!target->empty() && reg.Lookup(*target) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": ", n, " refers to ", *target, ", which has no entry"));
      }
    }
  }
  return reg;
}

absl::StatusOr<NcclRegistry> NcclRegistry::Load(const std::string& path) {
  auto text = ReadConfigFile(path);
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

absl::StatusOr<std::shared_ptr<const NcclRegistry>> NcclRegistry::LoadCached(
    const std::string& path) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache ABSL_GUARDED_BY(mu) =
      new std::map<std::string, std::shared_ptr<const NcclRegistry>>();
  absl::MutexLock lock(&mu);
  auto it = cache->find(path);
  if (it != cache->end()) return it->second;
  auto reg = Load(path);
  if (!reg.ok()) return reg.status();
  auto shared = std::make_shared<const NcclRegistry>(*std::move(reg));
  (*cache)[path] = shared;
  return shared;
}

const NcclParam* NcclRegistry::Lookup(const std::string& name) const {
  auto it = params_.find(name);
  return it == params_.end() ? nullptr : &it->second;
}

const NcclParam* NcclRegistry::Canonical(const std::string& name) const {
  const NcclParam* p = Lookup(name);
  // Bounded: an alias chain longer than the registry would be a cycle.
  for (size_t hops = 0; p != nullptr && !p->alias_of.empty() && hops <= params_.size(); ++hops) {
    p = Lookup(p->alias_of);
  }
  return p;
}

std::string NcclRegistry::DidYouMean(const std::string& name) const {
  const NcclParam* p = Lookup(name);
  // A known name is no typo: only its registry entry may point elsewhere.
  if (p != nullptr) return p->suggest;
  std::vector<std::string> names;
  for (const auto& [n, param] : params_) {
    if (n != name && param.status != ParamStatus::kNeverRead) names.push_back(n);
  }
  std::string best = ClosestName(name, names);
  if (best.empty()) return best;
  const NcclParam* canonical = Canonical(best);
  return canonical != nullptr ? canonical->name : best;
}

absl::StatusOr<std::string> NcclRegistry::Normalize(const NcclParam& param,
                                                    const std::string& value) const {
  auto range_check = [&](int64_t v) -> absl::Status {
    if ((param.min && v < *param.min) || (param.max && v > *param.max)) {
      return absl::OutOfRangeError(
          absl::StrCat(param.name, "=", value, " is outside ", *param.min, "..", *param.max));
    }
    return absl::OkStatus();
  };
  switch (param.type) {
    case ParamType::kInt: {
      auto v = ParseInt(value);
      if (!v.ok())
        return absl::InvalidArgumentError(absl::StrCat(param.name, ": ", v.status().message()));
      if (absl::Status s = range_check(*v); !s.ok()) return s;
      return absl::StrCat(*v);
    }
    case ParamType::kBytes: {
      auto v = ParseByteSize(value);
      if (!v.ok())
        return absl::InvalidArgumentError(absl::StrCat(param.name, ": ", v.status().message()));
      if (absl::Status s = range_check(static_cast<int64_t>(*v)); !s.ok()) return s;
      return absl::StrCat(*v);
    }
    case ParamType::kBool: {
      auto v = ParseBool(value);
      if (!v.ok())
        return absl::InvalidArgumentError(absl::StrCat(param.name, ": ", v.status().message()));
      return std::string(*v ? "1" : "0");
    }
    case ParamType::kString:
      if (!param.values.empty() &&
          std::find(param.values.begin(), param.values.end(), value) == param.values.end()) {
        return absl::InvalidArgumentError(absl::StrCat(param.name, "=", value, " is not one of ",
                                                       absl::StrJoin(param.values, ", ")));
      }
      return value;
  }
  return value;
}

std::string NcclRegistry::Describe(const std::string& name) const {
  const NcclParam* p = Lookup(name);
  if (p == nullptr) {
    std::string hint = DidYouMean(name);
    return absl::StrCat(name, ": unknown to NCCL",
                        hint.empty() ? "" : absl::StrCat(" (did you mean ", hint, "?)"));
  }
  switch (p->status) {
    case ParamStatus::kCurrent:
      return absl::StrCat(name, ": ", p->note);
    case ParamStatus::kDeprecated:
      return absl::StrCat(name, ": deprecated alias of ", p->alias_of, " since NCCL ", p->since,
                          " (", p->note, ")");
    case ParamStatus::kNeverRead:
      return absl::StrCat(
          name, ": never read by NCCL: ", p->note,
          p->suggest.empty() ? "" : absl::StrCat(" (did you mean ", p->suggest, "?)"));
    case ParamStatus::kPluginOnly:
      return absl::StrCat(name, ": read only by ", p->plugin, ", not by NCCL");
    case ParamStatus::kMetadata:
      return absl::StrCat(name, ": not an NCCL setting: ", p->note);
  }
  return name;
}

}  // namespace adaptcomm::config

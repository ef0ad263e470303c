#include "lib/diag/env_lint.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace adaptcomm::diag {
namespace {

// Variables read by adaptcomm itself and by Gloo/PyTorch's Gloo glue. Keep in step with the
// getenv calls in lib/ and tools/.
const std::set<std::string>& KnownNonNcclNames() {
  static const auto* names = new std::set<std::string>{
      "ADAPTCOMM_ABSL_DEADLOCK_DETECTION",
      "ADAPTCOMM_BINARY_DIR",
      "ADAPTCOMM_CONFIG_DIR",
      "ADAPTCOMM_CUDA_DEVICE",
      "ADAPTCOMM_ELASTIC",
      "ADAPTCOMM_ELASTIC_JOIN",
      "ADAPTCOMM_ELASTIC_MIN_WORLD",
      "ADAPTCOMM_FLIGHT_RECORDER_DIR",
      "ADAPTCOMM_LOG_FILE",
      "ADAPTCOMM_LOG_LEVEL",
      "ADAPTCOMM_MASTER_ADDR",
      "ADAPTCOMM_MASTER_PORT",
      "ADAPTCOMM_MODEL_SIZE",
      "ADAPTCOMM_NCCL_LIBRARY",
      "ADAPTCOMM_NCCL_TUNER_TABLE",
      "ADAPTCOMM_ONLINE_TUNING",
      "ADAPTCOMM_PROFILE",
      "ADAPTCOMM_PROFILE_STRICT",
      "ADAPTCOMM_SOURCE_DIR",
      "ADAPTCOMM_STORE_EXTERNAL",
      "ADAPTCOMM_STORE_TOKEN",
      "ADAPTCOMM_TRACE",
      "ADAPTCOMM_TRACE_DIR",
      "ADAPTCOMM_TUNED_TABLE",
      "GLOO_DEVICE_TRANSPORT",
      "GLOO_SOCKET_IFNAME",
  };
  return *names;
}

bool IsLoopbackAddress(const std::string& addr) {
  return absl::StartsWith(addr, "127.") || addr == "::1";
}

const Interface* FindInterface(const std::vector<Interface>& ifs, const std::string& name) {
  for (const Interface& i : ifs) {
    if (i.name == name) return &i;
  }
  return nullptr;
}

std::string UpInterfaces(const std::vector<Interface>& ifs) {
  std::vector<std::string> up;
  for (const Interface& i : ifs) {
    if (i.up) up.push_back(i.name);
  }
  return up.empty() ? "none" : absl::StrJoin(up, ", ");
}

}  // namespace

std::vector<Interface> ListInterfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_name == nullptr) continue;
    const bool up = (a->ifa_flags & IFF_UP) != 0 && (a->ifa_flags & IFF_RUNNING) != 0;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const Interface& i) { return i.name == a->ifa_name; });
    if (it == out.end()) {
      out.push_back({a->ifa_name, up, (a->ifa_flags & IFF_LOOPBACK) != 0});
    } else {
      it->up = it->up || up;
    }
  }
  freeifaddrs(list);
  return out;
}

std::vector<std::string> ResolveHost(const std::string& host) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    const void* src =
        a->ai_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (inet_ntop(a->ai_family, src, buf, sizeof(buf)) != nullptr &&
        std::find(out.begin(), out.end(), buf) == out.end()) {
      out.push_back(buf);
    }
  }
  freeaddrinfo(res);
  return out;
}

bool NcclIfnameMatches(const std::string& raw, const std::vector<Interface>& interfaces,
                       std::string& why) {
  std::string value = raw;
  bool exclude = false, exact = false;
  if (absl::StartsWith(value, "^")) {
    exclude = true;
    value = value.substr(1);
  }
  if (absl::StartsWith(value, "=")) {
    exact = true;
    value = value.substr(1);
  }
  std::vector<std::string> specs = absl::StrSplit(value, ',', absl::SkipEmpty());
  auto selects = [&](const std::string& name) {
    for (const std::string& s : specs) {
      if (exact ? name == s : absl::StartsWith(name, s)) return true;
    }
    return false;
  };
  std::vector<std::string> down;
  for (const Interface& i : interfaces) {
    const bool chosen = exclude ? !selects(i.name) : selects(i.name);
    if (!chosen) continue;
    if (i.up) return true;
    down.push_back(i.name);
  }
  why = down.empty()
            ? absl::StrCat("matches no interface (up: ", UpInterfaces(interfaces), ")")
            : absl::StrCat("matches only interfaces that are down: ", absl::StrJoin(down, ", "));
  return false;
}

namespace {

void Add(std::vector<CheckResult>& out, std::string check, CheckStatus st, std::string detail,
         std::string fix = "") {
  out.push_back({std::move(check), st, std::move(detail), std::move(fix)});
}

// One NCCL_ variable against NCCL's parameter registry; whether it is clean.
bool LintNcclVariable(const std::string& name, const std::string& value, const EnvLintInput& in,
                      std::vector<CheckResult>& out) {
  const std::string check = "env." + name;
  if (in.registry == nullptr) return true;
  const config::NcclParam* p = in.registry->Lookup(name);
  if (p == nullptr) {
    const std::string hint = in.registry->DidYouMean(name);
    Add(out, check, CheckStatus::kWarn,
        absl::StrCat(name, "=", value, " is unknown to NCCL's parameter registry",
                     hint.empty() ? "" : absl::StrCat(" (did you mean ", hint, "?)")),
        hint.empty() ? "remove it, or check the spelling against the NCCL docs"
                     : absl::StrCat("rename it to ", hint));
    return false;
  }
  switch (p->status) {
    case config::ParamStatus::kNeverRead:
      Add(out, check, CheckStatus::kFail,
          absl::StrCat(name, " is dead: ", p->note.empty() ? "read by no NCCL version" : p->note),
          p->suggest.empty() ? "remove it" : absl::StrCat("use ", p->suggest, " instead"));
      return false;
    case config::ParamStatus::kDeprecated:
      Add(out, check, CheckStatus::kWarn,
          absl::StrCat(name, " is deprecated since NCCL ", p->since, " (", p->note, ")"),
          absl::StrCat("use ", p->alias_of, " instead"));
      break;
    case config::ParamStatus::kPluginOnly:
      Add(out, check, CheckStatus::kWarn,
          absl::StrCat(name, " is read only by ", p->plugin, ", not by NCCL: ", p->note),
          "keep it only if that plugin is installed");
      break;
    case config::ParamStatus::kMetadata:  // set by container images; NCCL ignores it
      return true;
    case config::ParamStatus::kCurrent:
      break;
  }
  const config::NcclParam* target = in.registry->Canonical(name);
  if (auto norm = in.registry->Normalize(target != nullptr ? *target : *p, value); !norm.ok()) {
    Add(out, check, CheckStatus::kFail,
        absl::StrCat(name, "=", value, ": ", std::string(norm.status().message())),
        "set a value within the documented range");
    return false;
  }
  if (name == "NCCL_SOCKET_IFNAME") {
    std::string why;
    if (!NcclIfnameMatches(value, in.interfaces, why)) {
      Add(out, check, CheckStatus::kFail, absl::StrCat("NCCL_SOCKET_IFNAME=", value, " ", why),
          absl::StrCat("set it to an interface that is up on this host (",
                       UpInterfaces(in.interfaces), ") or unset it"));
      return false;
    }
  }
  return p->status == config::ParamStatus::kCurrent;
}

// One GLOO_ or ADAPTCOMM_ variable: a name adaptcomm or Gloo reads, and Gloo's interfaces up;
// whether it is clean.
bool LintOtherVariable(const std::string& name, const std::string& value, const EnvLintInput& in,
                       std::vector<CheckResult>& out) {
  const std::string check = "env." + name;
  if (KnownNonNcclNames().count(name) == 0) {
    std::vector<std::string> known(KnownNonNcclNames().begin(), KnownNonNcclNames().end());
    const std::string hint = config::ClosestName(name, known);
    Add(out, check, CheckStatus::kWarn,
        absl::StrCat(name, " is read by neither adaptcomm nor Gloo",
                     hint.empty() ? "" : absl::StrCat(" (did you mean ", hint, "?)")),
        hint.empty() ? "remove it" : absl::StrCat("rename it to ", hint));
    return false;
  }
  if (name == "GLOO_SOCKET_IFNAME") {
    // Gloo takes exact names, comma separated (PyTorch splits the list across devices).
    std::vector<std::string> bad;
    for (absl::string_view n : absl::StrSplit(value, ',', absl::SkipEmpty())) {
      const Interface* i = FindInterface(in.interfaces, std::string(n));
      if (i == nullptr) {
        bad.push_back(absl::StrCat(std::string(n), " does not exist"));
      } else if (!i->up) {
        bad.push_back(absl::StrCat(std::string(n), " is down"));
      }
    }
    if (!bad.empty()) {
      Add(out, check, CheckStatus::kFail,
          absl::StrCat("GLOO_SOCKET_IFNAME=", value, ": ", absl::StrJoin(bad, "; ")),
          absl::StrCat("set it to an interface that is up on this host (",
                       UpInterfaces(in.interfaces), ") or unset it"));
      return false;
    }
  }
  return true;
}

// Multi-host jobs: the hostname must resolve, and not first to loopback.
void LintHostname(const EnvLintInput& in, std::vector<CheckResult>& out) {
  if (in.hostname_addresses.empty()) {
    Add(out, "env.hostname", CheckStatus::kFail,
        absl::StrCat("hostname '", in.hostname, "' does not resolve"),
        "add it to DNS or /etc/hosts with the address of the cluster interface");
  } else if (IsLoopbackAddress(in.hostname_addresses.front())) {
    // Gloo and c10d take the first address: Debian's "127.0.1.1 host" line makes it loopback.
    Add(out, "env.hostname", CheckStatus::kFail,
        absl::StrCat("hostname '", in.hostname, "' resolves first to loopback (",
                     absl::StrJoin(in.hostname_addresses, ", "),
                     ") in a multi-host job: peers would be told to connect to themselves"),
        "map the hostname to the cluster address in /etc/hosts, or set MASTER_ADDR, "
        "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME explicitly");
  } else {
    Add(out, "env.hostname", CheckStatus::kPass,
        absl::StrCat("hostname '", in.hostname, "' -> ",
                     absl::StrJoin(in.hostname_addresses, ", ")));
  }
}

}  // namespace

std::vector<CheckResult> LintEnvironment(const EnvLintInput& in) {
  std::vector<CheckResult> out;
  std::map<std::string, std::string> vars;
  for (const std::string& kv : in.environment) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string name = kv.substr(0, eq);
    if (absl::StartsWith(name, "NCCL_") || absl::StartsWith(name, "GLOO_") ||
        absl::StartsWith(name, "ADAPTCOMM_")) {
      vars[name] = kv.substr(eq + 1);
    }
  }
  size_t clean = 0;
  for (const auto& [name, value] : vars) {
    const bool ok = absl::StartsWith(name, "NCCL_") ? LintNcclVariable(name, value, in, out)
                                                    : LintOtherVariable(name, value, in, out);
    if (ok) ++clean;
  }
  Add(out, "env.summary", CheckStatus::kPass,
      absl::StrCat(
          vars.size(), " NCCL_/GLOO_/ADAPTCOMM_ variable(s) set, ", clean, " clean",
          in.registry == nullptr ? " (NCCL registry unavailable: names not checked)" : ""));
  if (in.multi_host) LintHostname(in, out);
  return out;
}

}  // namespace adaptcomm::diag

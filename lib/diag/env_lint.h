// Lints the NCCL_* / GLOO_* / ADAPTCOMM_* environment of a job before it starts: names no
// component reads (with did-you-mean), deprecated or dead NCCL names, out-of-range values,
// socket interface names that match no interface that is up, and a hostname that resolves to
// loopback in a multi-host job.
#ifndef ADAPTCOMM_LIB_DIAG_ENV_LINT_H_
#define ADAPTCOMM_LIB_DIAG_ENV_LINT_H_

#include <string>
#include <vector>

#include "adaptcomm/diagnose.h"
#include "lib/config/nccl_registry.h"

namespace adaptcomm::diag {

struct Interface {
  std::string name;
  bool up = false;
  bool loopback = false;
};
// This host's interfaces (getifaddrs), one entry per name.
std::vector<Interface> ListInterfaces();

struct EnvLintInput {
  std::vector<std::string> environment;            // "NAME=value"
  const config::NcclRegistry* registry = nullptr;  // null: NCCL names checked only for syntax
  std::vector<Interface> interfaces;
  bool multi_host = false;
  std::vector<std::string> hostname_addresses;  // what the hostname resolves to (IPv4/IPv6 text)
  std::string hostname;
};

std::vector<CheckResult> LintEnvironment(const EnvLintInput& input);

// Does an NCCL_SOCKET_IFNAME value ("eth", "=eth0", "^docker,lo", "ib0,eth1") select at least
// one interface that is up? Sets `why` when it does not.
bool NcclIfnameMatches(const std::string& value, const std::vector<Interface>& interfaces,
                       std::string& why);

// Addresses `host` resolves to (getaddrinfo), as text.
std::vector<std::string> ResolveHost(const std::string& host);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_ENV_LINT_H_

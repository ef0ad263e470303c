#include "lib/hier/host_identity.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "lib/base/store_allgather.h"

namespace adaptcomm {
namespace {

std::string FirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "?";
  line = std::string(absl::StripAsciiWhitespace(line));
  return line.empty() ? "?" : line;
}

}  // namespace

std::string LocalHostIdentity() {
  char host[HOST_NAME_MAX + 1] = {};
  const std::string hostname = gethostname(host, sizeof(host) - 1) == 0 ? host : "?";
  char net[128] = {};
  const ssize_t n = readlink("/proc/self/ns/net", net, sizeof(net) - 1);
  const std::string netns = n > 0 ? std::string(net, static_cast<size_t>(n)) : "?";
  return absl::StrCat(FirstLine("/proc/sys/kernel/random/boot_id"), "/", hostname, "/", netns);
}

HostAssignment AssignHosts(const std::vector<std::string>& identities, int rank) {
  HostAssignment a;
  a.host_of.resize(identities.size());
  std::map<std::string, int> index;
  std::vector<int> count;
  for (size_t g = 0; g < identities.size(); ++g) {
    auto [it, fresh] = index.emplace(identities[g], static_cast<int>(count.size()));
    if (fresh) count.push_back(0);
    a.host_of[g] = it->second;
    if (static_cast<int>(g) == rank) a.local_rank = count[static_cast<size_t>(it->second)];
    ++count[static_cast<size_t>(it->second)];
  }
  a.hosts = static_cast<int>(count.size());
  if (rank >= 0 && static_cast<size_t>(rank) < identities.size()) {
    a.local_size = count[static_cast<size_t>(a.host_of[static_cast<size_t>(rank)])];
  }
  a.max_local = count.empty() ? 0 : *std::max_element(count.begin(), count.end());
  return a;
}

absl::StatusOr<std::vector<std::string>> ExchangeHostIdentities(Store& store, int rank,
                                                                int world_size,
                                                                const std::string& mine,
                                                                absl::Time deadline) {
  absl::StatusOr<internal::StoreGathered> gathered =
      internal::AllGatherThroughStore(store, "host/", rank, world_size, mine, deadline);
  if (!gathered.ok()) return gathered.status();
  if (!gathered->complete) {
    return absl::DeadlineExceededError(absl::StrCat(
        "host identities: not every rank published its host: ", gathered->DescribeMissing(), " of ",
        world_size, " did not"));
  }
  std::vector<std::string> ids;
  for (std::optional<std::string>& id : gathered->values) ids.push_back(*std::move(id));
  return ids;
}

}  // namespace adaptcomm

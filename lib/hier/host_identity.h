// Which ranks share a host, agreed through the store.
//
// A host is what the kernel and the network stack make one: the boot id (/proc/sys/kernel/
// random/boot_id), the hostname and the network namespace (the inode of /proc/self/ns/net). Ranks
// in different network namespaces of one machine are different hosts: they cannot share loopback
// addresses, and the resilience tests model hosts that way.
//
// Store keys (under the store given): "host/<rank>", gathered at O(1) requests per rank
// (lib/base/store_allgather.h).
#ifndef ADAPTCOMM_LIB_HIER_HOST_IDENTITY_H_
#define ADAPTCOMM_LIB_HIER_HOST_IDENTITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"

namespace adaptcomm {

// "<boot id>/<hostname>/net:[<inode>]"; a part that cannot be read is "?" (then only the others
// tell hosts apart).
std::string LocalHostIdentity();

struct HostAssignment {
  std::vector<int> host_of;  // per global rank; hosts numbered in order of their first rank
  int hosts = 0;
  int local_rank = 0;  // of `rank`: its index among its host's ranks, ascending global rank
  int local_size = 0;  // ranks on `rank`'s host
  int max_local = 0;   // ranks on the most crowded host
};
HostAssignment AssignHosts(const std::vector<std::string>& identities, int rank);

// Publishes `mine` as this rank's identity and reads every rank's, bounded by `deadline`.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ExchangeHostIdentities(
    Store& store, int rank, int world_size, const std::string& mine, absl::Time deadline);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_HIER_HOST_IDENTITY_H_

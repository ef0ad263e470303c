// Rendezvous of a communicator's ranks: the store (served by rank 0 unless the caller gave one or
// another process serves it: ADAPTCOMM_STORE_EXTERNAL=1), a claim on the communicator's name, and
// the wait until every rank has joined.
#ifndef ADAPTCOMM_LIB_CORE_SELECTION_RENDEZVOUS_H_
#define ADAPTCOMM_LIB_CORE_SELECTION_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/store.h"

namespace adaptcomm::internal {

// Who serves the job's store. Only with kRankZero does the loss of rank 0 end the job: with
// kExternal (`adaptcomm launch --elastic` serves it in the launcher process) rank 0 is a client
// like every other rank, and an elastic job goes on without it.
// kUrl: a Redis or etcd server (CommunicatorOptions::store_url), apart from the ranks too.
enum class StoreServer { kRankZero, kExternal, kCaller, kUrl };

// The server the options ask for: kCaller with CommunicatorOptions::store, kUrl with store_url
// (REQUIRES: resolved with the profile, as creation does), kExternal with
// ADAPTCOMM_STORE_EXTERNAL=1, else kRankZero. InvalidArgument naming the variable for a value
// other than 0 or 1.
[[nodiscard]] absl::StatusOr<StoreServer> ResolveStoreServer(const CommunicatorOptions& options);
// "rank 0", "the process that started the ranks (ADAPTCOMM_STORE_EXTERNAL=1)", "the caller".
std::string StoreServerName(StoreServer server);

// Where a job's keys live on a Redis or etcd server (CommunicatorOptions::store_url): under its
// token, "adaptcomm/job/<token>" ("default" without one), so that jobs sharing a server never
// see each other's keys. For tools that read a running job's store (`adaptcomm status`).
std::string ExternalStorePrefix(const std::string& token);

struct Rendezvous {
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only, when adaptcomm serves the store
  StoreServer store_server = StoreServer::kCaller;
  std::shared_ptr<Store> root_store;  // the job's store
  std::shared_ptr<Store> store;       // scoped to this communicator's name
  std::string transport_host;         // address Gloo binds to (when no interface is named)
  std::string transport_iface;        // interface Gloo binds to, if named
  std::string description;            // for the creation log line
  std::string job_id;                 // the same on every rank of this communicator
};

// REQUIRES: options.rank and options.world_size resolved and valid; options.store_url and
// init_timeout the effective ones (communicator creation sets them from its EffectiveConfig).
// `store_connect`: how long a client keeps trying to reach the store (profile
// timeouts.store_connect), within the overall `deadline`.
// `replacement` (elastic grow, ElasticOptions::join): joins the running communicator of this name
// instead (its current incarnation on the store), without claiming a rank or waiting for the
// others; NotFound when none is running there. REQUIRES: options.rank != 0 then, unless rank 0
// does not serve the store (ResolveStoreServer is not kRankZero).
absl::StatusOr<Rendezvous> JoinRendezvous(const CommunicatorOptions& options,
                                          absl::Duration store_connect, absl::Time deadline,
                                          bool replacement = false);

// Gives the name back and, on rank 0, keeps serving the store until every rank has left (bounded),
// so that peers still finishing their own departure do not lose the store under them.
// `healthy`: whether the communicator ended healthy; a broken one waits only briefly, since a
// dead peer will never leave. Returns within `bound` whatever the store does: the departure runs
// on a thread of its own, which is left to finish alone (owning the rendezvous, rank 0's store
// server included) when a store that does not answer holds it longer.
void LeaveRendezvous(Rendezvous rendezvous, const CommunicatorOptions& options, bool healthy,
                     absl::Duration bound);

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_SELECTION_RENDEZVOUS_H_

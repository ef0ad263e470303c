// The Gloo backend: every collective and send/recv on host memory over Gloo's TCP transport.
//
// Uses only Gloo's options API (allreduce.h, broadcast.h, ... and unbound buffers); the old
// algorithm classes set SO_SNDBUF on the pairs and slow new-API traffic on the same context by
// orders of magnitude, so they must never be used on a context this backend owns.
// reduce_scatter (which Gloo lacks) is a ring over unbound buffers; bf16 and f16 are reduced by
// our own kernels (gloo_reduce.h); avg is sum then divide.
#ifndef ADAPTCOMM_LIB_GLOO_GLOO_BACKEND_H_
#define ADAPTCOMM_LIB_GLOO_GLOO_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/ext/backend.h"
#include "adaptcomm/store.h"
#include "lib/config/size_bands.h"

namespace adaptcomm {

struct GlooBackendOptions {
  int rank = 0;
  int size = 1;
  // Rendezvous store, already prefixed per communicator and generation (keys are reused by
  // every rank of this backend instance only).
  std::shared_ptr<Store> store;
  // Where to listen: the interface `iface` if set, else the address `hostname` (e.g.
  // "127.0.0.1"). One of them must be set: Gloo's empty default resolves the host name and can
  // pick an interface the peers cannot reach.
  std::string iface;
  std::string hostname;
  // Bound of connecting the ring neighbours at creation. Pairs made later, when an op first
  // needs them, are bounded by that op's timeout.
  absl::Duration init_timeout = absl::Seconds(300);
  // The most pairs (TCP connections, one socket each) this rank opens. The ring ops need 2,
  // broadcast and barrier O(log2 size), send/recv one per peer, alltoall size - 1; an op that
  // would go past it fails with ResourceExhausted before any traffic (bcube falls back to ring
  // and reduce to a ring allreduce instead). Profile: gloo.max_connections.
  int max_connections = 1024;
  // Context default; every op passes its own OpDesc::timeout anyway.
  absl::Duration default_timeout = absl::Seconds(600);
  // Allreduce algorithm ("ring", "bcube", "recursive_doubling", or "auto": where ring's steps
  // would be latency-bound, config::GlooAutoIsLatencyBound, bcube if its groups are narrow, else
  // recursive doubling) and segment size (0: Gloo's default), from the profile's gloo block.
  std::string algorithm = "auto";
  size_t max_segment_bytes = 0;
  // Per message-size band values of the two above for allreduce, from a tuned table
  // (lib/config/tuned_table.h, `adaptcomm tune`): algorithm 0 ring, 1 bcube, 2 recursive doubling
  // (the order of the knob's choices in TunedKnobs()); a size no band holds uses the static value.
  // Looked up once per op.
  config::SizeBands tuned_algorithm;
  config::SizeBands tuned_max_segment_bytes;
};

// The Gloo this library was built with, "0.5.0" (the tuned table's fingerprint names it).
std::string GlooVersion();

// Connects this rank to its ring neighbours; every other pair is connected when an op first
// needs it (lib/gloo/gloo_pairs.h, docs/scale.md). Errors: InvalidArgument (bad options),
// DeadlineExceeded (a neighbour's address or connection did not come within init_timeout; names
// the neighbour), Unavailable (anything else, e.g. the interface cannot be bound or the store
// failed).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(
    const GlooBackendOptions& options);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_GLOO_GLOO_BACKEND_H_

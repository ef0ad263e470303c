// The hierarchical backend: a composite of two backends for jobs whose ranks share hosts.
//
// Inside each host an intra-host backend connects that host's ranks (local ranks 0..L-1, in
// ascending global rank); between hosts an inter-host backend connects one leader per host (local
// rank 0; its rank there is its host index). Only the Backend interface of the two is used, so any
// intra-host transport (Gloo today, shared memory later) composes with any inter-host one.
//
// Collectives (c = elements per rank, N ranks on H hosts, at most Lmax ranks per host):
//   allreduce       intra reduce to the leader -> leaders allreduce -> intra broadcast
//   broadcast       intra broadcast on the root's host -> leaders broadcast -> intra broadcast
//   reduce          intra reduce -> leaders reduce to the root's leader -> leader to root
//   allgather       gather to the leader -> leaders allgather (host blocks padded to Lmax) ->
//                   reorder into global rank order -> intra broadcast
//   reduce_scatter  host-major reorder -> intra reduce -> leaders reduce_scatter -> scatter
//   alltoall        gather to the leader -> leaders alltoall -> scatter
//   barrier         intra, leaders, intra
//   send/recv       within a host on the intra backend, between two leaders on the inter one;
//                   any other cross-host pair on a two-rank link of its own, made by
//                   HierBackendOptions::pair_transport the first time the pair talks (only the
//                   two ranks of a send run, so no leader could relay); refused without it
//   groups          (GroupRunner) collectives in issue order, then the sends and receives, per
//                   level as one inner group: intra, inter, then each pair link in the order of
//                   its two global ranks, an order every rank shares, so no two ranks wait on
//                   each other
// The leader-to-local moves use the intra backend's send/recv, or a broadcast/allgather when it
// has none. avg is summed at every level and divided once by N at the end. On a single host every
// op goes straight to the intra backend.
//
// Inner ops get consecutive sequence numbers of their own per inner backend; each gets what is left
// of the outer op's timeout. Inner errors keep their code and are re-worded to name the outer op,
// its seq, the level and the step ("allreduce #7: between hosts (leader of host 1, global rank 2),
// allreduce among leaders: <inner>"); an inner refusal of a collective that Supports() accepted
// is Internal. Any failure breaks this backend and aborts both inner ones, so the peers waiting on
// this rank fail promptly instead of waiting for their own timeouts (a rank waiting on someone
// else still waits for its bound). Abort() aborts both inner backends; the op in flight returns
// Aborted with the reason and the step it interrupted. Host memory only (staging is on the CPU).
// Internal point-to-point steps use the tags from kHierInternalTagBase up; user send/recv tags
// there are refused.
#ifndef ADAPTCOMM_LIB_HIER_HIER_BACKEND_H_
#define ADAPTCOMM_LIB_HIER_HIER_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "adaptcomm/ext/backend.h"

namespace adaptcomm {

inline constexpr uint32_t kHierInternalTagBase = 0xffff0000u;

struct HierTopology {
  int rank = 0;  // global
  int world_size = 1;
  // Host index of every global rank: dense, 0..H-1 each used at least once.
  std::vector<int> host_of;
  // Index of `rank` among its host's ranks in ascending global order (checked against host_of).
  int local_rank = 0;
};

// Builds a two-rank backend linking this rank and global rank `peer` on another host (rank 0 of it:
// the smaller global rank), within `bound`; both ranks call it for the same pair.
using PairTransport =
    std::function<absl::StatusOr<std::unique_ptr<Backend>>(int peer, absl::Duration bound)>;

struct HierBackendOptions {
  HierTopology topology;
  // All ranks of this host: size L, rank = local rank.
  std::unique_ptr<Backend> intra;
  // Leaders only (local rank 0), when there are several hosts: size H, rank = host index. Null on
  // every other rank (and may be null on a single host).
  std::unique_ptr<Backend> inter;
  // Cross-host send/recv of a rank that is not its host's leader (or to one that is not); empty:
  // such pairs are refused.
  PairTransport pair_transport;
};

// Errors: InvalidArgument when the topology is inconsistent or the inner backends do not match it
// (sizes, ranks, an inter backend on a non-leader or none on a leader).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateHierarchicalBackend(
    HierBackendOptions options);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_HIER_HIER_BACKEND_H_

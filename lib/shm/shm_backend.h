// The shm backend: every collective and send/recv among ranks of one host through one shared
// memory segment (shm_segment.h), host memory only.
//
// Algorithms: an allreduce/reduce of at most flat_max_bytes is a flat exchange (each rank copies
// its input into its slot, every rank reduces all slots, in rank order, into its output). Larger
// ones run reduce-scatter + allgather per chunk: each rank reduces its slice straight out of the
// peers' slots, then copies every reduced slice out. Slots have two halves used by alternate steps,
// so a rank fills chunk k+1 while its peers still read chunk k. Broadcast, allgather,
// reduce_scatter and alltoall stage through the slots the same way; send/recv go through a
// per-pair channel (eager up to half of it, pipelined in chunks beyond; sends and receives between
// a pair are matched in order, and a tag mismatch is an error).
//
// Waiting: per-rank counters in the segment; a waiter spins for `spin`, then sleeps in FUTEX_WAIT
// (woken by the writer only when someone sleeps), waking every `liveness_interval` to check the
// peer it waits for in /proc: a peer that exited fails the op with Unavailable at once, a stopped
// one (SIGSTOP) is named in the DeadlineExceeded at op.timeout. A rank that fails an op (or is
// aborted) marks the whole group broken in the segment and wakes every waiter, so its peers fail
// within milliseconds with its reason instead of waiting out their timeout.
#ifndef ADAPTCOMM_LIB_SHM_SHM_BACKEND_H_
#define ADAPTCOMM_LIB_SHM_SHM_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/ext/backend.h"
#include "adaptcomm/store.h"
#include "lib/config/size_bands.h"

namespace adaptcomm {

struct ShmBackendOptions {
  int rank = 0;
  int size = 1;
  // Rendezvous store, already prefixed per communicator and generation.
  std::shared_ptr<Store> store;
  absl::Duration init_timeout = absl::Seconds(300);
  // Per rank slot (two halves; one half is the largest chunk a step moves).
  size_t slot_bytes = size_t{8} << 20;
  // Per ordered send/recv pair (two halves); 0: 16 MiB / size^2, clamped to [64 KiB, 1 MiB].
  size_t p2p_bytes = 0;
  // A segment larger than this is refused at creation (ResourceExhausted naming both).
  size_t max_segment_bytes = size_t{1} << 30;
  // Allreduce/reduce of at most this many bytes: flat exchange; above: reduce-scatter/allgather.
  size_t flat_max_bytes = size_t{64} << 10;
  // Pipeline chunk of the large paths; 0 or more than half a slot: half a slot. 512 KiB beat 1 MiB
  // at 4 MiB on 2 and 4 ranks in interleaved A/B runs of bench/shm_bench, and matched or beat it
  // from 1 to 64 MiB (a step's working set stays within a core's L2).
  size_t chunk_bytes = size_t{512} << 10;
  // Per message-size band values of the two above, from a tuned table (lib/config/tuned_table.h,
  // written by `adaptcomm tune`): an allreduce or reduce whose size a band holds uses the band's
  // value, any other size the static one. Looked up once per op.
  struct TunedBands {
    config::SizeBands flat_max_bytes;
    config::SizeBands chunk_bytes;
  };
  TunedBands tuned_allreduce;
  TunedBands tuned_reduce;
  absl::Duration spin = absl::Microseconds(20);
  absl::Duration liveness_interval = absl::Milliseconds(50);
  // Tests: pretend this rank was built with another segment layout version (0: the real one).
  uint32_t layout_version_for_testing = 0;
};

// Creates the segment with every other rank (bounded by init_timeout). Errors: InvalidArgument
// (bad options), ResourceExhausted (segment past max_segment_bytes or out of memory; names the
// size and the limit), FailedPrecondition (a rank with another layout version), DeadlineExceeded
// (a rank never joined), Unavailable (anything else). Every rank fails alike.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateShmBackend(
    const ShmBackendOptions& options);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_SHM_SHM_BACKEND_H_

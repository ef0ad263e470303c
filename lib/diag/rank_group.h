// The ranks a diagnostic tool runs on: either N ranks as threads of this process, meeting over a
// TCP store on loopback (no launcher needed), or this process as one rank of a job started by
// `adaptcomm launch` / torchrun / mpirun / srun (rank, world and store from its environment).
#ifndef ADAPTCOMM_LIB_DIAG_RANK_GROUP_H_
#define ADAPTCOMM_LIB_DIAG_RANK_GROUP_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "adaptcomm/communicator.h"

namespace adaptcomm::diag {

struct RankGroupOptions {
  // > 0: that many ranks as threads of this process. 0: one rank of the launched job.
  // The threads' loopback store requires comm.store_token, else ADAPTCOMM_STORE_TOKEN, else a
  // fresh random token.
  int local_ranks = 0;
  // Every rank's options (backend, timeouts, profile...). With local_ranks, rank, world_size,
  // store and master_addr are filled in per thread; otherwise they stay as given (unset: from the
  // launcher's environment). init_timeout unset: 60 s here, so that creation is always bounded.
  CommunicatorOptions comm;
};

// Creates each rank's communicator and runs body(comm) on it; returns one status per local rank
// (creation failures say so). Threads are all joined before it returns: each one's waits are
// bounded by the communicator's timeouts, so it does not hang when a rank fails.
std::vector<absl::Status> RunRankGroup(const RankGroupOptions& options,
                                       const std::function<absl::Status(Communicator&)>& body);

// The first error of `statuses`, prefixed with its local rank index when there are several.
absl::Status FirstError(const std::vector<absl::Status>& statuses);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_RANK_GROUP_H_

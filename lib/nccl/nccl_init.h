// Creating a rank's NCCL communicator: the device checks, rank 0's unique id shared through the
// store, and a nonblocking ncclCommInitRankConfig polled within the init timeout (and abandoned,
// with ncclCommAbort, when NCCL fails, the timeout passes or a peer gave up).
#ifndef ADAPTCOMM_LIB_NCCL_NCCL_INIT_H_
#define ADAPTCOMM_LIB_NCCL_NCCL_INIT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "lib/cuda/cuda_api.h"
#include "lib/nccl/nccl_api.h"
#include "lib/nccl/nccl_backend.h"

namespace adaptcomm::nccl {

struct InitializedComm {
  NcclComm comm = nullptr;
  int device_count = 0;
  std::string who;             // "NCCL init of rank 1 on cuda:0", for later messages
  NcclBackendOptions options;  // as given, with config.blocking = 0 (what the comm was made with)
};

// REQUIRES: options.store set and 0 <= options.rank < options.size (CreateNcclBackend checks).
// FailedPrecondition without the device, DeadlineExceeded past options.init_timeout, Unavailable
// when options.peers_gave_up reports a peer's failure, else NCCL's own error mapped
// (MapNcclResult).
[[nodiscard]] absl::StatusOr<InitializedComm> InitNcclComm(const std::shared_ptr<NcclApi>& api,
                                                           cuda::CudaApi& cuda,
                                                           const NcclBackendOptions& options);

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_NCCL_INIT_H_

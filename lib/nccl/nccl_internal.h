// Helpers shared by the NCCL and staging backends.
#ifndef ADAPTCOMM_LIB_NCCL_NCCL_INTERNAL_H_
#define ADAPTCOMM_LIB_NCCL_NCCL_INTERNAL_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl::internal {

// One pause of a polling loop: yields for the first iterations (GPU ops of small messages finish
// in microseconds), then sleeps 10 us doubling to 640 us.
void PollPause(int iteration);

// ncclCommAbort(comm) on a helper thread, waited for at most `bound`.
absl::Status AbortBounded(const std::shared_ptr<NcclApi>& api, NcclComm comm, absl::Duration bound);

}  // namespace adaptcomm::nccl::internal

#endif  // ADAPTCOMM_LIB_NCCL_NCCL_INTERNAL_H_

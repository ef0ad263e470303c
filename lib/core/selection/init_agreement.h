// Agreement on the outcome of creating a communicator's backend, so that creation is retried on
// every rank or on none.
//
// Why: backend creation can fail on one rank only (a refused connection, an NCCL init error) while
// the others succeed; a rank that retries alone would rendezvous with nobody. Each rank publishes
// its outcome of attempt a under "init/<a>/<rank>" and all are gathered at O(1) store requests
// per rank (lib/base/store_allgather.h).
#ifndef ADAPTCOMM_LIB_CORE_INIT_AGREEMENT_H_
#define ADAPTCOMM_LIB_CORE_INIT_AGREEMENT_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"

namespace adaptcomm::internal {

// OK when every rank's attempt succeeded. Otherwise one status naming each failed rank and its
// error: Unavailable when every failure's code is in `retryable` (the attempt may be repeated),
// else the first other code (never retried). DeadlineExceeded naming the ranks that did not
// report by `deadline`.
[[nodiscard]] absl::Status AgreeOnInit(Store& store, int rank, int world_size, int attempt,
                                       const absl::Status& mine,
                                       const std::vector<absl::StatusCode>& retryable,
                                       absl::Time deadline);

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_INIT_AGREEMENT_H_

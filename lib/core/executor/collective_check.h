// CollectiveCheck: a debug mode that proves every rank calls the same collective before any byte
// moves (CommunicatorOptions::check_collectives, or ADAPTCOMM_CHECK_COLLECTIVES=1).
//
// Before op #s runs, each rank publishes its op fingerprint (op, dtype, count, reduce op, root)
// under "check/<s>/<rank>" on the communicator's store and reads every rank's. Ranks that differ
// fail op #s on every rank with InvalidArgument naming each rank's call, instead of hanging or
// exchanging mismatched buffers. Cost: one store round trip per collective (hundreds of
// microseconds on a local store), hence a debug mode. Send and recv are not checked (they involve
// two ranks only). Keys of op #s-2 are deleted at op #s: every rank is past it by then.
#ifndef ADAPTCOMM_LIB_CORE_EXECUTOR_COLLECTIVE_CHECK_H_
#define ADAPTCOMM_LIB_CORE_EXECUTOR_COLLECTIVE_CHECK_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "adaptcomm/ext/backend.h"
#include "adaptcomm/store.h"

namespace adaptcomm::internal {

class CollectiveCheck {
 public:
  CollectiveCheck(std::shared_ptr<Store> store, int rank, int world_size, std::string name)
      : store_(std::move(store)), rank_(rank), world_size_(world_size), name_(std::move(name)) {}

  // OK when every rank's op `op.seq` has this fingerprint. Bounded by op.timeout: then
  // DeadlineExceeded naming the ranks that never reached the op.
  [[nodiscard]] absl::Status Check(const OpDesc& op, const std::string& fingerprint);

 private:
  const std::shared_ptr<Store> store_;
  const int rank_;
  const int world_size_;
  const std::string name_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_EXECUTOR_COLLECTIVE_CHECK_H_

// The NCCL backend: every collective and send/recv on device buffers over a nonblocking NCCL
// communicator, through the NcclApi seam and the CUDA runtime's (CudaApi) it is given.
//
// Nonblocking (config.blocking = 0) because only then can a hung init or collective be abandoned:
// every wait polls ncclCommGetAsyncError (and a CUDA event for op completion) against a deadline
// and ends in ncclCommAbort. NCCL has no collective timeout of its own.
// Errors: a timeout -> DeadlineExceeded; ncclSystemError, ncclInternalError, ncclRemoteError,
// ncclUnhandledCudaError -> Unavailable (the communicator is aborted: recreate it to retry);
// ncclInvalidArgument / ncclInvalidUsage -> InvalidArgument with ncclGetLastError()'s text.
#ifndef ADAPTCOMM_LIB_NCCL_NCCL_BACKEND_H_
#define ADAPTCOMM_LIB_NCCL_NCCL_BACKEND_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/ext/backend.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "lib/config/nccl_plan.h"
#include "lib/cuda/cuda_api.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl {

struct NcclBackendOptions {
  int rank = 0;
  int size = 1;
  int device = 0;  // CUDA ordinal of the communicator; every view must be on it
  // Scoped to this communicator: rank 0 publishes the unique id under "nccl/uid".
  std::shared_ptr<Store> store;
  absl::Duration init_timeout = absl::Seconds(120);  // unique id exchange + init
  // ncclConfig_t fields (see TranslateNcclConfig); blocking is always forced to 0.
  NcclCommConfig config;
  absl::Duration abort_timeout = absl::Seconds(5);      // ncclCommAbort may hang: bounded
  absl::Duration shutdown_timeout = absl::Seconds(10);  // ncclCommFinalize on destruction
  // Polled (every 100 ms) while init is in progress: a non-OK status abandons the init at once
  // (aborting the communicator) instead of waiting out init_timeout for peers that will never
  // join, e.g. because one published that its own init failed. Null: never.
  std::function<absl::Status()> peers_gave_up;
  // Elastic shrink (issue #14): a failure or Abort() ends the ops and breaks the backend as
  // always, but leaves the NCCL communicator un-aborted ("parked") so that ShrinkNcclBackend can
  // build the survivors' communicator from it (ncclCommShrink with NCCL_SHRINK_ABORT ends its
  // stuck kernels). ReleaseNcclComm or the destructor aborts a parked communicator (bounded by
  // abort_timeout). Set only where a shrink can follow: elastic, and NCCL has ncclCommShrink.
  bool keep_comm_for_shrink = false;
  // Device timing of stream-ordered ops (lib/nccl/device_timing.h): one op in this many is timed
  // with CUDA events on the device (the same ops on every rank); 0: none. The profile's
  // metrics.device_timing_every.
  int device_timing_every = 0;
};

// Exchanges the unique id, initializes the communicator and waits (polling) for it. Errors:
// FailedPrecondition (no such device), DeadlineExceeded (id or init not done by init_timeout;
// ncclCommAbort was called), the mapped NCCL error otherwise.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(
    std::shared_ptr<NcclApi> api, std::shared_ptr<cuda::CudaApi> cuda,
    const NcclBackendOptions& options);

// Whether `parent` can be shrunk with ncclCommShrink: an NCCL backend whose NCCL has the symbol
// and whose communicator was not aborted (a broken one kept for shrink counts). The reason if not.
absl::Status CanShrinkNccl(const Backend& parent);

// The survivors' backend from `parent`'s communicator, through ncclCommShrink excluding
// `exclude_ranks` (parent numbering): NCCL_SHRINK_ABORT when the parent is broken (its stuck ops
// end), NCCL_SHRINK_DEFAULT otherwise. `options` gives the new rank and size (they must match
// the parent's minus the excluded), device must be the parent's; store is unused. Waits (polling)
// at most options.init_timeout; then the new communicator is aborted. The parent's communicator
// is aborted once the new one is ready (its backend stays broken). Every surviving rank must call
// it with the same list, as ncclCommShrink requires.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> ShrinkNcclBackend(
    Backend& parent, const std::vector<int>& exclude_ranks, const NcclBackendOptions& options);

// A communicator that ncclCommSplit made from an NCCL backend's (SplitNcclComm), waiting to become
// a child communicator's backend (AdoptNcclSplitComm). Destroying it unadopted aborts it (bounded).
// Thread safety: one thread at a time.
class NcclSplitComm {
 public:
  NcclSplitComm(std::shared_ptr<NcclApi> api, std::shared_ptr<cuda::CudaApi> cuda, NcclComm comm,
                int device, int device_count, absl::Duration abort_timeout);
  ~NcclSplitComm();
  NcclSplitComm(const NcclSplitComm&) = delete;
  NcclSplitComm& operator=(const NcclSplitComm&) = delete;

  // Not adopted or released yet.
  bool available() const { return comm_ != nullptr; }
  int device() const { return device_; }
  // Aborts the communicator now (every rank of the child must then build its backend afresh).
  void Release();

 private:
  friend absl::StatusOr<std::unique_ptr<Backend>> AdoptNcclSplitComm(
      NcclSplitComm& split, const NcclBackendOptions& options);
  const std::shared_ptr<NcclApi> api_;
  const std::shared_ptr<cuda::CudaApi> cuda_;
  NcclComm comm_;
  const int device_;
  const int device_count_;
  const absl::Duration abort_timeout_;
};

// Whether `parent` can be split with ncclCommSplit: an NCCL backend, healthy, whose NCCL has the
// symbol. The reason if not.
absl::Status CanSplitNccl(const Backend& parent);

// ncclCommSplit of `parent`'s communicator: a collective over every rank of the parent, each
// calling it once per split, in the same order, with no op of the parent running (the caller
// drains it first). `color` kSplitNoColor takes part and returns null; the others get the
// communicator of the ranks with their color, ranked by `key`, then parent rank. The child's
// ncclConfig_t is the parent's (the same profile). Waits (polling) at most `bound`; then the new
// communicator is aborted (DeadlineExceeded). A failure leaves the parent usable.
[[nodiscard]] absl::StatusOr<std::shared_ptr<NcclSplitComm>> SplitNcclComm(Backend& parent,
                                                                           int color, int key,
                                                                           absl::Duration bound);

// The backend over `split`'s communicator. REQUIRES: split.available(); options.rank and size are
// the child's (the split's ordering), options.device the parent's. `split` is used up either way.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> AdoptNcclSplitComm(
    NcclSplitComm& split, const NcclBackendOptions& options);

// Aborts the NCCL communicator of `backend` if it is parked (keep_comm_for_shrink) or still live
// and the backend is broken, bounded by its abort_timeout: a rebuild that does not shrink frees
// it before a fresh init. No-op for other backends.
void ReleaseNcclComm(Backend& backend);

// The profile's ncclConfig_t values for NCCL `version` (a version code). A field the version lacks
// is left unset with a note ("trafficClass needs NCCL 2.26, loaded 2.21.5: not applied"); blocking
// is forced to 0 (noted if the profile asked otherwise).
NcclCommConfig TranslateNcclConfig(const config::NcclConfigValues& values, int version,
                                   std::vector<std::string>* notes);

// The status for an NCCL result (see the file comment). `what` names the call.
absl::Status MapNcclResult(NcclResult result, const std::string& what, const std::string& detail);

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_NCCL_BACKEND_H_

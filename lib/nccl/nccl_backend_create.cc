// NcclBackend's creation around a ready communicator, its ncclCommShrink, and the public entry
// points that create, shrink and release one (nccl_backend.h).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/log.h"
#include "lib/nccl/nccl_backend_class.h"
#include "lib/nccl/nccl_init.h"
#include "lib/nccl/nccl_translate.h"

namespace adaptcomm::nccl {
// The backend around a ready communicator: its CUDA event, stream and barrier scratch.
absl::StatusOr<std::unique_ptr<Backend>> FinishNcclBackend(std::shared_ptr<NcclApi> api,
                                                           std::shared_ptr<CudaApi> cuda,
                                                           const NcclBackendOptions& o,
                                                           NcclComm comm, int device_count,
                                                           const std::string& who) {
  CudaEvent event = nullptr;
  CudaStream stream = nullptr;
  void* scratch = nullptr;
  int e = cuda->EventCreateDisableTiming(&event);
  if (e == kCudaSuccess) e = cuda->StreamCreateNonBlocking(&stream);
  if (e == kCudaSuccess) e = cuda->Malloc(&scratch, 256);
  if (e != kCudaSuccess) {
    // The constructor takes what exists so that the destructor frees it with the communicator.
    NcclBackend cleanup(api, cuda, o, comm, device_count, event, stream, scratch);
    return absl::ResourceExhaustedError(
        absl::StrCat(who, ": creating its CUDA event/stream/scratch: ", cuda->ErrorString(e)));
  }
  int version = 0;
  (void)api->GetVersion(&version);
  ADAPTCOMM_LOG(kDebug, who, ": NCCL ", NcclVersionString(version), " from ", api->library_path(),
                " ready, ", o.size, " ranks");
  return std::unique_ptr<Backend>(std::make_unique<NcclBackend>(
      std::move(api), std::move(cuda), o, comm, device_count, event, stream, scratch));
}

absl::StatusOr<bool> NcclBackend::BeginCommCall(const std::string& who) {
  absl::MutexLock lock(&mu_);
  if (running_.load() || comm_aborted_) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": the parent communicator is busy or aborted"));
  }
  running_.store(true);  // Abort() meanwhile must not call ncclCommAbort under the call
  return comm_parked_;
}

absl::Status NcclBackend::CanShrink() const {
  if (!api_->has_comm_shrink()) {
    return absl::FailedPreconditionError(
        absl::StrCat(api_->library_path(), " has no ncclCommShrink (NCCL 2.27+ exports it)"));
  }
  absl::MutexLock lock(&mu_);
  if (comm_aborted_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL communicator of rank ", options_.rank, " was already aborted"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> NcclBackend::Shrink(const std::vector<int>& exclude,
                                                             const NcclBackendOptions& options) {
  const std::string who =
      absl::StrCat("ncclCommShrink of rank ", options_.rank, " of ", options_.size, " to rank ",
                   options.rank, " of ", options.size, " on cuda:", options_.device);
  int below = 0;
  for (size_t i = 0; i < exclude.size(); ++i) {
    const int r = exclude[i];
    if (r < 0 || r >= options_.size || r == options_.rank ||
        std::find(exclude.begin(), exclude.begin() + static_cast<long>(i), r) !=
            exclude.begin() + static_cast<long>(i)) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": excluded rank ", r,
                                                     " must be another rank in [0, ", options_.size,
                                                     "), listed once"));
    }
    below += r < options_.rank;
  }
  if (options.size != options_.size - static_cast<int>(exclude.size()) ||
      options.rank != options_.rank - below || options.device != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": excluding ", exclude.size(), " rank(s) makes rank ", options_.rank - below, " of ",
        options_.size - static_cast<int>(exclude.size()), " on cuda:", options_.device));
  }
  if (absl::Status s = CanShrink(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(who, ": ", s.message()));
  }
  absl::StatusOr<bool> parked = BeginCommCall(who);
  if (!parked.ok()) return parked.status();
  const bool broken = *parked || !health().ok();
  ScopedCudaDevice device(*cuda_, options_.device);
  NcclBackendOptions o = options;
  o.config.blocking = 0;
  NcclComm child = nullptr;
  NcclResult r =
      api_->CommShrink(comm_, exclude, &child, &o.config, broken ? kShrinkAbort : kShrinkDefault);
  NcclResult state = r;
  const absl::Time deadline = absl::Now() + o.init_timeout;
  for (int i = 0; child != nullptr && (r == NcclResult::kSuccess || r == NcclResult::kInProgress);
       ++i) {
    NcclResult q = api_->CommGetAsyncError(child, &state);
    if (q != NcclResult::kSuccess) state = q;
    if (state != NcclResult::kInProgress || absl::Now() > deadline) break;
    cuda::PollPause(64 + i);
  }
  if (!InFlight(r)) state = r;
  const std::string detail = api_->GetLastError(child != nullptr ? child : comm_);
  {
    absl::MutexLock lock(&mu_);
    running_.store(false);
  }
  // Kept as its health when it had none to report (an earlier failure or abort stays).
  (void)Break(absl::FailedPreconditionError(
      absl::StrCat("nccl backend of rank ", options_.rank,
                   " was replaced by its shrunk communicator (ncclCommShrink)")));
  // The parent's part is done (its ops ended with NCCL_SHRINK_ABORT, or it is superseded): its
  // resources go now rather than when the communicator ends.
  AbortCommOnce(/*allow_park=*/false);
  if (state != NcclResult::kSuccess) {
    absl::Status failed = state == NcclResult::kInProgress
                              ? absl::DeadlineExceededError(absl::StrCat(
                                    who, " did not finish within ",
                                    absl::FormatDuration(o.init_timeout), "; ncclCommAbort called"))
                              : MapNcclResult(state, who, detail);
    if (child != nullptr) {
      if (absl::Status a = CommAbortBounded(api_, child, o.abort_timeout); !a.ok()) {
        failed = absl::Status(failed.code(), absl::StrCat(failed.message(), "; ", a.message()));
      }
    }
    return failed;
  }
  return FinishNcclBackend(api_, cuda_, o, child, device_count_, who);
}

absl::Status CanShrinkNccl(const Backend& parent) {
  const auto* nccl = dynamic_cast<const NcclBackend*>(&parent);
  if (nccl == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the backend to shrink is ", parent.name(), ", not nccl"));
  }
  return nccl->CanShrink();
}

absl::StatusOr<std::unique_ptr<Backend>> ShrinkNcclBackend(Backend& parent,
                                                           const std::vector<int>& exclude_ranks,
                                                           const NcclBackendOptions& options) {
  auto* nccl = dynamic_cast<NcclBackend*>(&parent);
  if (nccl == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("ncclCommShrink: the backend to shrink is ", parent.name(), ", not nccl"));
  }
  return nccl->Shrink(exclude_ranks, options);
}

void ReleaseNcclComm(Backend& backend) {
  auto* nccl = dynamic_cast<NcclBackend*>(&backend);
  if (nccl != nullptr && !nccl->health().ok()) nccl->ReleaseComm();
}

absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(std::shared_ptr<NcclApi> api,
                                                           std::shared_ptr<cuda::CudaApi> cuda,
                                                           const NcclBackendOptions& options) {
  if (api == nullptr) return absl::InvalidArgumentError("CreateNcclBackend: api is null");
  if (cuda == nullptr) return absl::InvalidArgumentError("CreateNcclBackend: cuda is null");
  if (options.store == nullptr) return absl::InvalidArgumentError("CreateNcclBackend: no store");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateNcclBackend: rank ", options.rank, " of ", options.size));
  }
  absl::StatusOr<InitializedComm> init = InitNcclComm(api, *cuda, options);
  if (!init.ok()) return init.status();
  return FinishNcclBackend(std::move(api), std::move(cuda), init->options, init->comm,
                           init->device_count, init->who);
}

}  // namespace adaptcomm::nccl

// ncclCommSplit: a child communicator made from an NCCL backend's (nccl_backend.h), for
// Communicator::Split. NCCL builds the child from the parent's bootstrap and, where the profile
// sets nccl.split_share, shares the parent's resources; a fresh init would exchange a unique id
// through the store and build everything again.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/log.h"
#include "lib/nccl/nccl_backend_class.h"  // IWYU pragma: associated
#include "lib/nccl/nccl_translate.h"

namespace adaptcomm::nccl {

NcclSplitComm::NcclSplitComm(std::shared_ptr<NcclApi> api, std::shared_ptr<cuda::CudaApi> cuda,
                             NcclComm comm, int device, int device_count,
                             absl::Duration abort_timeout)
    : api_(std::move(api)),
      cuda_(std::move(cuda)),
      comm_(comm),
      device_(device),
      device_count_(device_count),
      abort_timeout_(abort_timeout) {}

NcclSplitComm::~NcclSplitComm() { Release(); }

void NcclSplitComm::Release() {
  if (comm_ == nullptr) return;
  ScopedCudaDevice device(*cuda_, device_);
  if (absl::Status s = CommAbortBounded(api_, comm_, abort_timeout_); !s.ok()) {
    ADAPTCOMM_LOG(kWarning, "an unused ncclCommSplit communicator: ", s.message());
  }
  comm_ = nullptr;
}

absl::Status NcclBackend::CanSplit() const {
  if (!api_->has_comm_split()) {
    return absl::FailedPreconditionError(
        absl::StrCat(api_->library_path(), " has no ncclCommSplit (NCCL 2.18+ exports it)"));
  }
  if (absl::Status h = health(); !h.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the parent's backend is broken: ", h.message()));
  }
  absl::MutexLock lock(&mu_);
  if (comm_aborted_ || comm_parked_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL communicator of rank ", options_.rank, " was aborted"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<NcclSplitComm>> NcclBackend::Split(int color, int key,
                                                                  absl::Duration bound) {
  const std::string who = absl::StrCat("ncclCommSplit of rank ", options_.rank, " of ",
                                       options_.size, " (color ", color, ", key ", key, ")");
  if (absl::Status s = CanSplit(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(who, ": ", s.message()));
  }
  // Abort() meanwhile leaves ncclCommAbort to FinishCall below.
  if (absl::StatusOr<bool> parked = BeginCommCall(who); !parked.ok()) return parked.status();
  ScopedCudaDevice device(*cuda_, options_.device);
  NcclCommConfig config = options_.config;
  config.blocking = 0;
  NcclComm child = nullptr;
  const NcclResult r = api_->CommSplit(comm_, color, key, &child, &config);
  // The child's state, or (kSplitNoColor: no child) the parent's, until the split is done.
  const NcclComm polled = child != nullptr ? child : comm_;
  NcclResult state = r;
  const absl::Time deadline = absl::Now() + bound;
  for (int i = 0; r == NcclResult::kSuccess || r == NcclResult::kInProgress; ++i) {
    NcclResult q = api_->CommGetAsyncError(polled, &state);
    if (q != NcclResult::kSuccess) state = q;
    if (state != NcclResult::kInProgress || absl::Now() > deadline) break;
    cuda::PollPause(64 + i);
  }
  if (!InFlight(r)) state = r;
  const std::string detail = api_->GetLastError(polled);
  (void)FinishCall(absl::OkStatus());  // an Abort() meanwhile aborts comm_ here
  const absl::Status finished = aborted() ? health() : absl::OkStatus();
  if (state != NcclResult::kSuccess || !finished.ok()) {
    if (child != nullptr) (void)CommAbortBounded(api_, child, options_.abort_timeout);
    if (!finished.ok())
      return absl::Status(finished.code(), absl::StrCat(who, ": ", finished.message()));
    if (state == NcclResult::kInProgress) {
      return absl::DeadlineExceededError(absl::StrCat(
          who, " did not finish within ", absl::FormatDuration(bound),
          " (every rank of the parent must split, in the same order); ncclCommAbort called"));
    }
    return MapNcclResult(state, who, detail);
  }
  if (child == nullptr) return std::shared_ptr<NcclSplitComm>();
  return std::make_shared<NcclSplitComm>(api_, cuda_, child, options_.device, device_count_,
                                         options_.abort_timeout);
}

absl::Status CanSplitNccl(const Backend& parent) {
  const auto* nccl = dynamic_cast<const NcclBackend*>(&parent);
  if (nccl == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the backend to split is ", parent.name(), ", not nccl"));
  }
  return nccl->CanSplit();
}

absl::StatusOr<std::shared_ptr<NcclSplitComm>> SplitNcclComm(Backend& parent, int color, int key,
                                                             absl::Duration bound) {
  auto* nccl = dynamic_cast<NcclBackend*>(&parent);
  if (nccl == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("ncclCommSplit: the backend to split is ", parent.name(), ", not nccl"));
  }
  return nccl->Split(color, key, bound);
}

absl::StatusOr<std::unique_ptr<Backend>> AdoptNcclSplitComm(NcclSplitComm& split,
                                                            const NcclBackendOptions& options) {
  const std::string who =
      absl::StrCat("nccl backend of rank ", options.rank, " of ", options.size, " (ncclCommSplit)");
  if (!split.available()) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": the split communicator was used"));
  }
  if (options.device != split.device()) {
    split.Release();
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": asked for cuda:", options.device,
        ", but the split communicator is on cuda:", split.device(), " (the parent's device)"));
  }
  NcclComm comm = split.comm_;
  split.comm_ = nullptr;
  ScopedCudaDevice device(*split.cuda_, options.device);
  return FinishNcclBackend(split.api_, split.cuda_, options, comm, split.device_count_, who);
}

}  // namespace adaptcomm::nccl

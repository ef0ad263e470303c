// Parts of the seam that need neither CUDA nor NCCL: names, version arithmetic and a bounded
// abort.
#include "lib/nccl/nccl_api.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace adaptcomm::nccl {

const char* NcclResultName(NcclResult r) {
  switch (r) {
    case NcclResult::kSuccess:
      return "ncclSuccess";
    case NcclResult::kUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case NcclResult::kSystemError:
      return "ncclSystemError";
    case NcclResult::kInternalError:
      return "ncclInternalError";
    case NcclResult::kInvalidArgument:
      return "ncclInvalidArgument";
    case NcclResult::kInvalidUsage:
      return "ncclInvalidUsage";
    case NcclResult::kRemoteError:
      return "ncclRemoteError";
    case NcclResult::kInProgress:
      return "ncclInProgress";
  }
  return "ncclResult(unknown)";
}

int NormalizeNcclVersion(int code) {
  if (code <= 0) return code;
  // Before 2.9 NCCL_VERSION_CODE was X*1000+Y*100+Z, so it stayed below 10000.
  if (code < 10000) return (code / 1000) * 10000 + ((code % 1000) / 100) * 100 + code % 100;
  return code;
}

std::string NcclVersionString(int code) {
  const int v = NormalizeNcclVersion(code);
  if (v <= 0) return absl::StrCat("unknown (", code, ")");
  return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
}

absl::Status CommAbortBounded(const std::shared_ptr<NcclApi>& api, NcclComm comm,
                              absl::Duration bound) {
  // ncclCommAbort itself can hang (a peer stuck in a kernel): run it on its own thread and stop
  // waiting at the bound. The thread keeps the API alive if it outlives this call.
  auto done = std::make_shared<absl::Notification>();
  auto result = std::make_shared<std::atomic<int>>(0);
  std::thread([api, comm, done, result] {
    result->store(static_cast<int>(api->CommAbort(comm)));
    done->Notify();
  }).detach();
  if (!done->WaitForNotificationWithTimeout(bound)) {
    return absl::DeadlineExceededError(
        absl::StrCat("ncclCommAbort did not return within ", absl::FormatDuration(bound),
                     "; abandoned (its resources leak until the process exits)"));
  }
  const auto r = static_cast<NcclResult>(result->load());
  if (r != NcclResult::kSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclCommAbort: ", NcclResultName(r)));
  }
  return absl::OkStatus();
}

}  // namespace adaptcomm::nccl

#include "lib/nccl/nccl_init.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace adaptcomm::nccl {
namespace {

using cuda::kCudaSuccess;

constexpr char kUidKey[] = "nccl/uid";

}  // namespace

absl::StatusOr<InitializedComm> InitNcclComm(const std::shared_ptr<NcclApi>& api,
                                             cuda::CudaApi& cuda,
                                             const NcclBackendOptions& options) {
  const absl::Time deadline = absl::Now() + options.init_timeout;
  const std::string who =
      absl::StrCat("NCCL init of rank ", options.rank, " on cuda:", options.device);
  int device_count = 0;
  if (int e = cuda.GetDeviceCount(&device_count); e != kCudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": no CUDA device (cudaGetDeviceCount: ", cuda.ErrorString(e), ")"));
  }
  if (options.device < 0 || options.device >= device_count) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": device cuda:", options.device, " does not exist (", device_count, " visible)"));
  }
  if (int e = cuda.SetDevice(options.device); e != kCudaSuccess) {
    return absl::UnavailableError(absl::StrCat(who, ": cudaSetDevice: ", cuda.ErrorString(e)));
  }

  NcclUniqueId uid;
  if (options.rank == 0) {
    if (NcclResult r = api->GetUniqueId(&uid); r != NcclResult::kSuccess) {
      return MapNcclResult(r, absl::StrCat(who, ": ncclGetUniqueId"), api->GetLastError(nullptr));
    }
    if (absl::Status s = options.store->Set(
            kUidKey, absl::BytesToHexString(absl::string_view(uid.internal, sizeof(uid.internal))));
        !s.ok()) {
      return s;
    }
  } else {
    absl::StatusOr<std::string> hex =
        options.store->Get(kUidKey, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!hex.ok()) {
      return absl::Status(
          hex.status().code(),
          absl::StrCat(who, ": waiting for rank 0's NCCL unique id: ", hex.status().message()));
    }
    const std::string bytes = absl::HexStringToBytes(*hex);
    if (bytes.size() != sizeof(uid.internal)) {
      return absl::DataLossError(absl::StrCat(who, ": NCCL unique id in the store has ",
                                              bytes.size(), " bytes, expected 128"));
    }
    std::copy(bytes.begin(), bytes.end(), uid.internal);
  }

  NcclBackendOptions o = options;
  o.config.blocking = 0;
  NcclComm comm = nullptr;
  NcclResult r = api->CommInitRankConfig(&comm, o.size, uid, o.rank, o.config);
  NcclResult state = r;
  absl::Status gave_up;
  absl::Time next_peer_check = absl::Now() + absl::Milliseconds(100);
  for (int i = 0; r == NcclResult::kSuccess || r == NcclResult::kInProgress; ++i) {
    NcclResult q = api->CommGetAsyncError(comm, &state);
    if (q != NcclResult::kSuccess) state = q;
    if (state != NcclResult::kInProgress) break;
    const absl::Time now = absl::Now();
    if (now > deadline) break;
    if (o.peers_gave_up && now >= next_peer_check) {
      next_peer_check = now + absl::Milliseconds(100);
      gave_up = o.peers_gave_up();
      if (!gave_up.ok()) break;
    }
    cuda::PollPause(64 + i);
  }
  if (r != NcclResult::kSuccess && r != NcclResult::kInProgress) state = r;
  if (state != NcclResult::kSuccess) {
    absl::Status failed =
        state != NcclResult::kInProgress ? MapNcclResult(state, who, api->GetLastError(comm))
        : !gave_up.ok()
            ? absl::UnavailableError(
                  absl::StrCat(who, " abandoned (", gave_up.message(), "); ncclCommAbort called"))
            : absl::DeadlineExceededError(absl::StrCat(
                  who, " did not finish within ",
                  absl::FormatDuration(absl::Trunc(options.init_timeout, absl::Milliseconds(1))),
                  "; ncclCommAbort called"));
    if (comm != nullptr) {
      if (absl::Status a = CommAbortBounded(api, comm, o.abort_timeout); !a.ok()) {
        failed = absl::Status(failed.code(), absl::StrCat(failed.message(), "; ", a.message()));
      }
    }
    return failed;
  }

  return InitializedComm{comm, device_count, who, o};
}

}  // namespace adaptcomm::nccl

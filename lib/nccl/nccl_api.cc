// Parts of the seam that need neither CUDA nor NCCL: names and version arithmetic.
#include "lib/nccl/nccl_api.h"

#include "absl/strings/str_cat.h"

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

}  // namespace adaptcomm::nccl

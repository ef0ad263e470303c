// What the NCCL backend tells NCCL (our dtypes and reduce ops in NCCL's words, the profile's
// ncclConfig_t fields gated by the loaded version) and how it reads NCCL's answers (ncclResult_t as
// a status): no communicator involved.
#include "lib/nccl/nccl_translate.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/nccl/nccl_backend.h"

namespace adaptcomm::nccl {

NcclDataType ToNccl(DType t) {
  switch (t) {
    case DType::kF32:
      return NcclDataType::kFloat32;
    case DType::kF64:
      return NcclDataType::kFloat64;
    case DType::kF16:
      return NcclDataType::kFloat16;
    case DType::kBF16:
      return NcclDataType::kBfloat16;
    case DType::kI8:
      return NcclDataType::kInt8;
    case DType::kU8:
      return NcclDataType::kUint8;
    case DType::kI32:
      return NcclDataType::kInt32;
    case DType::kI64:
      return NcclDataType::kInt64;
  }
  return NcclDataType::kUint8;
}

NcclRedOp ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return NcclRedOp::kSum;
    case ReduceOp::kProd:
      return NcclRedOp::kProd;
    case ReduceOp::kMin:
      return NcclRedOp::kMin;
    case ReduceOp::kMax:
      return NcclRedOp::kMax;
    case ReduceOp::kAvg:
      return NcclRedOp::kAvg;
  }
  return NcclRedOp::kSum;
}

absl::Status MapNcclResult(NcclResult result, const std::string& what, const std::string& detail) {
  const std::string text =
      absl::StrCat(what, ": ", NcclResultName(result), detail.empty() ? "" : ": ", detail);
  switch (result) {
    case NcclResult::kSuccess:
    case NcclResult::kInProgress:
      return absl::OkStatus();
    case NcclResult::kInvalidArgument:
    case NcclResult::kInvalidUsage:
      return absl::InvalidArgumentError(text);
    case NcclResult::kUnhandledCudaError:
    case NcclResult::kSystemError:
    case NcclResult::kInternalError:
    case NcclResult::kRemoteError:
      return absl::UnavailableError(absl::StrCat(
          text, " (the NCCL communicator is aborted; recreate the communicator to retry)"));
  }
  return absl::UnknownError(text);
}

NcclCommConfig TranslateNcclConfig(const config::NcclConfigValues& v, int version,
                                   std::vector<std::string>* notes) {
  NcclCommConfig c;
  const int loaded = NormalizeNcclVersion(version);
  auto gate = [&](const char* field, int since, auto apply) {
    if (loaded >= since) {
      apply();
    } else if (notes != nullptr) {
      notes->push_back(absl::StrCat("ncclConfig_t.", field, " needs NCCL ",
                                    NcclVersionString(since), ", loaded ",
                                    NcclVersionString(loaded), ": not applied"));
    }
  };
  if (v.blocking.has_value() && *v.blocking != 0 && notes != nullptr) {
    notes->push_back(absl::StrCat("ncclConfig_t.blocking=", *v.blocking,
                                  " ignored: adaptcomm needs a nonblocking communicator to abort "
                                  "it on timeouts"));
  }
  c.blocking = 0;
  if (v.cga_cluster_size)
    gate("cgaClusterSize", 21400, [&] { c.cga_cluster_size = *v.cga_cluster_size; });
  if (v.min_ctas) gate("minCTAs", 21400, [&] { c.min_ctas = *v.min_ctas; });
  if (v.max_ctas) gate("maxCTAs", 21400, [&] { c.max_ctas = *v.max_ctas; });
  if (v.net_name) gate("netName", 21400, [&] { c.net_name = *v.net_name; });
  if (v.split_share) gate("splitShare", 21800, [&] { c.split_share = *v.split_share; });
  if (v.traffic_class) gate("trafficClass", 22600, [&] { c.traffic_class = *v.traffic_class; });
  if (v.comm_name) gate("commName", 22700, [&] { c.comm_name = *v.comm_name; });
  if (v.cta_policy) gate("CTAPolicy", 22700, [&] { c.cta_policy = *v.cta_policy; });
  if (v.nvls_ctas) gate("nvlsCTAs", 22700, [&] { c.nvls_ctas = *v.nvls_ctas; });
  return c;
}

}  // namespace adaptcomm::nccl

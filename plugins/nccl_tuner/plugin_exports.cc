// The symbols NCCL looks up in libadaptcomm-nccl-tuner.so (NCCL_TUNER_PLUGIN=<path>): one
// struct per interface version, newest first in NCCL's search. exports.map keeps every other
// symbol local. Every entry point returns success: NCCL turns a failure into a failed
// communicator or collective (nccl_tuner_abi.h), and a tuning hint is never worth that.
#include <exception>
#include <string>

#include "plugins/nccl_tuner/nccl_tuner_abi.h"
#include "plugins/nccl_tuner/tuner.h"

namespace adaptcomm::nccl_tuner {
namespace {

NcclResult InitCommon(size_t n_ranks, size_t n_nodes, NcclDebugLogger log, void** context) {
  if (context == nullptr) return kNcclSuccess;
  *context = nullptr;
  try {
    *context = TunerContext::Create(n_ranks, n_nodes, log).release();
  } catch (const std::exception& e) {  // std::bad_alloc and friends: stay out of NCCL's way
    Log(log, kNcclLogWarn, std::string("init failed (") + e.what() + "); NCCL decides");
  }
  return kNcclSuccess;
}

NcclResult InitV5(void** context, uint64_t /*comm_id*/, size_t n_ranks, size_t n_nodes,
                  NcclDebugLogger log, NcclNvlDomainInfoV5* /*nvl_domain_info*/,
                  NcclTunerConstantsV5* /*constants*/) {
  return InitCommon(n_ranks, n_nodes, log, context);
}

NcclResult InitV2ToV4(size_t n_ranks, size_t n_nodes, NcclDebugLogger log, void** context) {
  return InitCommon(n_ranks, n_nodes, log, context);
}

NcclResult GetCollInfoV4V5(void* context, NcclFunc coll_type, size_t n_bytes, int /*pipe_ops*/,
                           float** cost_table, int num_algo, int num_proto, int /*reg_buff*/,
                           int* n_channels) {
  if (context == nullptr) return kNcclSuccess;
  try {
    // NCCL passes its float[numAlgo][numProto] array cast to float** (nccl_tuner_abi.h).
    static_cast<const TunerContext*>(context)->ApplyToCostTable(
        coll_type, n_bytes, reinterpret_cast<float*>(cost_table), num_algo, num_proto, n_channels);
  } catch (const std::exception&) {  // only a failed log allocation can throw: NCCL decides
  }
  return kNcclSuccess;
}

NcclResult GetCollInfoV3(void* context, NcclFunc coll_type, size_t n_bytes, int pipe_ops,
                         float** cost_table, int num_algo, int num_proto, int* n_channels) {
  return GetCollInfoV4V5(context, coll_type, n_bytes, pipe_ops, cost_table, num_algo, num_proto, 0,
                         n_channels);
}

NcclResult GetCollInfoV2(void* context, NcclFunc coll_type, size_t n_bytes, int coll_net_support,
                         int nvls_support, int /*pipe_ops*/, int* algorithm, int* protocol,
                         int* n_channels) {
  if (context == nullptr) return kNcclSuccess;
  try {
    static_cast<const TunerContext*>(context)->ApplyToChoice(
        coll_type, n_bytes, coll_net_support, nvls_support, algorithm, protocol, n_channels);
  } catch (const std::exception&) {  // only a failed log allocation can throw: NCCL decides
  }
  return kNcclSuccess;
}

NcclResult Finalize(void* context) {
  delete static_cast<TunerContext*>(context);
  return kNcclSuccess;
}

}  // namespace
}  // namespace adaptcomm::nccl_tuner

using adaptcomm::nccl_tuner::kPluginName;
namespace tuner = adaptcomm::nccl_tuner;

// Default visibility: the plugin is compiled with hidden visibility, which a version script
// cannot undo.
#define ADAPTCOMM_TUNER_EXPORT __attribute__((visibility("default")))

extern "C" {
// Declared extern first: a const object defined at namespace scope would otherwise have
// internal linkage, and dlsym() would not find it.
extern ADAPTCOMM_TUNER_EXPORT const tuner::NcclTunerV5 ncclTunerPlugin_v5;
extern ADAPTCOMM_TUNER_EXPORT const tuner::NcclTunerV4 ncclTunerPlugin_v4;
extern ADAPTCOMM_TUNER_EXPORT const tuner::NcclTunerV3 ncclTunerPlugin_v3;
extern ADAPTCOMM_TUNER_EXPORT const tuner::NcclTunerV2 ncclTunerPlugin_v2;

const tuner::NcclTunerV5 ncclTunerPlugin_v5 = {kPluginName, tuner::InitV5, tuner::GetCollInfoV4V5,
                                               tuner::Finalize};
const tuner::NcclTunerV4 ncclTunerPlugin_v4 = {kPluginName, tuner::InitV2ToV4,
                                               tuner::GetCollInfoV4V5, tuner::Finalize};
const tuner::NcclTunerV3 ncclTunerPlugin_v3 = {kPluginName, tuner::InitV2ToV4, tuner::GetCollInfoV3,
                                               tuner::Finalize};
const tuner::NcclTunerV2 ncclTunerPlugin_v2 = {kPluginName, tuner::InitV2ToV4, tuner::GetCollInfoV2,
                                               tuner::Finalize};
}

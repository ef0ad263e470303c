// NCCL's tuner-plugin interface (ext-tuner), declared here because NCCL installs no header for
// it. Layouts follow NCCL 2.28's src/include/plugin/tuner/tuner_v{2,3,4,5}.h and
// nccl_common.h; NCCL 2.28 looks for ncclTunerPlugin_v5, then v4, v3, v2 (src/plugin/tuner.cc).
// These are C structs of function pointers, read by NCCL through dlsym(): the member order and
// the parameter lists are the ABI (tests/nccl_tuner_plugin_test.cc calls them as NCCL does).
//
// Conventions of the interface (from NCCL's tuner_v5.h and enqueue.cc):
// - collCostTable is NCCL's `float table[numAlgo][numProto]` cast to float**: index it as a
//   contiguous row-major array, never as an array of row pointers.
// - An entry of NCCL_ALGO_PROTO_IGNORE (-1.0) is a combination NCCL cannot run here; leave it.
//   NCCL takes the cheapest entry that is not ignored, so setting one entry to 0.0 chooses it.
// - *nChannels starts at 0 ("NCCL decides"); a positive value caps the channels.
// - NCCL wraps init and getCollInfo in NCCLCHECK: a non-success result fails the user's
//   communicator creation or collective, so this plugin always returns ncclSuccess.
#ifndef ADAPTCOMM_PLUGINS_NCCL_TUNER_NCCL_TUNER_ABI_H_
#define ADAPTCOMM_PLUGINS_NCCL_TUNER_NCCL_TUNER_ABI_H_

#include <cstddef>
#include <cstdint>

namespace adaptcomm::nccl_tuner {

// ncclResult_t: an int-sized enum in NCCL; only these two values are ever returned here.
enum NcclResult : int { kNcclSuccess = 0, kNcclInternalError = 3 };

// ncclDebugLogLevel and ncclDebugLogSubSys (nccl_common.h).
enum NcclLogLevel : int {
  kNcclLogNone = 0,
  kNcclLogVersion = 1,
  kNcclLogWarn = 2,
  kNcclLogInfo = 3,
  kNcclLogAbort = 4,
  kNcclLogTrace = 5,
};
inline constexpr unsigned long kNcclSubsysInit = 0x1;
inline constexpr unsigned long kNcclSubsysTuning = 0x40;

// ncclDebugLogger_t: printf-style, with NCCL's own file/line prefix.
using NcclDebugLogger = void (*)(NcclLogLevel level, unsigned long flags, const char* file,
                                 int line, const char* fmt, ...);

// ncclFunc_t (nccl_common.h): the collectives the tuner is asked about come first.
enum NcclFunc : int {
  kNcclFuncBroadcast = 0,
  kNcclFuncReduce = 1,
  kNcclFuncAllGather = 2,
  kNcclFuncReduceScatter = 3,
  kNcclFuncAllReduce = 4,
  kNcclFuncSendRecv = 5,
  kNcclFuncSend = 6,
  kNcclFuncRecv = 7,
};
inline constexpr int kNcclNumTunedFunctions = 5;  // NCCL_NUM_FUNCTIONS

// NCCL_ALGO_* and NCCL_PROTO_* (nccl_tuner.h); lib/config/tuned_table.h uses the same numbers.
inline constexpr int kNcclAlgoTree = 0;
inline constexpr int kNcclAlgoRing = 1;
inline constexpr int kNcclAlgoCollnetDirect = 2;
inline constexpr int kNcclAlgoCollnetChain = 3;
inline constexpr int kNcclAlgoNvls = 4;
inline constexpr int kNcclAlgoNvlsTree = 5;
inline constexpr int kNcclAlgoPat = 6;
inline constexpr int kNcclNumAlgorithms = 7;
inline constexpr int kNcclProtoLl = 0;
inline constexpr int kNcclProtoLl128 = 1;
inline constexpr int kNcclProtoSimple = 2;
inline constexpr int kNcclNumProtocols = 3;
inline constexpr float kNcclAlgoProtoIgnore = -1.0f;

// v5 (NCCL 2.28): init also gets the communicator id, the NVLink domains and NCCL's tuning
// constants (which a plugin may edit; this one leaves them alone).
struct NcclNvlDomainInfoV5 {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
};
inline constexpr int kNcclNumHwLinksV5 = 3;
inline constexpr int kNcclNumCompCapsV5 = 4;
inline constexpr int kNcclNumTuningScalesV5 = 3;
struct NcclTunerConstantsV5 {
  double baseLatencies[kNcclNumAlgorithms][kNcclNumProtocols];
  double hwLatencies[kNcclNumHwLinksV5][kNcclNumAlgorithms][kNcclNumProtocols];
  double llMaxBws[kNcclNumCompCapsV5][kNcclNumTuningScalesV5];
  double perChMaxRingLL128Bws[kNcclNumCompCapsV5][kNcclNumTuningScalesV5];
  double perChMaxTreeLL128Bws[kNcclNumCompCapsV5][kNcclNumTuningScalesV5];
  double perChMaxTreeBws[kNcclNumCompCapsV5][kNcclNumTuningScalesV5];
  double perChMaxNVLSTreeBws[kNcclNumCompCapsV5][kNcclNumTuningScalesV5];
};

struct NcclTunerV5 {
  const char* name;
  NcclResult (*init)(void** context, uint64_t comm_id, size_t n_ranks, size_t n_nodes,
                     NcclDebugLogger log, NcclNvlDomainInfoV5* nvl_domain_info,
                     NcclTunerConstantsV5* constants);
  NcclResult (*getCollInfo)(void* context, NcclFunc coll_type, size_t n_bytes, int num_pipe_ops,
                            float** coll_cost_table, int num_algo, int num_proto, int reg_buff,
                            int* n_channels);
  NcclResult (*finalize)(void* context);
};

// v4 (earlier releases): the cost table and regBuff; init without commId or constants.
struct NcclTunerV4 {
  const char* name;
  NcclResult (*init)(size_t n_ranks, size_t n_nodes, NcclDebugLogger log, void** context);
  NcclResult (*getCollInfo)(void* context, NcclFunc coll_type, size_t n_bytes, int num_pipe_ops,
                            float** coll_cost_table, int num_algo, int num_proto, int reg_buff,
                            int* n_channels);
  NcclResult (*destroy)(void* context);
};

// v3: as v4 without regBuff.
struct NcclTunerV3 {
  const char* name;
  NcclResult (*init)(size_t n_ranks, size_t n_nodes, NcclDebugLogger log, void** context);
  NcclResult (*getCollInfo)(void* context, NcclFunc coll_type, size_t n_bytes, int num_pipe_ops,
                            float** coll_cost_table, int num_algo, int num_proto, int* n_channels);
  NcclResult (*destroy)(void* context);
};

// v2: no cost table; the plugin names the algorithm and protocol itself.
struct NcclTunerV2 {
  const char* name;
  NcclResult (*init)(size_t n_ranks, size_t n_nodes, NcclDebugLogger log, void** context);
  NcclResult (*getCollInfo)(void* context, NcclFunc coll_type, size_t n_bytes, int coll_net_support,
                            int nvls_support, int num_pipe_ops, int* algorithm, int* protocol,
                            int* n_channels);
  NcclResult (*destroy)(void* context);
};

}  // namespace adaptcomm::nccl_tuner

#endif  // ADAPTCOMM_PLUGINS_NCCL_TUNER_NCCL_TUNER_ABI_H_

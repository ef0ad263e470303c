// The NCCL tuner plugin's logic (issue #15 item 4): one TunerContext per NCCL communicator
// answers NCCL's per-collective questions from the `nccl` entries of the tuned table named by
// $ADAPTCOMM_NCCL_TUNER_TABLE (lib/config/tuned_table.h). plugin_exports.cc wraps it in the C
// structs NCCL looks up (nccl_tuner_abi.h).
//
// It never makes NCCL fail: a missing, unreadable or invalid table, or one tuned for another
// shape (nRanks/nNodes disagree with the table's fingerprint), is reported once through NCCL's
// logger and the context then leaves every NCCL choice as it is.
#ifndef ADAPTCOMM_PLUGINS_NCCL_TUNER_TUNER_H_
#define ADAPTCOMM_PLUGINS_NCCL_TUNER_TUNER_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plugins/nccl_tuner/nccl_tuner_abi.h"

namespace adaptcomm::nccl_tuner {

inline constexpr char kTableEnv[] = "ADAPTCOMM_NCCL_TUNER_TABLE";
inline constexpr char kPluginName[] = "adaptcomm";

class TunerContext {
 public:
  // Reads the table (once per process and path) and keeps the bands that apply to a
  // communicator of n_ranks ranks on n_nodes nodes. Never fails; `log` may be null.
  static std::unique_ptr<TunerContext> Create(size_t n_ranks, size_t n_nodes, NcclDebugLogger log);

  // Cost-table interfaces (v3-v5): sets the tuned algorithm/protocol's cost to 0 when NCCL can
  // run it here (its entry is not NCCL_ALGO_PROTO_IGNORE) and the channel count when tuned.
  void ApplyToCostTable(NcclFunc func, size_t n_bytes, float* table, int num_algo, int num_proto,
                        int* n_channels) const;
  // v2: names the algorithm and protocol directly when NCCL supports them here.
  void ApplyToChoice(NcclFunc func, size_t n_bytes, int coll_net_support, int nvls_support,
                     int* algorithm, int* protocol, int* n_channels) const;

  // How many bands this context answers from (0: NCCL decides everything).
  size_t band_count() const;

 private:
  struct Band {
    uint64_t min_bytes = 0;  // exclusive
    uint64_t max_bytes = 0;  // inclusive
    int algorithm = -1;      // NCCL_ALGO_*, -1: not tuned
    int protocol = -1;       // NCCL_PROTO_*
    int channels = 0;        // 0: not tuned
    std::string label;       // "tuned.yaml:12 allreduce (64 KiB, 1 MiB]: ring/simple"
    size_t index = 0;        // into warned_
  };

  explicit TunerContext(NcclDebugLogger log) : log_(log) {}
  const Band* Find(NcclFunc func, size_t n_bytes) const;
  // Says once per band that its choice cannot be applied here.
  void WarnOnce(const Band& band, const char* why) const;

  NcclDebugLogger log_;
  std::array<std::vector<Band>, kNcclNumTunedFunctions> bands_;  // by NcclFunc
  std::unique_ptr<std::atomic<bool>[]> warned_;
};

// Logs through NCCL's logger (no-op when it is null), with the plugin's prefix.
void Log(NcclDebugLogger log, NcclLogLevel level, const std::string& message);

}  // namespace adaptcomm::nccl_tuner

#endif  // ADAPTCOMM_PLUGINS_NCCL_TUNER_TUNER_H_

// The network part of `adaptcomm diagnose --ranks`, run by every rank of a launched job: every
// rank reaches the store, versions agree across ranks, small-allreduce latency, large-allreduce
// bus bandwidth, and the rank that makes the others wait.
#ifndef ADAPTCOMM_LIB_DIAG_RANK_CHECKS_H_
#define ADAPTCOMM_LIB_DIAG_RANK_CHECKS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/diagnose.h"
#include "adaptcomm/profile.h"

namespace adaptcomm::diag {

struct RankCheckOptions {
  CommunicatorOptions comm;  // default: rank, world and store from the launcher's environment
  size_t small_bytes = 4096;
  size_t large_bytes = 16 << 20;
  int small_iters = 20;
  int large_iters = 4;
  double min_busbw_gbps = 0.1;                        // large allreduce below: warn
  std::string min_busbw_source = "built-in default";  // printed with the threshold
  double max_small_latency_ms = 50;                   // small allreduce median above: warn
  // A rank whose arrival keeps everyone else waiting this long is named as the slow rank.
  double slow_rank_ms = 20;
  // Fault injection, to see the slow-rank check fire: this rank sleeps `inject_delay` before
  // each timed collective (-1: nobody).
  int inject_rank = -1;
  absl::Duration inject_delay = absl::ZeroDuration();
  // "host|driver|runtime|nccl" of this rank, compared across ranks.
  std::string versions;
};

// Results are the same on every rank (each rank computes them from allgathered measurements).
std::vector<CheckResult> RunRankChecks(const RankCheckOptions& options);

// The bus-bandwidth threshold of the rank checks and where it came from: `flag` (--min-busbw)
// if set, else the profile's diagnose.min_busbw_gbps for `request` (the tier the communicator
// resolves too), else the built-in default when the profile cannot be loaded (said in source).
struct BusbwThreshold {
  double gbps = 0.1;
  std::string source;  // "--min-busbw", "profile tier small (profiles.yaml:63)", ...
};
BusbwThreshold ResolveBusbwThreshold(std::optional<double> flag, const ProfileRequest& request);

// This rank's version fingerprint for RankCheckOptions::versions.
std::string LocalVersionFingerprint();

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_RANK_CHECKS_H_

// GradientBucketer's registration (adaptcomm/bucketer.h): the options checked, and every rank's
// registration compared with rank 0's before any bucket runs, so that a mismatch is named at
// Create rather than found as a hang or wrong sums in a step. Internal to lib/precision.
#ifndef ADAPTCOMM_LIB_PRECISION_BUCKETER_REGISTRATION_H_
#define ADAPTCOMM_LIB_PRECISION_BUCKETER_REGISTRATION_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "adaptcomm/bucketer.h"
#include "adaptcomm/communicator.h"

namespace adaptcomm::bucketer {

// A tensor's registration as one number: what every rank must agree on.
int64_t TensorCode(const GradientSpec& s);
// "4096 x f32 on cuda:0", from a count and a TensorCode.
std::string DescribeTensor(int64_t count, int64_t code);

// The options and registration of one bucketer, before anything is exchanged: InvalidArgument
// or Unimplemented naming what is wrong.
absl::Status ValidateOptions(const std::vector<GradientSpec>& specs, const BucketerOptions& o,
                             const Communicator& comm);

// An allgather of `count` int64 per rank, in host memory or through device scratch.
using Gather = std::function<absl::Status(const int64_t* mine, size_t count, int64_t* all)>;

// Every rank compares its registration with rank 0's: a digest first (16 bytes per rank), the
// registrations themselves only when a digest differs, to name the first rank and tensor.
absl::Status CheckSameOnEveryRank(Communicator& comm, const std::vector<GradientSpec>& specs,
                                  const BucketerOptions& o, size_t bucket_bytes, bool fuse_cuda,
                                  const Gather& gather);

}  // namespace adaptcomm::bucketer

#endif  // ADAPTCOMM_LIB_PRECISION_BUCKETER_REGISTRATION_H_

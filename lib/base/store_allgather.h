// An all-gather of one short value per rank through the store, at O(1) store requests per rank.
//
// Why: creation and agreement steps (join, host identities, backend selection, init agreement,
// split, the configuration check) each need every rank's value. Reading N keys on each of N ranks
// is N^2 requests to one store server, the largest cost of starting a job of hundreds of ranks;
// here each rank sets one key, adds to one counter and reads one key, and only the rank that
// completes the count reads the N contributions, so every contribution is read by exactly one
// rank. It lives in base because it needs only the Store interface: config and the backends use
// it as well as the runtime.
//
// Keys under `prefix` (a prefix used for one exchange only; each exchange needs its own):
//   <prefix><rank>  this rank's value      <prefix>count  ranks that have contributed
//   <prefix>all     every value, in rank order, set by the rank whose add made count == world
#ifndef ADAPTCOMM_LIB_BASE_STORE_ALLGATHER_H_
#define ADAPTCOMM_LIB_BASE_STORE_ALLGATHER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"

namespace adaptcomm::internal {

// What an exchange gathered: every rank's value in rank order; nullopt for a rank that had not
// contributed when this rank's deadline passed (only then, `complete` is false).
struct StoreGathered {
  std::vector<std::optional<std::string>> values;
  bool complete = false;

  // The ranks whose value is missing, in order.
  std::vector<int> Missing() const;
  // The same as text: "rank 2" or "ranks 1, 2".
  std::string DescribeMissing() const;
};

// Contributes `mine` as rank `rank` of `world` and returns every rank's value. A store error is
// returned as is. When the deadline passes first, the result is not complete: each rank's key is
// then read once (the slow path, O(N) requests, taken only when a rank is late or gone) so the
// caller can name the ranks that never contributed.
// InvalidArgument unless 0 <= rank < world. REQUIRES: every rank passes the same prefix and world.
[[nodiscard]] absl::StatusOr<StoreGathered> AllGatherThroughStore(Store& store,
                                                                  const std::string& prefix,
                                                                  int rank, int world,
                                                                  const std::string& mine,
                                                                  absl::Time deadline);

// The values as one string and back (length-prefixed, so a value may hold any byte).
std::string EncodeGathered(const std::vector<std::string>& values);
[[nodiscard]] absl::StatusOr<std::vector<std::string>> DecodeGathered(absl::string_view text,
                                                                      int world);

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_BASE_STORE_ALLGATHER_H_

// The store protocol the failure coordinator's parts share: its keys, wake-up messages, and the
// publish and wake-up calls that retry through a store link that flaps. The retry vote lives in
// failure_coordinator.cc, the failure report (Announce, OnOpFailure) in failure_report.cc.
#ifndef ADAPTCOMM_LIB_CORE_RESILIENCE_FAILURE_PROTOCOL_H_
#define ADAPTCOMM_LIB_CORE_RESILIENCE_FAILURE_PROTOCOL_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"

namespace adaptcomm::internal::failure_protocol {

inline std::string FailureKey(int rank) { return absl::StrCat("failure/", rank); }
inline std::string AckKey(int rank) { return absl::StrCat("ack/", rank); }
inline std::string WakeKey(int rank, int64_t n) { return absl::StrCat("wake/", rank, "/", n); }
inline constexpr char kRetryPrefix[] = "retry:";
inline constexpr char kFailPrefix[] = "fail:";

// Whether a store error means the store could not be reached (rather than a key being absent).
bool StoreUnreachable(const absl::Status& s);

// Sets key, retried until `until` (default: one attempt): after a link flap the store connection
// may need several attempts (TCP backs off), and a vote that is never published fails the retry.
// `cancelled` (optional) ends the retries: an aborted or destroyed communicator does not wait for
// a store that is gone (rank 0's, with rank 0).
absl::Status Publish(Store& store, const std::string& key, const std::string& value,
                     absl::Time until = absl::InfinitePast(),
                     const std::atomic<bool>* cancelled = nullptr);

// Posts `message` to rank's numbered wake-ups, so that none is lost.
absl::Status Wake(Store& store, int rank, const std::string& message,
                  absl::Time until = absl::InfinitePast(),
                  const std::atomic<bool>* cancelled = nullptr);

}  // namespace adaptcomm::internal::failure_protocol

#endif  // ADAPTCOMM_LIB_CORE_RESILIENCE_FAILURE_PROTOCOL_H_

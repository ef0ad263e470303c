// Clients of external stores (Redis, etcd): what they share, and their constructors. Each one is
// built only when its client library was found (lib/store/CMakeLists.txt).
#ifndef ADAPTCOMM_LIB_STORE_EXTERNAL_STORE_H_
#define ADAPTCOMM_LIB_STORE_EXTERNAL_STORE_H_

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"

namespace adaptcomm::external_store {

// Neither server can tell a client that a key appeared without extra server configuration
// (Redis keyspace events) or a streaming connection per waiter (etcd watch), so a waiting Get
// polls: first after 1 ms, doubling up to 20 ms, which keeps a rendezvous step short. A wait that
// has lasted longer polls less often, every tenth of the time waited so far (at most 200 ms):
// that adds at most a tenth to any wait, while ranks held back by a slow peer (hundreds of them
// while a large job's Gloo mesh connects) stop costing the server, and a crowded host's CPUs,
// thousands of reads a second.
class PollBackoff {
 public:
  // Sleeps until the next poll, never past `deadline`.
  void Sleep(absl::Time deadline) {
    const absl::Duration cap =
        std::clamp((absl::Now() - start_) / 10, absl::Milliseconds(20), absl::Milliseconds(200));
    absl::SleepFor(std::max(std::min(next_, deadline - absl::Now()), absl::ZeroDuration()));
    next_ = std::min(next_ * 2, cap);
  }

 private:
  const absl::Time start_ = absl::Now();
  absl::Duration next_ = absl::Milliseconds(1);
};

// The contract's answers for a Get that found nothing, and for a Wait that ran out.
inline absl::Status GetMissing(const std::string& key, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::NotFoundError(absl::StrCat("store key '", key, "' is not set"));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("store key '", key, "' not set within ", absl::FormatDuration(timeout)));
}
inline absl::Status WaitMissing(const std::vector<std::string>& missing, absl::Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat("store keys not set within ",
                                                  absl::FormatDuration(timeout), ": ",
                                                  absl::StrJoin(missing, ", ")));
}

// REQUIRES: url.scheme is "redis" (resp. "etcd"). Connects (retrying until connect_timeout),
// authenticates and makes one round trip.
[[nodiscard]] absl::StatusOr<std::shared_ptr<Store>> ConnectRedis(
    const StoreUrl& url, const ExternalStoreOptions& options);
[[nodiscard]] absl::StatusOr<std::shared_ptr<Store>> ConnectEtcd(
    const StoreUrl& url, const ExternalStoreOptions& options);

}  // namespace adaptcomm::external_store

#endif  // ADAPTCOMM_LIB_STORE_EXTERNAL_STORE_H_

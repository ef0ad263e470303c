#include "lib/core/resilience/failure_protocol.h"

#include <algorithm>

#include "lib/base/log.h"

namespace adaptcomm::internal::failure_protocol {

bool StoreUnreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

absl::Status Publish(Store& store, const std::string& key, const std::string& value,
                     absl::Time until, const std::atomic<bool>* cancelled) {
  absl::Status s;
  for (absl::Duration pause = absl::Milliseconds(50);;
       pause = std::min(pause * 2, absl::Seconds(1))) {
    s = store.Set(key, value);
    if (s.ok() || absl::Now() + pause >= until || (cancelled != nullptr && cancelled->load())) {
      break;
    }
    absl::SleepFor(pause);
  }
  if (!s.ok()) ADAPTCOMM_LOG(kWarning, "cannot publish ", key, " to the store: ", s.ToString());
  return s;
}

absl::Status Wake(Store& store, int rank, const std::string& message, absl::Time until,
                  const std::atomic<bool>* cancelled) {
  absl::StatusOr<int64_t> n;
  for (absl::Duration pause = absl::Milliseconds(50);;
       pause = std::min(pause * 2, absl::Seconds(1))) {
    n = store.Add(absl::StrCat("wakes/", rank), 1);
    if (n.ok() || absl::Now() + pause >= until || (cancelled != nullptr && cancelled->load())) {
      break;
    }
    absl::SleepFor(pause);
  }
  if (!n.ok()) {
    ADAPTCOMM_LOG(kWarning, "cannot wake rank ", rank, ": ", n.status().ToString());
    return n.status();
  }
  return Publish(store, WakeKey(rank, *n), message, until, cancelled);
}

}  // namespace adaptcomm::internal::failure_protocol

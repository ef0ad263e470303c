// LogThrottle: a rate limit for log sites that outside events can trigger at any rate (a port
// scan or a connection flood against the store, a peer that keeps reconnecting). At most one line
// per interval gets through; the next one that does says how many were suppressed, so a flood is
// visible in the log without drowning it.
#ifndef ADAPTCOMM_LIB_BASE_LOG_THROTTLE_H_
#define ADAPTCOMM_LIB_BASE_LOG_THROTTLE_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lib/base/log.h"

namespace adaptcomm::log {

// Thread-safe.
class LogThrottle {
 public:
  explicit LogThrottle(absl::Duration interval) : interval_(interval) {}

  // Whether a line may be written now. When it may, the suffix to append to it (empty, or
  // " [N similar lines suppressed in the last 10s]"); when not, the line is counted.
  bool Allow(std::string* suffix) {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now < next_) {
      ++suppressed_;
      return false;
    }
    suffix->clear();
    if (suppressed_ > 0) {
      *suffix = absl::StrCat(" [", suppressed_, " similar line", suppressed_ == 1 ? "" : "s",
                             " suppressed in the last ", absl::FormatDuration(now - last_), "]");
    }
    suppressed_ = 0;
    last_ = now;
    next_ = now + interval_;
    return true;
  }

 private:
  const absl::Duration interval_;
  absl::Mutex mu_;
  absl::Time next_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace adaptcomm::log

// ADAPTCOMM_LOG through `throttle` (a LogThrottle that outlives the call).
#define ADAPTCOMM_LOG_THROTTLED(throttle, level, ...)                              \
  do {                                                                             \
    std::string adaptcomm_log_suffix_;                                             \
    if (::adaptcomm::log::Enabled(::adaptcomm::log::Level::level) &&               \
        (throttle).Allow(&adaptcomm_log_suffix_)) {                                \
      ::adaptcomm::log::Write(::adaptcomm::log::Level::level,                      \
                              ::absl::StrCat(__VA_ARGS__, adaptcomm_log_suffix_)); \
    }                                                                              \
  } while (0)

#endif  // ADAPTCOMM_LIB_BASE_LOG_THROTTLE_H_

// One line per event, rank in front: "[adaptcomm r3 W 04:12:55.123] message".
// Level from ADAPTCOMM_LOG_LEVEL (debug, info, warning, error, off; default info, and only rare
// events log at info: creation, fallback, retry). ADAPTCOMM_LOG_FILE="path/log.%r" writes to a
// per-rank file (%r = rank) instead of stderr. Never log per operation above debug.
#ifndef ADAPTCOMM_LIB_BASE_LOG_H_
#define ADAPTCOMM_LIB_BASE_LOG_H_

#include <string_view>

#include "absl/strings/str_cat.h"

namespace adaptcomm::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

bool Enabled(Level level);
void Write(Level level, const std::string& message);
// The rank printed by this process's lines (-1 = unknown, printed as "r?"). Ignored on a thread
// with a ScopedThreadRank: that thread is one of several ranks run as threads of this process, so
// the process has no single rank, and its other lines (the store server's, other ranks' helper
// threads) print "r?" rather than the rank created last.
void SetProcessRank(int rank);
// Flushes the log file, if any (before exiting on a failure).
void Flush();

// Overrides the rank for lines written by this thread (ranks run as threads in tests).
class ScopedThreadRank {
 public:
  explicit ScopedThreadRank(int rank);
  ~ScopedThreadRank();
  ScopedThreadRank(const ScopedThreadRank&) = delete;
  ScopedThreadRank& operator=(const ScopedThreadRank&) = delete;

 private:
  int previous_;
};

}  // namespace adaptcomm::log

#define ADAPTCOMM_LOG(level, ...)                                                           \
  do {                                                                                      \
    if (::adaptcomm::log::Enabled(::adaptcomm::log::Level::level)) {                        \
      ::adaptcomm::log::Write(::adaptcomm::log::Level::level, ::absl::StrCat(__VA_ARGS__)); \
    }                                                                                       \
  } while (0)

#endif  // ADAPTCOMM_LIB_BASE_LOG_H_

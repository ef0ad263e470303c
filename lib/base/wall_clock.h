// The wall clock of per-op timestamps, read without absl::Now()'s cost.
//
// absl::Now() scales a cycle counter against a kernel time sample it refreshes under a seqlock;
// Debian's abseil takes about twice as long as the vDSO's clock_gettime for that (and twice the
// code: the issue path of a device op reads the clock once and is sized to stay in the
// instruction cache, bench/stream_order_bench). Both read CLOCK_REALTIME, so the times compare
// with absl::Now()'s.
#ifndef ADAPTCOMM_LIB_BASE_WALL_CLOCK_H_
#define ADAPTCOMM_LIB_BASE_WALL_CLOCK_H_

#include <time.h>

#include <cstdint>

#include "absl/time/time.h"

namespace adaptcomm {

inline absl::Time WallNow() {
  timespec ts;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return absl::Now();  // never on Linux
  return absl::FromUnixNanos(static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec);
}

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_WALL_CLOCK_H_

// The wall clock of per-op timestamps (an op's enqueue, start and end, OpExecutor and WorkImpl),
// read without absl::Now()'s cost.
//
// absl::Now() scales a cycle counter against a kernel time sample it refreshes under a seqlock;
// Debian's abseil takes about twice as long as the vDSO's clock_gettime for that (and twice the
// code: the issue path of a device op reads the clock once, bench/stream_order_bench). Both are
// CLOCK_REALTIME, but absl::Now() may lag the kernel's clock by some microseconds on a VM: an op's
// times and the executor's comparisons with them (the waiter tick) all come from here, so that
// they compare among themselves; bounds of waits stay with absl::Now() and absl's CondVar.
#ifndef ADAPTCOMM_LIB_BASE_WALL_CLOCK_H_
#define ADAPTCOMM_LIB_BASE_WALL_CLOCK_H_

#include <time.h>

#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace adaptcomm {

inline absl::Time WallNow() {
  timespec ts;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return absl::Now();  // never on Linux
  return absl::FromUnixNanos(static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec);
}

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_WALL_CLOCK_H_

#include "lib/trace/clock_sync.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace adaptcomm::trace {
namespace {

std::string Key(const ClockSyncOptions& o, const char* kind, int rank, int round) {
  return absl::StrCat(o.key_prefix, "/", kind, "/", rank, "/", round);
}

// Nanoseconds since the epoch travel as decimal text: exact, and readable in a store dump.
absl::StatusOr<int64_t> ParseNanos(const std::string& key, const std::string& text) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v)) {
    return absl::DataLossError(absl::StrCat("clock sync: key ", key, " holds '", text,
                                            "', not a time (another job using the same store?)"));
  }
  return v;
}

absl::Duration Remaining(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

// Best effort: a key left behind only costs store memory, the protocol never reads it again.
void DeleteQuietly(Store& store, const std::string& key) { store.Delete(key).IgnoreError(); }

}  // namespace

absl::StatusOr<ClockOffsetEstimate> EstimateClockOffset(Store& store, int rank, int world,
                                                        absl::Duration timeout,
                                                        const ClockSyncOptions& options) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("clock sync: rank ", rank, " out of range for world size ", world));
  }
  if (options.rounds < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("clock sync: rounds must be at least 1, got ", options.rounds));
  }
  const std::function<absl::Time()> clock =
      options.clock ? options.clock : std::function<absl::Time()>([] { return absl::Now(); });
  // The deadline is on the real clock: an injected skew must not stretch or shrink the bound.
  const absl::Time deadline = absl::Now() + timeout;
  ClockOffsetEstimate best;
  if (rank == 0) {
    for (int r = 1; r < world; ++r) {
      for (int i = 0; i < options.rounds; ++i) {
        const std::string req = Key(options, "req", r, i);
        absl::StatusOr<std::string> sent = store.Get(req, Remaining(deadline));
        if (!sent.ok()) {
          return absl::Status(sent.status().code(),
                              absl::StrCat("clock sync: rank ", r,
                                           " did not take part: ", sent.status().message()));
        }
        const int64_t t0 = absl::ToUnixNanos(clock());
        absl::Status answered = store.Set(Key(options, "resp", r, i), absl::StrCat(t0));
        if (!answered.ok()) return answered;
        DeleteQuietly(store, req);
      }
    }
    return best;
  }
  best.rtt_us = std::numeric_limits<double>::infinity();
  for (int i = 0; i < options.rounds; ++i) {
    const int64_t t1 = absl::ToUnixNanos(clock());
    absl::Status asked = store.Set(Key(options, "req", rank, i), absl::StrCat(t1));
    if (!asked.ok()) return asked;
    const std::string resp = Key(options, "resp", rank, i);
    absl::StatusOr<std::string> answer = store.Get(resp, Remaining(deadline));
    const int64_t t2 = absl::ToUnixNanos(clock());
    if (!answer.ok()) {
      return absl::Status(
          answer.status().code(),
          absl::StrCat("clock sync: no answer from rank 0: ", answer.status().message()));
    }
    DeleteQuietly(store, resp);
    absl::StatusOr<int64_t> t0 = ParseNanos(resp, *answer);
    if (!t0.ok()) return t0.status();
    const double rtt_us = static_cast<double>(t2 - t1) / 1e3;
    if (rtt_us < best.rtt_us) {
      best.rtt_us = rtt_us;
      // Halve the difference of the ends before adding, so int64 nanoseconds never overflow.
      best.offset_us = (static_cast<double>(t1 - *t0) + static_cast<double>(t2 - *t0)) / 2e3;
    }
  }
  return best;
}

absl::StatusOr<double> EstimateClockOffset(Store& store, int rank, int world,
                                           absl::Duration timeout) {
  absl::StatusOr<ClockOffsetEstimate> e =
      EstimateClockOffset(store, rank, world, timeout, ClockSyncOptions{});
  if (!e.ok()) return e.status();
  return e->offset_us;
}

}  // namespace adaptcomm::trace

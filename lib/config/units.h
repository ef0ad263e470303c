// Parsing and printing of the unit strings profiles use: model sizes ("7B", "1.5T",
// "7000000000"), durations ("1200s", "40min", "2h", "500ms") and byte sizes ("2MiB", "4194304").
#ifndef ADAPTCOMM_LIB_CONFIG_UNITS_H_
#define ADAPTCOMM_LIB_CONFIG_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace adaptcomm::config {

// A parameter count: digits with an optional fraction and a K/M/B/T suffix (case-insensitive),
// or a plain count. InvalidArgument for anything else, zero, or more than 10^18.
absl::StatusOr<uint64_t> ParseModelSize(const std::string& text);
// "7B", "1.5T", "235B", "500M"; a count that is no round multiple prints as digits.
std::string FormatModelSize(uint64_t params);

// A positive or zero duration with a unit (ms, s, min, h); a bare number is refused because
// "1200" could mean seconds or milliseconds.
absl::StatusOr<absl::Duration> ParseDuration(const std::string& text);
// Whole seconds as "1200s"; below one second as "500ms".
std::string DurationText(absl::Duration d);

// Bytes: a plain integer or one with B, KiB, MiB, GiB (powers of 1024) or KB, MB, GB (of 1000).
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

// Strict decimal parsing of a whole value (no trailing text).
absl::StatusOr<int64_t> ParseInt(const std::string& text);
absl::StatusOr<double> ParseDouble(const std::string& text);
absl::StatusOr<bool> ParseBool(const std::string& text);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_UNITS_H_

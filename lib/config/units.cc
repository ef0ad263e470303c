#include "lib/config/units.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace adaptcomm::config {
namespace {

constexpr uint64_t kMaxParams = 1000000000000000000ULL;  // 10^18: far beyond any model

// Splits "12.5MiB" into number "12.5" and unit "MiB" (surrounding spaces ignored).
void SplitNumberUnit(const std::string& text, std::string* number, std::string* unit) {
  std::string t(absl::StripAsciiWhitespace(text));
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  *number = t.substr(0, i);
  *unit = std::string(absl::StripAsciiWhitespace(t.substr(i)));
}

bool AllDigits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// number (digits, optional ".digits") times multiplier, exactly; false if not a whole result or
// if it overflows `limit`.
bool ScaleExact(const std::string& number, uint64_t multiplier, uint64_t limit, uint64_t* out) {
  size_t dot = number.find('.');
  // ".5T" reads as "0.5T".
  const std::string whole = dot == 0                   ? std::string(1, '0')
                            : dot == std::string::npos ? number
                                                       : number.substr(0, dot);
  const std::string frac = dot == std::string::npos ? std::string() : number.substr(dot + 1);
  if (!AllDigits(whole) || (dot != std::string::npos && !AllDigits(frac))) return false;
  if (whole.size() > 19) return false;
  uint64_t w = 0;
  if (!absl::SimpleAtoi(whole, &w)) return false;
  if (w > limit / multiplier) return false;
  uint64_t value = w * multiplier;
  // The fraction adds frac/10^len * multiplier, which must be whole.
  std::string digits = frac;
  while (!digits.empty() && digits.back() == '0') digits.pop_back();
  if (digits.size() > 18) return false;
  if (!digits.empty()) {
    uint64_t numerator = 0;
    if (!absl::SimpleAtoi(digits, &numerator)) return false;
    unsigned __int128 pow10 = 1;
    for (size_t i = 0; i < digits.size(); ++i) pow10 *= 10;
    unsigned __int128 product = static_cast<unsigned __int128>(numerator) * multiplier;
    if (product % pow10 != 0) return false;
    value += static_cast<uint64_t>(product / pow10);
  }
  if (value > limit) return false;
  *out = value;
  return true;
}

}  // namespace

absl::StatusOr<uint64_t> ParseModelSize(const std::string& text) {
  std::string number, unit;
  SplitNumberUnit(text, &number, &unit);
  uint64_t multiplier = 1;
  std::string u = absl::AsciiStrToUpper(unit);
  if (u.empty()) {
    multiplier = 1;
  } else if (u == "K") {
    multiplier = 1000ULL;
  } else if (u == "M") {
    multiplier = 1000000ULL;
  } else if (u == "B" || u == "G") {
    multiplier = 1000000000ULL;
  } else if (u == "T") {
    multiplier = 1000000000000ULL;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("model size '", text, "': unknown suffix '",
                                                   unit, "' (use K, M, B or T, e.g. 7B, 1.5T)"));
  }
  uint64_t params = 0;
  if (number.empty() || (u.empty() && number.find('.') != std::string::npos) ||
      !ScaleExact(number, multiplier, kMaxParams, &params)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model size '", text, "' is not a parameter count (e.g. 7B, 235B, 1.5T, 7000000000)"));
  }
  if (params == 0) {
    return absl::InvalidArgumentError(absl::StrCat("model size '", text, "' must be positive"));
  }
  return params;
}

std::string FormatModelSize(uint64_t params) {
  struct Unit {
    uint64_t scale;
    const char* suffix;
  };
  for (Unit unit : {Unit{1000000000000ULL, "T"}, Unit{1000000000ULL, "B"}, Unit{1000000ULL, "M"},
                    Unit{1000ULL, "K"}}) {
    if (params < unit.scale) continue;
    // One decimal at most ("1.5T"); otherwise print the count exactly.
    if (params % unit.scale == 0) return absl::StrCat(params / unit.scale, unit.suffix);
    if ((params * 10) % unit.scale == 0 && params < std::numeric_limits<uint64_t>::max() / 10) {
      return absl::StrCat(params / unit.scale, ".", (params * 10 / unit.scale) % 10, unit.suffix);
    }
    break;
  }
  return absl::StrCat(params);
}

absl::StatusOr<absl::Duration> ParseDuration(const std::string& text) {
  std::string number, unit;
  SplitNumberUnit(text, &number, &unit);
  double value = 0;
  if (number.empty() || number == "." || !absl::SimpleAtod(number, &value) ||
      !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("duration '", text, "' is not a number with a unit (e.g. 1200s, 40min, 2h)"));
  }
  std::string u = absl::AsciiStrToLower(unit);
  double seconds = 0;
  if (u == "ms") {
    seconds = value / 1000.0;
  } else if (u == "s" || u == "sec") {
    seconds = value;
  } else if (u == "min" || u == "m") {
    seconds = value * 60.0;
  } else if (u == "h") {
    seconds = value * 3600.0;
  } else if (u.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("duration '", text, "' has no unit: write e.g. ", number, "s"));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("duration '", text, "': unknown unit '", unit, "' (use ms, s, min or h)"));
  }
  if (seconds > 366.0 * 24 * 3600) {
    return absl::InvalidArgumentError(absl::StrCat("duration '", text, "' exceeds a year"));
  }
  return absl::Milliseconds(std::llround(seconds * 1000.0));
}

std::string DurationText(absl::Duration d) {
  int64_t ms = absl::ToInt64Milliseconds(d);
  if (ms % 1000 == 0) return absl::StrCat(ms / 1000, "s");
  return absl::StrCat(ms, "ms");
}

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  std::string number, unit;
  SplitNumberUnit(text, &number, &unit);
  uint64_t multiplier = 1;
  if (unit.empty() || unit == "B") {
    multiplier = 1;
  } else if (unit == "KiB") {
    multiplier = 1ULL << 10;
  } else if (unit == "MiB") {
    multiplier = 1ULL << 20;
  } else if (unit == "GiB") {
    multiplier = 1ULL << 30;
  } else if (unit == "KB" || unit == "kB") {
    multiplier = 1000ULL;
  } else if (unit == "MB") {
    multiplier = 1000000ULL;
  } else if (unit == "GB") {
    multiplier = 1000000000ULL;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "': unknown unit '", unit,
                                                   "' (use B, KiB, MiB, GiB, KB, MB or GB)"));
  }
  uint64_t bytes = 0;
  if (number.empty() || !ScaleExact(number, multiplier, 1ULL << 50, &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size '", text, "' is not a whole number of bytes (e.g. 2MiB, 4194304)"));
  }
  return bytes;
}

absl::StatusOr<int64_t> ParseInt(const std::string& text) {
  int64_t v = 0;
  std::string t(absl::StripAsciiWhitespace(text));
  if (t.empty() || !absl::SimpleAtoi(t, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not an integer"));
  }
  return v;
}

absl::StatusOr<double> ParseDouble(const std::string& text) {
  double v = 0;
  std::string t(absl::StripAsciiWhitespace(text));
  if (t.empty() || !absl::SimpleAtod(t, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a number"));
  }
  return v;
}

absl::StatusOr<bool> ParseBool(const std::string& text) {
  std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (t == "true" || t == "yes" || t == "on" || t == "1") return true;
  if (t == "false" || t == "no" || t == "off" || t == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a boolean (true/false)"));
}

}  // namespace adaptcomm::config

// Store::MultiGet's default: one Get per key under one deadline. Here, in the bottom layer, because
// the store exchanges of lib/base call it on every store.
#include "lib/base/store_multi_get.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "adaptcomm/store.h"

namespace adaptcomm {

absl::Status MultiGetMissing(const std::vector<std::string>& missing, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::NotFoundError(absl::StrCat("store keys not set: ", absl::StrJoin(missing, ", ")));
  }
  return absl::DeadlineExceededError(absl::StrCat("store keys not set within ",
                                                  absl::FormatDuration(timeout), ": ",
                                                  absl::StrJoin(missing, ", ")));
}

absl::StatusOr<std::vector<std::string>> Store::MultiGet(const std::vector<std::string>& keys,
                                                         absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<std::string> v =
        Get(keys[i], std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (v.ok()) {
      values.push_back(*std::move(v));
      continue;
    }
    if (!absl::IsNotFound(v.status()) && !absl::IsDeadlineExceeded(v.status())) {
      return v.status();
    }
    // Name every key still missing, not only the first.
    std::vector<std::string> missing = {keys[i]};
    for (size_t j = i + 1; j < keys.size(); ++j) {
      if (!Get(keys[j], absl::ZeroDuration()).ok()) missing.push_back(keys[j]);
    }
    return MultiGetMissing(missing, timeout);
  }
  return values;
}

}  // namespace adaptcomm

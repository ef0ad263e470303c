#include "lib/core/selection/init_agreement.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/base/store_allgather.h"

namespace adaptcomm::internal {
absl::Status AgreeOnInit(Store& store, int rank, int world_size, int attempt,
                         const absl::Status& mine, const std::vector<absl::StatusCode>& retryable,
                         absl::Time deadline) {
  const std::string value =
      mine.ok() ? "ok" : absl::StrCat(static_cast<int>(mine.code()), "|", mine.message());
  absl::StatusOr<StoreGathered> gathered = AllGatherThroughStore(
      store, absl::StrCat("init/", attempt, "/"), rank, world_size, value, deadline);
  if (!gathered.ok()) return gathered.status();
  std::vector<std::string> failures;
  const std::vector<int> missing = gathered->Missing();
  absl::StatusCode final_code = absl::StatusCode::kUnavailable;
  for (int r = 0; r < world_size; ++r) {
    const std::optional<std::string>& v = gathered->values[static_cast<size_t>(r)];
    if (!v.has_value() || *v == "ok") continue;
    std::vector<std::string> parts = absl::StrSplit(*v, absl::MaxSplits('|', 1));
    int code = static_cast<int>(absl::StatusCode::kUnknown);
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &code)) parts = {"", *v};
    failures.push_back(absl::StrCat("rank ", r, ": ", parts[1]));
    const auto c = static_cast<absl::StatusCode>(code);
    if (final_code == absl::StatusCode::kUnavailable &&
        std::find(retryable.begin(), retryable.end(), c) == retryable.end()) {
      final_code = c;
    }
  }
  if (failures.empty() && missing.empty()) return absl::OkStatus();
  std::string text = absl::StrCat("creating the backend (attempt ", attempt, ") failed");
  if (!failures.empty()) absl::StrAppend(&text, " on ", absl::StrJoin(failures, "; "));
  if (!missing.empty()) {
    absl::StrAppend(&text, failures.empty() ? "" : ";", " rank(s) ", absl::StrJoin(missing, ", "),
                    " did not report in time");
    if (failures.empty()) final_code = absl::StatusCode::kDeadlineExceeded;
  }
  return absl::Status(final_code, text);
}

}  // namespace adaptcomm::internal

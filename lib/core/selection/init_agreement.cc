#include "lib/core/selection/init_agreement.h"

#include <algorithm>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace adaptcomm::internal {
namespace {

std::string Key(int attempt, int rank) { return absl::StrCat("init/", attempt, "/", rank); }

}  // namespace

absl::Status AgreeOnInit(Store& store, int rank, int world_size, int attempt,
                         const absl::Status& mine, const std::vector<absl::StatusCode>& retryable,
                         absl::Time deadline) {
  const std::string value =
      mine.ok() ? "ok" : absl::StrCat(static_cast<int>(mine.code()), "|", mine.message());
  if (absl::Status s = store.Set(Key(attempt, rank), value); !s.ok()) return s;
  std::vector<std::string> failures;
  std::vector<int> missing;
  absl::StatusCode final_code = absl::StatusCode::kUnavailable;
  for (int r = 0; r < world_size; ++r) {
    absl::StatusOr<std::string> v =
        store.Get(Key(attempt, r), std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!v.ok()) {
      missing.push_back(r);
      continue;
    }
    if (*v == "ok") continue;
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

#include "lib/core/executor/collective_check.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace adaptcomm::internal {
namespace {

std::string Key(uint64_t seq, int rank) { return absl::StrCat("check/", seq, "/", rank); }

}  // namespace

absl::Status CollectiveCheck::Check(const OpDesc& op, const std::string& fingerprint) {
  if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv || world_size_ == 1) {
    return absl::OkStatus();
  }
  if (op.seq > 2) (void)store_->Delete(Key(op.seq - 2, rank_));
  if (absl::Status s = store_->Set(Key(op.seq, rank_), fingerprint); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + op.timeout;
  std::map<std::string, std::vector<int>> calls;
  std::vector<int> missing;
  for (int r = 0; r < world_size_; ++r) {
    absl::StatusOr<std::string> theirs =
        store_->Get(Key(op.seq, r), std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (theirs.ok()) {
      calls[*theirs].push_back(r);
    } else {
      missing.push_back(r);
    }
  }
  const std::string where =
      absl::StrCat(OpKindName(op.kind), " #", op.seq, " of communicator '", name_, "'");
  if (calls.size() > 1) {
    std::vector<std::string> who;
    for (const auto& [call, ranks] : calls) {
      who.push_back(absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","),
                                 " called ", call));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("mismatched collectives at #", op.seq, " of communicator '", name_,
                     "' (check_collectives): ", absl::StrJoin(who, "; "), "; nothing was sent"));
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("check_collectives: rank(s) ", absl::StrJoin(missing, ","), " did not reach ",
                     where, " within ", absl::FormatDuration(op.timeout)));
  }
  return absl::OkStatus();
}

}  // namespace adaptcomm::internal

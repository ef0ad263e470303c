// The failure report: a rank whose op failed tells the others and names who went silent.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/log.h"
#include "lib/core/resilience/failure_coordinator.h"
#include "lib/core/resilience/failure_protocol.h"
#include "lib/trace/culprit.h"

namespace adaptcomm::internal {
namespace {

using failure_protocol::AckKey;
using failure_protocol::FailureKey;
using failure_protocol::kFailPrefix;
using failure_protocol::kRetryPrefix;
using failure_protocol::Publish;
using failure_protocol::StoreUnreachable;
using failure_protocol::Wake;
using failure_protocol::WakeKey;

// A failure report names every rank at 8 ranks but must stay a readable line at thousands: at
// most this many ranks named, failures quoted, and bytes of each quoted failure.
constexpr size_t kMaxRanksNamed = 32;
constexpr size_t kMaxFailuresQuoted = 4;
constexpr size_t kMaxQuotedBytes = 400;

// The first `limit` items joined, then how many more there are.
template <typename T>
std::string JoinFirst(const std::vector<T>& items, size_t limit, const char* separator) {
  if (items.size() <= limit) return absl::StrJoin(items, separator);
  return absl::StrCat(
      absl::StrJoin(std::vector<T>(items.begin(), items.begin() + static_cast<long>(limit)),
                    separator),
      separator, "and ", items.size() - limit, " more");
}

std::string Shortened(const std::string& text, size_t limit) {
  return text.size() <= limit ? text : absl::StrCat(text.substr(0, limit), "...");
}

}  // namespace

void FailureCoordinator::Announce(const absl::Status& cause) {
  // No flight record dump: the communicator may be going away meanwhile (the recorder is its),
  // and the member that broke dumped its own.
  if (cancelled_.load() || store_unreachable_.load() || reported_.exchange(true)) return;
  // One attempt per key: the family's abort must not wait on a store that is gone.
  absl::Status told = Publish(*store_, FailureKey(options_.rank), std::string(cause.message()));
  for (int id : Members()) {
    if (!told.ok()) break;
    if (id != options_.rank) told = Wake(*store_, id, absl::StrCat(kFailPrefix, options_.rank));
  }
  if (!told.ok() && StoreUnreachable(told)) store_unreachable_.store(true);
}

absl::Status FailureCoordinator::OnOpFailure(const OpDesc& op, absl::Status status) {
  // Later ops fail fast on the broken backend; the group already knows. A refused membership
  // change was agreed by every survivor's vote: each fails on its own.
  if (change_refused_.load() || reported_.exchange(true)) return status;
  const std::string cause = absl::StrCat(OpKindName(op.kind), " #", op.seq, ": ", status.message());
  if (recorder_ != nullptr) (void)recorder_->Dump(cause);
  // A store this rank cannot reach takes each request its full I/O bound to fail: try nothing
  // more once one has (the error is returned now, not minutes later).
  absl::Status told = store_unreachable_.load()
                          ? absl::UnavailableError("the store was already unreachable")
                          : Publish(*store_, FailureKey(options_.rank), cause);
  const std::vector<int> members = Members();
  for (size_t i = 0; i < members.size() && told.ok() && !decided_by_store_.load(); ++i) {
    if (members[i] != options_.rank) {
      told = Wake(*store_, members[i], absl::StrCat(kFailPrefix, options_.rank));
    }
  }
  if (!told.ok() && StoreUnreachable(told)) {
    store_unreachable_.store(true);
    ADAPTCOMM_LOG(kError, cause);
    return absl::Status(
        status.code(), absl::StrCat(cause, " [rank ", options_.rank, " of communicator '",
                                    options_.name, "'; it cannot reach the store (", told.message(),
                                    "), so no other rank was told]"));
  }
  // A failed retry vote already waited for everyone and named who was missing: tell the others,
  // but do not wait a second time.
  if (vote_failed_.load()) {
    ADAPTCOMM_LOG(kError, cause);
    return absl::Status(status.code(), absl::StrCat(cause, " [rank ", options_.rank,
                                                    " of communicator '", options_.name, "']"));
  }
  // Every other rank either failed too (its own report) or was woken (its ack). Poll them all in
  // rounds until each answered or the window closed (one last round after it closes).
  const absl::Time deadline = absl::Now() + options_.report_window;
  std::vector<int> pending;  // ids (ranks at creation)
  for (int id : members) {
    if (id != options_.rank) pending.push_back(id);
  }
  std::vector<std::string> failed;
  while (!pending.empty() && !cancelled_.load()) {
    const bool last_round = absl::Now() >= deadline;
    std::vector<int> still;
    for (int r : pending) {
      if (auto f = store_->Get(FailureKey(r), absl::ZeroDuration()); f.ok()) {
        failed.push_back(absl::StrCat("rank ", r, " (", Shortened(*f, kMaxQuotedBytes), ")"));
      } else if (!store_->Get(AckKey(r), absl::ZeroDuration()).ok()) {
        still.push_back(r);
      }
    }
    pending.swap(still);
    if (last_round) break;
    if (!pending.empty()) absl::SleepFor(absl::Milliseconds(20));
  }
  const std::vector<int>& silent = pending;
  std::string message =
      absl::StrCat(cause, " [rank ", options_.rank, " of communicator '", options_.name, "']");
  if (!silent.empty()) {
    absl::StrAppend(&message, "; rank(s) ", JoinFirst(silent, kMaxRanksNamed, ", "),
                    " did not respond within ", absl::FormatDuration(options_.report_window),
                    ": dead or stalled, the likely culprit");
  }
  if (!failed.empty()) {
    absl::StrAppend(&message, "; also failed: ", JoinFirst(failed, kMaxFailuresQuoted, "; "));
  }
  ADAPTCOMM_LOG(kError, message);
  if (!members.empty() && members.front() == options_.rank && recorder_ != nullptr) {
    // Rank 0 says who is behind itself when the others' dumps are reachable (a shared or local
    // dump directory), so nobody has to run `adaptcomm trace culprit` to read the first answer.
    // The current rank 0: after a shrink that lost rank 0 at creation, its successor does.
    if (absl::StatusOr<trace::CulpritReport> report =
            trace::AnalyzeFlightDumps(recorder_->dump_dir());
        report.ok()) {
      ADAPTCOMM_LOG(kError, "culprit: ", report->verdict, " (dumps in ", recorder_->dump_dir(),
                    "; `adaptcomm trace culprit ", recorder_->dump_dir(), "` for details)");
    }
  }
  return absl::Status(status.code(), message);
}

}  // namespace adaptcomm::internal

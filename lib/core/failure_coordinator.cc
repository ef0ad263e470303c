#include "lib/core/failure_coordinator.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/core/log.h"
#include "lib/trace/culprit.h"

namespace adaptcomm::internal {
namespace {

constexpr char kShutdown[] = "shutdown";
// Long enough to be cheap, short enough that a store that vanished is noticed.
constexpr absl::Duration kListenSlice = absl::Seconds(30);

std::string FailureKey(int rank) { return absl::StrCat("failure/", rank); }
std::string AckKey(int rank) { return absl::StrCat("ack/", rank); }
std::string WakeKey(int rank) { return absl::StrCat("wake/", rank); }

}  // namespace

FailureCoordinator::FailureCoordinator(FailureCoordinatorOptions options,
                                       std::shared_ptr<Store> store,
                                       trace::FlightRecorder* recorder)
    : options_(std::move(options)), store_(std::move(store)), recorder_(recorder) {}

FailureCoordinator::~FailureCoordinator() { Stop(); }

void FailureCoordinator::Start(std::function<void(const absl::Status&)> abort) {
  abort_ = std::move(abort);
  listener_ = std::thread([this] { Listen(); });
}

void FailureCoordinator::Stop() {
  if (!listener_.joinable()) return;
  Publish(WakeKey(options_.rank), kShutdown);
  listener_.join();
}

void FailureCoordinator::Publish(const std::string& key, const std::string& value) {
  if (absl::Status s = store_->Set(key, value); !s.ok()) {
    ADAPTCOMM_LOG(kWarning, "cannot publish ", key, " to the store: ", s.ToString());
  }
}

void FailureCoordinator::Listen() {
  while (true) {
    absl::StatusOr<std::string> wake = store_->Get(WakeKey(options_.rank), kListenSlice);
    if (!wake.ok()) {
      if (absl::IsDeadlineExceeded(wake.status())) continue;
      absl::Status lost = absl::UnavailableError(
          absl::StrCat("communicator '", options_.name, "' lost its store (",
                       wake.status().message(), "); rank 0, which serves it, may be gone"));
      ADAPTCOMM_LOG(kError, lost.message());
      if (recorder_ != nullptr) (void)recorder_->Dump(std::string(lost.message()));
      abort_(lost);
      return;
    }
    if (*wake == kShutdown) return;
    int failed_rank = -1;
    (void)absl::SimpleAtoi(*wake, &failed_rank);
    std::string detail = store_->Get(FailureKey(failed_rank), absl::Seconds(5)).value_or("?");
    absl::Status reason =
        absl::AbortedError(absl::StrCat("rank ", failed_rank, " failed (", detail, "); rank ",
                                        options_.rank, " aborts its pending operations"));
    ADAPTCOMM_LOG(kError, reason.message());
    // Dump before acknowledging, so the failed rank finds every dump once all have answered.
    if (recorder_ != nullptr) (void)recorder_->Dump(std::string(reason.message()));
    Publish(AckKey(options_.rank), "aborting");
    abort_(reason);
    return;
  }
}

absl::Status FailureCoordinator::OnOpFailure(const OpDesc& op, absl::Status status) {
  // Later ops fail fast on the broken backend; the group already knows.
  if (reported_.exchange(true)) return status;
  const std::string cause = absl::StrCat(OpKindName(op.kind), " #", op.seq, ": ", status.message());
  if (recorder_ != nullptr) (void)recorder_->Dump(cause);
  Publish(FailureKey(options_.rank), cause);
  for (int r = 0; r < options_.world_size; ++r) {
    if (r != options_.rank) Publish(WakeKey(r), absl::StrCat(options_.rank));
  }
  // Every other rank either failed too (its own report) or was woken (its ack). Poll them all in
  // rounds until each answered or the window closed (one last round after it closes).
  const absl::Time deadline = absl::Now() + options_.report_window;
  std::vector<int> pending;
  for (int r = 0; r < options_.world_size; ++r) {
    if (r != options_.rank) pending.push_back(r);
  }
  std::vector<std::string> failed;
  while (!pending.empty()) {
    const bool last_round = absl::Now() >= deadline;
    std::vector<int> still;
    for (int r : pending) {
      if (auto f = store_->Get(FailureKey(r), absl::ZeroDuration()); f.ok()) {
        failed.push_back(absl::StrCat("rank ", r, " (", *f, ")"));
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
    absl::StrAppend(&message, "; rank(s) ", absl::StrJoin(silent, ", "), " did not respond within ",
                    absl::FormatDuration(options_.report_window),
                    ": dead or stalled, the likely culprit");
  }
  if (!failed.empty()) absl::StrAppend(&message, "; also failed: ", absl::StrJoin(failed, "; "));
  ADAPTCOMM_LOG(kError, message);
  if (options_.rank == 0 && recorder_ != nullptr) {
    // Rank 0 says who is behind itself when the others' dumps are reachable (a shared or local
    // dump directory), so nobody has to run `adaptcomm trace culprit` to read the first answer.
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

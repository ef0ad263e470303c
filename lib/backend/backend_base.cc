#include "lib/backend/backend_base.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/backend/op_checks.h"
#include "lib/base/log.h"

namespace adaptcomm {

namespace {

BackendIdentity Labelled(BackendIdentity id) {
  if (id.label.empty()) id.label = id.name;
  return id;
}

}  // namespace

BackendBase::BackendBase(BackendIdentity id) : id_(Labelled(std::move(id))) {}

absl::Status BackendBase::health() const {
  if (!broken_flag_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return broken_;
}

absl::Status BackendBase::Refused(const OpDesc& op) const {
  if (!broken_flag_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return BrokenBackendRefusal(id_.label, op, broken_);
}

absl::Status BackendBase::Fail(absl::Status failure) {
  if (!aborted() && absl::IsInvalidArgument(failure)) return failure;
  return Break(std::move(failure));
}

absl::Status BackendBase::Break(absl::Status failure) {
  if (aborted()) {
    absl::MutexLock lock(&mu_);
    // An op that failed because of Abort() reports the abort, and where it was interrupted.
    if (failure == broken_) return failure;
    return absl::Status(broken_.code(),
                        absl::StrCat(broken_.message(), "; interrupted in ", failure.message()));
  }
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) {
      broken_ = failure;
      broken_flag_.store(true, std::memory_order_release);
      first = true;
    }
  }
  if (first) OnBroken(failure);
  return failure;
}

void BackendBase::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_flag_.load(std::memory_order_relaxed)) return;
    if (broken_.ok()) {
      broken_ = absl::AbortedError(absl::StrCat(
          id_.label,
          " backend aborted: ", reason.ok() ? std::string("no reason given") : reason.ToString()));
      broken_flag_.store(true, std::memory_order_release);
    }
    // After broken_flag_: whoever sees aborted() sees the backend broken (Refused() refuses).
    aborted_flag_.store(true);  // sequentially consistent: see aborted()
  }
  ADAPTCOMM_LOG(kInfo, id_.label, " backend rank ", id_.rank, " aborting: ", reason.ToString());
  Interrupt(reason);
}

}  // namespace adaptcomm

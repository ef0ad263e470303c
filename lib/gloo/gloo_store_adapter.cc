#include "lib/gloo/gloo_store_adapter.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"

namespace adaptcomm::gloo_backend {

std::string RankOfRendezvousKey(const std::string& key) {
  std::string digits = key;
  if (absl::StartsWith(digits, "rank_")) digits = digits.substr(5);
  int rank = -1;
  if (!digits.empty() && absl::SimpleAtoi(digits, &rank) && rank >= 0) {
    return absl::StrCat("rank ", rank);
  }
  return "";
}

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<adaptcomm::Store> store, absl::Duration timeout)
    : store_(std::move(store)), timeout_(timeout) {}

void GlooStoreAdapter::Fail(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = status;
  }
  throw ::gloo::IoException(std::string(status.message()));
}

absl::Status GlooStoreAdapter::first_error() const {
  absl::MutexLock lock(&mu_);
  return first_error_;
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_->Set(key, std::string(data.begin(), data.end()));
  if (!s.ok()) Fail(s);
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_->Get(key, timeout_);
  if (!value.ok()) {
    if (absl::IsDeadlineExceeded(value.status())) {
      std::string who = RankOfRendezvousKey(key);
      Fail(absl::DeadlineExceededError(absl::StrCat(
          "gloo rendezvous: store key '", key, "' not set within ", absl::FormatDuration(timeout_),
          who.empty() ? "" : absl::StrCat(" (", who, " never published its address)"))));
    }
    Fail(value.status());
  }
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds::zero());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  // Gloo passes its context timeout here (zero means none): we never wait unbounded.
  const absl::Duration bound = timeout.count() > 0 ? absl::Milliseconds(timeout.count()) : timeout_;
  absl::Status s = store_->Wait(keys, bound);
  if (s.ok()) return;
  if (!absl::IsDeadlineExceeded(s)) Fail(s);
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    absl::StatusOr<std::string> v = store_->Get(key, absl::ZeroDuration());
    if (v.ok()) continue;
    std::string who = RankOfRendezvousKey(key);
    missing.push_back(who.empty() ? absl::StrCat("key '", key, "'") : who);
  }
  Fail(absl::DeadlineExceededError(
      absl::StrCat("gloo rendezvous timed out after ", absl::FormatDuration(bound), " waiting for ",
                   missing.empty() ? std::string("store keys") : absl::StrJoin(missing, ", "),
                   " (never published its address; ", s.message(), ")")));
}

}  // namespace adaptcomm::gloo_backend

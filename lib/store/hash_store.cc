// In-process store for ranks that run as threads of one process.
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/store.h"

namespace adaptcomm {
namespace {

class HashStore final : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    data_[std::string(key)] = std::string(value);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    std::string k(key);
    auto present = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return data_.count(k) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      if (timeout <= absl::ZeroDuration())
        return absl::NotFoundError(absl::StrCat("store key '", key, "' is not set"));
      return absl::DeadlineExceededError(
          absl::StrCat("store key '", key, "' not set within ", absl::FormatDuration(timeout)));
    }
    return data_[k];
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    absl::MutexLock lock(&mu_);
    std::string& slot = data_[std::string(key)];
    int64_t value = 0;
    if (!slot.empty() && !absl::SimpleAtoi(slot, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("store key '", key, "' holds a non-integer value; cannot add to it"));
    }
    value += delta;
    slot = std::to_string(value);
    return value;
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    // The mutex re-evaluates every waiter's condition on each release: recheck only the keys not
    // yet seen, so N waiters of N keys cost N lookups each, not N per store call.
    size_t seen = 0;
    auto all_present = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      while (seen < keys.size() && data_.count(keys[seen]) != 0) ++seen;
      return seen == keys.size();
    };
    if (mu_.AwaitWithTimeout(absl::Condition(&all_present), timeout)) return absl::OkStatus();
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (data_.count(k) == 0) missing.push_back(k);
    return absl::DeadlineExceededError(absl::StrCat("store keys not set within ",
                                                    absl::FormatDuration(timeout), ": ",
                                                    absl::StrJoin(missing, ", ")));
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    absl::MutexLock lock(&mu_);
    return data_.erase(std::string(key)) > 0;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
};

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return base_->Set(Key(key), value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return base_->Get(Key(key), timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return base_->Add(Key(key), delta);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(Key(k));
    return base_->Wait(full, timeout);
  }
  absl::StatusOr<bool> Delete(const std::string& key) override { return base_->Delete(Key(key)); }
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(Key(k));
    return base_->MultiGet(full, timeout);
  }

 private:
  std::string Key(const std::string& key) const { return absl::StrCat(prefix_, key); }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace

std::shared_ptr<Store> CreateHashStore() { return std::make_shared<HashStore>(); }

std::shared_ptr<Store> CreatePrefixStore(std::string prefix, std::shared_ptr<Store> base) {
  return std::make_shared<PrefixStore>(std::move(prefix), std::move(base));
}

}  // namespace adaptcomm

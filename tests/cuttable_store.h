// A store whose link can be cut: from then on every request fails at once, as a rank cut off from
// the store (or dead) would see it. Thread ranks use it to play a rank that vanished: it can no
// longer vote in a coordinated retry, so the survivors declare it lost (issue #14).
#ifndef ADAPTCOMM_TESTS_CUTTABLE_STORE_H_
#define ADAPTCOMM_TESTS_CUTTABLE_STORE_H_

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "adaptcomm/store.h"

namespace adaptcomm::testing {

class CuttableStore final : public Store {
 public:
  explicit CuttableStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  void Cut() { cut_.store(true); }
  absl::Status Set(const std::string& key, const std::string& value) override {
    if (cut_.load()) return Down();
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    if (cut_.load()) return Down();
    return inner_->Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    if (cut_.load()) return Down();
    return inner_->Add(key, delta);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    if (cut_.load()) return Down();
    return inner_->Wait(keys, timeout);
  }
  absl::StatusOr<bool> Delete(const std::string& key) override {
    if (cut_.load()) return Down();
    return inner_->Delete(key);
  }

 private:
  static absl::Status Down() { return absl::UnavailableError("store link down (test)"); }
  const std::shared_ptr<Store> inner_;
  std::atomic<bool> cut_{false};
};

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_CUTTABLE_STORE_H_

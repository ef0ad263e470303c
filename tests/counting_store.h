// A Store that counts one rank's calls and records which keys it read: for tests that bound the
// store traffic of an algorithm (requests per rank, readers per key).
#ifndef ADAPTCOMM_TESTS_COUNTING_STORE_H_
#define ADAPTCOMM_TESTS_COUNTING_STORE_H_

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/store.h"

namespace adaptcomm::testing {

class CountingStore final : public Store {
 public:
  explicit CountingStore(std::shared_ptr<Store> base) : base_(std::move(base)) {}
  absl::Status Set(const std::string& k, const std::string& v) override {
    Count(&sets_);
    return base_->Set(k, v);
  }
  absl::StatusOr<std::string> Get(const std::string& k, absl::Duration t) override {
    {
      absl::MutexLock lock(&mu_);
      ++gets_;
      read_.insert(k);
    }
    return base_->Get(k, t);
  }
  absl::StatusOr<int64_t> Add(const std::string& k, int64_t d) override {
    Count(&others_);
    return base_->Add(k, d);
  }
  absl::Status Wait(const std::vector<std::string>& k, absl::Duration t) override {
    Count(&others_);
    {
      absl::MutexLock lock(&mu_);
      read_.insert(k.begin(), k.end());
    }
    return base_->Wait(k, t);
  }
  absl::StatusOr<bool> Delete(const std::string& k) override {
    Count(&others_);
    return base_->Delete(k);
  }
  // One request (Redis: one MGET) that reads every key.
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& k,
                                                    absl::Duration t) override {
    {
      absl::MutexLock lock(&mu_);
      ++gets_;
      read_.insert(k.begin(), k.end());
    }
    return base_->MultiGet(k, t);
  }
  int sets() const {
    absl::MutexLock lock(&mu_);
    return sets_;
  }
  int gets() const {
    absl::MutexLock lock(&mu_);
    return gets_;
  }
  int others() const {
    absl::MutexLock lock(&mu_);
    return others_;
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return sets_ + gets_ + others_;
  }
  // Every key this rank read or waited for.
  std::set<std::string> read() const {
    absl::MutexLock lock(&mu_);
    return read_;
  }

 private:
  void Count(int* n) {
    absl::MutexLock lock(&mu_);
    ++*n;
  }
  std::shared_ptr<Store> base_;
  mutable absl::Mutex mu_;
  int sets_ ABSL_GUARDED_BY(mu_) = 0;
  int gets_ ABSL_GUARDED_BY(mu_) = 0;
  int others_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> read_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_COUNTING_STORE_H_

// Presents an adaptcomm::Store as the gloo::rendezvous::Store that connectFullMesh needs (the
// raw-Gloo baseline of bench/collectives_bench.cc; the backend connects its own pairs).
//
// Gloo's store interface has no error returns: failures are thrown as gloo::IoException, and
// gloo's get() must block until the key exists. Every blocking call is bounded by `timeout` (or
// the timeout gloo passes to wait()). The last failure is also kept as a Status so the backend
// can report it precisely (DeadlineExceeded naming the ranks whose keys never appeared) instead
// of parsing exception text.
#ifndef ADAPTCOMM_LIB_GLOO_GLOO_STORE_ADAPTER_H_
#define ADAPTCOMM_LIB_GLOO_GLOO_STORE_ADAPTER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"
#include "gloo/rendezvous/store.h"

namespace adaptcomm::gloo_backend {

class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<adaptcomm::Store> store, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The first failure seen (OK if none). DeadlineExceeded for keys that never appeared.
  absl::Status first_error() const;

 private:
  [[noreturn]] void Fail(absl::Status status);

  std::shared_ptr<adaptcomm::Store> store_;
  absl::Duration timeout_;
  mutable absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

// "rank 2" for a key gloo's rendezvous uses for rank 2's address ("2" or "rank_2"), else "".
std::string RankOfRendezvousKey(const std::string& key);

}  // namespace adaptcomm::gloo_backend

#endif  // ADAPTCOMM_LIB_GLOO_GLOO_STORE_ADAPTER_H_

// The TCP pairs of one Gloo context, connected one by one when an op first needs them, instead
// of Gloo's connectFullMesh (every rank to every other before the first op: n^2/2 connections,
// and every rank reads every other rank's n addresses from the store).
//
// Both ends of a pair know they need it (an algorithm's peer sets are symmetric,
// lib/gloo/gloo_peers.h), so each connects it without asking the other: it creates its end (a
// listening socket, in this Gloo), publishes the end's address under "pair/<self>/<peer>", reads
// "pair/<peer>/<self>" and calls Pair::connect, which makes the end with the larger address the
// one that connects. Store traffic per pair and rank: one set and one get of a key that only the
// peer reads. All pairs an op needs are published before any is waited for, and the pairs this
// rank dials are connected before it waits for those it answers: a rank never waits for a peer
// that is itself waiting, so ranks connecting many pairs at once (an all-to-all) cannot deadlock.
//
// Thread safety: Connect and the accessors are called by the backend's one Run thread;
// SignalAll may be called from any thread at any time.
#ifndef ADAPTCOMM_LIB_GLOO_GLOO_PAIRS_H_
#define ADAPTCOMM_LIB_GLOO_GLOO_PAIRS_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"
#include "gloo/transport/context.h"

namespace adaptcomm::gloo_backend {

class LazyPairs {
 public:
  // `context`: a transport context with no pair yet. `max_connections`: the most pairs this rank
  // keeps (its sockets); Connect refuses to go past it. `context_timeout`: the transport
  // context's timeout between connects (Gloo's default for ops that pass none).
  LazyPairs(std::shared_ptr<::gloo::transport::Context> context, std::shared_ptr<Store> store,
            int max_connections, std::chrono::milliseconds context_timeout);
  LazyPairs(const LazyPairs&) = delete;
  LazyPairs& operator=(const LazyPairs&) = delete;

  // Connects every peer in `peers` that is not connected yet; returns once all are. `what()`
  // names the op for errors. ResourceExhausted, before any traffic, when that would take this
  // rank past max_connections; DeadlineExceeded naming the peer whose address or connection did
  // not come by `deadline`; Aborted after SignalAll; Unavailable for a store or socket failure.
  // Any error but ResourceExhausted leaves pairs half made: the context must not be used again.
  [[nodiscard]] absl::Status Connect(const std::vector<int>& peers, absl::Time deadline,
                                     absl::FunctionRef<std::string()> what);

  bool connected(int peer) const {
    return connected_[static_cast<size_t>(peer)].load(std::memory_order_acquire);
  }
  // Pairs created so far (connected or being connected).
  int open() const { return open_.load(std::memory_order_acquire); }
  int max_connections() const { return max_connections_; }

  // Signals an exception on every pair (waking whatever waits on one, closing the sockets, as
  // Gloo does on a timeout) and makes every later or waiting Connect fail with Aborted(message).
  void SignalAll(const std::string& message);

 private:
  // Creates this rank's end of the pair with `peer` and returns its address.
  absl::StatusOr<std::string> CreateEnd(int peer, absl::Time deadline);
  // The peer's address for the pair, polling so that SignalAll ends the wait.
  absl::StatusOr<std::string> AwaitPeerAddress(int peer, absl::Time deadline,
                                               absl::FunctionRef<std::string()> what);
  absl::Status ConnectEnd(int peer, const std::string& address, absl::Time deadline,
                          absl::Duration bound, absl::FunctionRef<std::string()> what);
  absl::Status AbortedStatus() const;

  const std::shared_ptr<::gloo::transport::Context> context_;
  const std::shared_ptr<Store> store_;
  const int rank_;
  const int max_connections_;
  const std::chrono::milliseconds context_timeout_;
  // Written by the thread that connects (an op's), read also by the issuing thread (the
  // backend's cap check at submission): atomic.
  std::vector<std::atomic<bool>> connected_;
  std::vector<std::string> own_address_;
  std::atomic<int> open_{0};

  // Serializes creating pairs against signalling them (Gloo's pair table has no lock of its own).
  mutable absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::string abort_message_ ABSL_GUARDED_BY(mu_);
};

// The store key under which `rank` publishes its end of the pair with `peer`.
std::string PairKey(int rank, int peer);

}  // namespace adaptcomm::gloo_backend

#endif  // ADAPTCOMM_LIB_GLOO_GLOO_PAIRS_H_

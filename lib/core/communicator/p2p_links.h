// P2PLinks: asynchronous sends and receives outside groups (P2POptions::async).
//
// Each direction between this rank and a peer (this rank sending to it, or receiving from it) is a
// communicator of two ranks of its own, its "link": made the first time this rank uses that
// direction, on the link's own thread (both ranks make it then: the sender with its first send,
// the receiver with its first receive), through the parent's store, with the parent's options and
// seams, rank 0 being the sender. Its worker runs the direction's ops in issue order, beside the
// parent's collectives and every other direction's ops: a send waiting for its receiver holds up
// nothing else, so matching sends and receives complete whatever order the ranks issued them in,
// and a send posted before a collective overlaps with it.
//
// The ops of one direction are matched in issue order (a receive must name the tag of the send it
// meets). An op's Work ends when its link's op does (its bound: the link's timeouts and watchdog);
// it takes no sequence number of the parent's. A link that could not be made, or whose
// communicator broke, fails its ops with that status from then on. Once the ops queued while the
// link was being made have ended, later ones go straight to the link's communicator from the
// issuing thread (the thread's hand-off cost more than a small message).
//
// Thread safety: every method may be called from any thread.
#ifndef ADAPTCOMM_LIB_CORE_COMMUNICATOR_P2P_LINKS_H_
#define ADAPTCOMM_LIB_CORE_COMMUNICATOR_P2P_LINKS_H_

#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/communicator.h"
#include "lib/core/executor/work_impl.h"

namespace adaptcomm::internal {

class P2PLinks {
 public:
  // Makes the link of the direction `from` -> `to` (ranks of the parent): a communicator of two
  // ranks, `from` its rank 0. Called on the link's thread; bounds itself (the init timeout).
  using MakeLink = std::function<absl::StatusOr<std::unique_ptr<Communicator>>(int from, int to)>;

  P2PLinks(int rank, MakeLink make);
  // Abort()s with Cancelled and waits for the links' threads, except those still making their
  // link (they end on their own, within the init timeout).
  ~P2PLinks();
  P2PLinks(const P2PLinks&) = delete;
  P2PLinks& operator=(const P2PLinks&) = delete;

  // Queues `desc` (a send or a receive on host memory, validated against the parent) on its
  // direction's link, making the link first if there is none; returns its Work at once: the
  // link's own once the ops queued while it was made have ended (it carries the link's sequence
  // number), else one the link's thread ends (sequence number 0).
  Work Post(OpDesc desc);
  // Every op queued or running on a link fails with `reason` (each link communicator is
  // aborted), and so does every later one.
  void Abort(const absl::Status& reason);

 private:
  struct Link;
  // The link's thread: makes the link, hands it the ops queued meanwhile, then lets them go
  // straight to it; ends once the link is stopped.
  static void Serve(std::shared_ptr<Link> link, MakeLink make, int from, int to);
  // Fails the link's queued ops and every later one with `reason` (its first failure stays), and
  // aborts its communicator; `stop` (destruction) aborts it only if an op of the queue runs, and
  // ends the link's thread.
  static void FailLink(Link& link, const absl::Status& reason, bool stop);

  const int rank_;
  const MakeLink make_;
  absl::Mutex mu_;
  // By (from, to).
  std::map<std::pair<int, int>, std::shared_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_COMMUNICATOR_P2P_LINKS_H_

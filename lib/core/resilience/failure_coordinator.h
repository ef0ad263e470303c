// FailureCoordinator: turns one rank's failure into a prompt, named failure on every rank.
//
// A rank whose op fails publishes "failure/<rank>" = seq|op|cause to the communicator's store,
// dumps its flight recorder, and wakes every other rank (key "wake/<r>"). A woken rank answers
// ("ack/<rank>" = its own position), dumps, and aborts its pending work with Aborted naming the
// failed rank, instead of waiting out its own timeout. The failing rank waits (bounded by the
// report window) for every other rank's answer: a rank that never answers is dead or stalled,
// and the final error names it as the likely culprit.
#ifndef ADAPTCOMM_LIB_CORE_RESILIENCE_FAILURE_COORDINATOR_H_
#define ADAPTCOMM_LIB_CORE_RESILIENCE_FAILURE_COORDINATOR_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"
#include "lib/core/elastic/membership.h"
#include "lib/core/executor/op_executor.h"
#include "lib/trace/flight_recorder.h"

namespace adaptcomm::internal {

struct FailureCoordinatorOptions {
  int rank = 0;
  int world_size = 1;
  std::string name;                                 // communicator name, for messages
  absl::Duration report_window = absl::Seconds(5);  // how long to wait for peers' reports
  // Coordinated retry (see RecoveryHandler): attempts including the first (1 = off), backoff
  // between attempts, and how long a vote waits for every rank.
  int max_attempts = 1;
  absl::Duration initial_backoff = absl::Seconds(1);
  double backoff_multiplier = 2.0;
  absl::Duration max_backoff = absl::Seconds(30);
  double jitter = 0.2;
  absl::Duration vote_timeout = absl::Seconds(60);
  // How long Stop() waits for the listener to leave its store wait. Past it the listener is
  // abandoned (it touches nothing of the communicator any more), so teardown ends on time
  // whatever the store does: a flooded store, a cut link, a dead rank 0.
  absl::Duration stop_bound = absl::Seconds(2);
  std::vector<absl::StatusCode> retryable = {absl::StatusCode::kUnavailable,
                                             absl::StatusCode::kAborted,
                                             absl::StatusCode::kDeadlineExceeded};
  // Elastic membership (lib/core/elastic/membership.h): with elastic.elastic, a rank that has not
  // voted within elastic.loss_window is lost, and the set of survivors is decided once per
  // generation through the store ("members/<g>": the first rank to claim it writes what it saw).
  ElasticPolicy elastic;
  // The members' ids in rank order; empty: 0 .. world_size-1. A joiner (elastic grow) starts with
  // the admitted world's ids, its own (`rank`) among them.
  std::vector<int> initial_members;
  // Rank 0 at creation (id 0) serves the store: losing the store then means losing rank 0, and the
  // errors say so. False when the launcher (ADAPTCOMM_STORE_EXTERNAL=1) or the caller serves it.
  bool rank0_serves_store = false;
};

// How a retry rebuilds the backend. `wants_degrade` is asked once per vote: this rank's own view
// of "K failures within the window" (its clock). The vote carries every rank's answer and all
// build with their OR, so two clocks that see the window's edge differently cannot split the job
// across two backends. `build` makes generation g (every rank calls it with the same arguments).
struct BackendRebuilder {
  std::function<bool()> wants_degrade;
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(int generation, bool degrade)> build;
  // Elastic: a membership change was agreed; `build` is called next for its new rank and world.
  // A non-OK status ends the recovery with it before anything is rebuilt: this communicator cannot
  // follow the change (it has Split relatives), and a rebuild the peers abandon would only race
  // them to a different error.
  std::function<absl::Status(const MembershipChange&)> apply_membership;
  // Elastic: the new backend of that change is installed (before any op runs on it).
  std::function<void(const MembershipChange&)> installed;
};

// Also the RecoveryHandler: the vote of a coordinated retry runs through the same store keys.
//   vote/<g>/<rank> = "<position>|<degrade 0/1>|<last seq issued>|<op fingerprint>";
//   restart = the smallest position; degrade = any rank's wish; the largest position and last
//   seq issued are what a step's recovery needs (RecoveryPlan).
// Keys are per rank at creation ("id"): a shrink renumbers the ranks but not their keys.
//   members/<g> = "ok|<id>,<id>,..." or "fail|<why>" (elastic: the set that goes on).
// Wake-ups are numbered (wake/<rank>/<n>, n from an Add on wakes/<rank>) so none is lost.
class FailureCoordinator final : public FailureHandler, public RecoveryHandler {
 public:
  // `store` is the communicator's scoped store; `recorder` may be null.
  FailureCoordinator(FailureCoordinatorOptions options, std::shared_ptr<Store> store,
                     trace::FlightRecorder* recorder);
  ~FailureCoordinator() override;

  // Starts listening for other ranks: a failure calls abort(reason); a retry that builds
  // generation g calls join_retry(g).
  void Start(std::function<void(const absl::Status&)> abort, std::function<void(int)> join_retry,
             BackendRebuilder rebuilder);
  // Stops listening: no callback runs after it returns. Bounded by options.stop_bound. Also
  // cancels a vote or failure report in progress (Cancel).
  void Stop();
  // Ends a retry vote, a membership decision or a failure report in progress within ~10 ms (the
  // communicator is aborted or destroyed: waiting out the vote window would hold its teardown).
  void Cancel() { cancelled_.store(true); }

  // Tells every other rank that this rank's communicator fails with `cause` (it publishes its
  // failure and wakes them, as OnOpFailure does) without waiting for their answers: the
  // communicator is aborted because another of its Split family broke here. Once per
  // communicator (with OnOpFailure); nothing after Cancel() or once the store proved unreachable.
  void Announce(const absl::Status& cause);
  absl::Status OnOpFailure(const OpDesc& op, absl::Status status) override;
  absl::StatusOr<RecoveryPlan> Recover(int generation, uint64_t position, uint64_t issued_through,
                                       const std::string& fingerprint, int attempt,
                                       const absl::Status& cause) override;
  int max_attempts() const override { return options_.max_attempts; }
  // Elastic grow: the members' ids in rank order after joiners were admitted.
  void SetMembers(std::vector<int> ids);
  // The ids (ranks at creation) of the current members, in current rank order.
  std::vector<int> Members() const;
  bool Retryable(const absl::Status& status) const override;

 private:
  // What the listener thread shares with the coordinator; it may outlive the coordinator.
  struct Listener;
  static void Listen(std::shared_ptr<Listener> listener);
  absl::Duration Backoff(int attempt) const;
  // The error of a retry vote this rank could not take part in for want of the store.
  absl::Status CutOff(const absl::Status& store_error, const absl::Status& cause);
  // Elastic: the survivors' set for `generation`, decided once through the store. `voted`: the
  // members this rank saw vote (ids). Returns the ids that go on, or the error every rank fails
  // with.
  // `survivor_votes` gets the survivors' votes, in their order, when the decider published them.
  absl::StatusOr<std::vector<int>> DecideMembers(int generation, const std::vector<int>& members,
                                                 absl::Time deadline, const absl::Status& cause,
                                                 std::vector<std::string>* survivor_votes);
  // Recover's steps. CastVote publishes this rank's vote and, if among the first voters, wakes the
  // other members (the store error of the vote, if any). AwaitVotes polls until every member voted
  // (filling `votes`, one per key) or left, or the deadline; it fills `missing` and `departed`
  // (current ranks) and fails if aborted or cut off. VoteFailed
  // is the error of a vote some rank missed (not elastic). ChangeMembership installs the survivors
  // (elastic) and returns the change. WaitBackoff sleeps the backoff of `attempt` unless aborted.
  absl::Status CastVote(int generation, uint64_t position, uint64_t issued_through,
                        const std::string& fingerprint, const std::vector<int>& members,
                        absl::Time deadline);
  absl::Status AwaitVotes(int generation, const std::vector<int>& members,
                          const std::vector<std::string>& keys, bool elastic, absl::Time deadline,
                          const absl::Status& cause, std::vector<int>& missing,
                          std::vector<int>& departed, std::vector<std::string>& votes);
  // Reads every member's vote key (and, for those absent, whether it left): the slow path, taken
  // only when a rank left or the deadline passed. The error of a store that cannot be reached.
  absl::Status ScanVotes(const std::vector<int>& members, const std::vector<std::string>& keys,
                         std::vector<int>& missing, std::vector<int>& departed);
  absl::Status VoteFailed(const std::vector<int>& missing, const std::vector<int>& departed,
                          const absl::Status& cause);
  MembershipChange ChangeMembership(const std::vector<int>& members,
                                    const std::vector<int>& survivors, int generation,
                                    const absl::Status& cause);
  absl::Status WaitBackoff(int attempt, const absl::Status& cause);

  const FailureCoordinatorOptions options_;
  const std::shared_ptr<Store> store_;
  trace::FlightRecorder* const recorder_;
  BackendRebuilder rebuilder_;
  std::atomic<bool> reported_{false};     // only the first failure is coordinated
  std::atomic<bool> vote_failed_{false};  // a retry vote ran out: the missing ranks are known
  // apply_membership refused an agreed change: every survivor read the same vote and fails alike,
  // so the failure is not reported (a report would reach slower survivors before their own
  // answer and end them with a different error).
  std::atomic<bool> change_refused_{false};
  // The store decided that the job cannot go on with this rank (below the minimum world, or this
  // rank was left out): every survivor reads that same decision, so waking them to abort would
  // only replace its reason with "rank N reported a failure".
  std::atomic<bool> decided_by_store_{false};
  std::atomic<bool> store_unreachable_{false};  // a store request failed for want of the store
  std::atomic<bool> cancelled_{false};          // Cancel(): stop voting and reporting
  std::shared_ptr<Listener> listener_;          // null until Start()
  mutable absl::Mutex members_mu_;
  std::vector<int> members_ ABSL_GUARDED_BY(members_mu_);
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_RESILIENCE_FAILURE_COORDINATOR_H_

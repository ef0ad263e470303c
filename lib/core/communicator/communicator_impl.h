// CommunicatorImpl: what a Communicator owns: the rendezvous, the executor (and through it the
// backend), and the resolved options.
#ifndef ADAPTCOMM_LIB_CORE_COMMUNICATOR_COMMUNICATOR_IMPL_H_
#define ADAPTCOMM_LIB_CORE_COMMUNICATOR_COMMUNICATOR_IMPL_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/profile.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/core/communicator/observability.h"
#include "lib/core/communicator/p2p_links.h"
#include "lib/core/communicator/slowness_monitor.h"
#include "lib/core/elastic/elastic_grow.h"
#include "lib/core/elastic/membership.h"
#include "lib/core/executor/op_executor.h"
#include "lib/core/resilience/communicator_family.h"
#include "lib/core/resilience/failure_coordinator.h"
#include "lib/core/selection/rendezvous.h"
#include "lib/core/tuning/online_tuner.h"
#include "lib/trace/flight_recorder.h"
#include "lib/trace/timeline_writer.h"

namespace adaptcomm::internal {

// A process admitted into a running communicator (elastic grow): where it starts.
struct JoinedAs {
  int id = 0;  // its id among the members (votes, wake-ups)
  int generation = 0;
  uint64_t first_seq = 1;
  std::vector<int> ids;         // every member's id, in rank order
  int64_t tickets_handled = 0;  // the last joiner ticket screened when it was admitted
};

class CommunicatorImpl {
 public:
  // Builds the executor (with its flight recorder and, when there is a store, the failure
  // coordinator) around `backend` and starts it. `deps`: the seams `backend` was selected with,
  // which rebuilds and the device mixed-precision path use too.
  CommunicatorImpl(CommunicatorOptions options, EffectiveConfig config, Rendezvous rendezvous,
                   std::unique_ptr<Backend> backend, std::string selection_reason,
                   CommunicatorDeps deps, std::optional<JoinedAs> joined = std::nullopt);
  ~CommunicatorImpl();

  // Sets desc.timeout to `timeout`, or when unset to the default (collective, or long-operation
  // inside a LongOperationScope); validates `desc` (generic rules: a timeout that is not positive
  // is refused; then the backend's), queues it (or adds it to the open group).
  Work Submit(OpDesc&& desc, std::optional<absl::Duration> timeout);
  // Communicator::Send / Recv: P2POptions::async ops outside groups and steps go to their
  // direction's link (P2PLinks); the others to Submit (communicator_p2p.cc).
  Work SubmitPointToPoint(OpDesc&& desc, const P2POptions& options);
  // Communicator::GroupStart / GroupEnd (communicator_groups.cc).
  absl::Status GroupStart();
  absl::Status GroupEnd();
  // FailedPrecondition naming `what` while a group is open (steps do not start or end in one).
  absl::Status NoOpenGroup(const char* what) const;

  const CommunicatorOptions& options() const { return options_; }
  OpExecutor& executor() { return *executor_; }
  const OpExecutor& executor() const { return *executor_; }
  const std::string& selection_reason() const { return selection_reason_; }
  trace::FlightRecorder& recorder() { return *recorder_; }
  // Null when the profile turns metrics off (metrics.enabled).
  trace::CommMetrics* metrics() const { return metrics_.get(); }
  const EffectiveConfig& config() const { return config_; }
  // Null when the profile does not ask for online tuning (tuning.online.enabled).
  const OnlineTuner* online_tuner() const { return online_tuner_.get(); }
  // The CUDA runtime of this communicator (CommunicatorCudaApi).
  absl::StatusOr<std::shared_ptr<cuda::CudaApi>> cuda_api() const;
  // A coordinated retry's new backend: the same selection as at creation, on a store scope of
  // its own generation.
  // This rank's view of the degrade rule, counting one more retry (see BackendRebuilder).
  bool WantsDegrade();
  absl::StatusOr<std::unique_ptr<Backend>> RebuildBackend(int generation, bool degrade);
  // The backend of `generation` for `rank` of `world` (a rebuild, or a grow before it is applied).
  absl::StatusOr<std::unique_ptr<Backend>> BuildBackendFor(int generation, int rank, int world,
                                                           bool degrade,
                                                           std::vector<int> shrink_lost = {});
  // Communicator::AdmitJoiners (lib/core/elastic/elastic_grow.h).
  absl::Status AdmitJoiners();
  // Rank 0: who holds each rank at creation that one of `joiners` claims, among the members
  // (`member_ids`, in rank order; `claims`: the ranks that the members who joined claimed), for
  // CheckRankClaims.
  std::map<int, std::string> HeldRanks(const std::vector<int>& member_ids,
                                       const std::vector<ScreenedJoiner>& joiners,
                                       const JoinerClaims& claims) const;
  // Elastic: the agreed change (the next rebuild is for its rank and world), and its installation
  // (the trainer's callback).
  void ApplyMembership(const MembershipChange& change);
  void MembershipInstalled(const MembershipChange& change);
  Membership membership() const;
  // The job's store (the one every communicator of the job rendezvouses through), and this
  // communicator's own scope of it.
  const std::shared_ptr<Store>& root_store() const { return rendezvous_.root_store; }
  const std::shared_ptr<Store>& scoped_store() const { return rendezvous_.store; }
  // The seams this communicator was built with (a child of Split is built with them too).
  const CommunicatorDeps& deps() const { return deps_; }
  // Its place among the communicators split from one root
  // (lib/core/resilience/communicator_family.h).
  FamilyMember& family_member() { return *family_member_; }
  // Communicator::Split calls so far (numbers each split's keys and default child names).
  int NextSplit() { return splits_.fetch_add(1) + 1; }
  // Which ops are protected, how and up to what size (a line of Communicator::Explain()).
  std::string ProtectionText() const;
  // Communicator::Abort: cancels a retry vote or failure report in progress, then aborts.
  void Abort(const absl::Status& reason);
  void EnterLongOperation() { long_operation_scopes_.fetch_add(1); }
  void LeaveLongOperation() { long_operation_scopes_.fetch_sub(1); }

 private:
  // The constructor's steps, in its order: the membership at creation (or admission), then what
  // runs beside the executor, each where its setting turns it on (metrics, the timeline trace,
  // the failure coordinator with its optional collective check, the heartbeat watch, the status
  // record, the slowness monitor, the coordinator's listener).
  void InitMembership(const std::optional<JoinedAs>& joined);
  void StartMetrics();
  void StartTimeline();
  void StartCoordinator(FailureCoordinatorOptions fc, const std::optional<JoinedAs>& joined);
  void WatchHeartbeat();
  void StartStatusRecord();
  void StartSlownessMonitor();
  void StartFailureListener();
  // AdmitJoiners' steps. AnnounceJoiners: rank 0 screens the joiners waiting (into `joiners`)
  // and broadcasts the ticket admitted now (0: none), which it returns on every rank.
  // DecideGrowth: rank 0 decides the grown world and publishes it, the others read it; a failure
  // aborts the communicator.
  absl::StatusOr<int64_t> AnnounceJoiners(int rank, std::vector<ScreenedJoiner>& joiners);
  absl::StatusOr<GrowDecision> DecideGrowth(int64_t announce,
                                            const std::vector<ScreenedJoiner>& joiners,
                                            const OpExecutor::MembershipSnapshot& now);

  // The open group's ops, not queued yet, and the first refusal among them (every op fails with
  // it at GroupEnd). Adds `desc` to the open group and returns its Work; nothing when none is
  // open.
  struct OpenGroup {
    std::vector<std::shared_ptr<WorkImpl>> works;
    absl::Status refused;
    int epoch = -1;
  };
  std::optional<Work> AddToGroup(OpDesc& desc, const absl::Status& valid, int epoch);
  // `timeout`, or the default: the long-operation timeout inside a LongOperationScope, else the
  // collective one.
  absl::Duration TimeoutOr(std::optional<absl::Duration> timeout) const;
  // Makes P2PLinks' links: communicators of two ranks with this one's options and seams.
  std::unique_ptr<P2PLinks> MakeLinks() const;
  // Fails the ops of a group still open (the communicator goes).
  void DropOpenGroup();

  const CommunicatorOptions options_;  // as created (rank, world_size: at creation)
  // Read on every op without a lock: whether a group is open (group_ holds it).
  std::atomic<bool> group_open_{false};
  mutable absl::Mutex group_mu_;
  std::optional<OpenGroup> group_ ABSL_GUARDED_BY(group_mu_);
  const EffectiveConfig config_;
  const CommunicatorDeps deps_;
  std::atomic<int> long_operation_scopes_{0};
  std::atomic<int> splits_{0};
  int heartbeat_id_ = 0;
  std::deque<absl::Time> recoveries_;  // times of coordinated retries (rebuilds), for degrade
  ElasticPolicy elastic_;
  int id_ = 0;  // this rank's id among the members: its rank at creation, or given at admission
  // AdmitJoiners, kept by every member so that any of them can be rank 0 next: the last joiner
  // ticket screened (rank 0's broadcast), and the next id to give (past every decision's ids).
  int64_t joiners_handled_ = 0;
  int next_id_ = 0;
  // The membership after the last agreed change (rank and world: what the next rebuild builds).
  mutable absl::Mutex membership_mu_;
  Membership membership_ ABSL_GUARDED_BY(membership_mu_);
  // The ranks a shrink just lost (previous numbering), for the rebuild that follows it (NCCL's
  // ncclCommShrink); taken by RebuildBackend.
  std::vector<int> shrink_lost_ ABSL_GUARDED_BY(membership_mu_);
  Rendezvous rendezvous_;
  std::shared_ptr<trace::FlightRecorder> recorder_;
  std::shared_ptr<trace::TimelineWriter> timeline_;  // null unless tracing is on
  std::shared_ptr<FailureCoordinator> coordinator_;  // null without a store
  std::shared_ptr<OpExecutor> executor_;
  std::shared_ptr<FamilyMember> family_member_;
  std::shared_ptr<OnlineTuner> online_tuner_;  // also an observer of executor_
  // Also an observer of executor_; null when metrics.enabled is false.
  std::shared_ptr<trace::CommMetrics> metrics_;
  std::unique_ptr<trace::MetricsExportHandle> metrics_export_;
  std::unique_ptr<StatusPublisher> status_;  // null without a store or status.enabled
  // Null without a store or metrics, or with monitor.enabled false.
  std::unique_ptr<SlownessMonitor> monitor_;
  // The links of asynchronous sends and receives (made when the first is posted).
  std::unique_ptr<P2PLinks> links_;
  const std::string selection_reason_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_COMMUNICATOR_COMMUNICATOR_IMPL_H_

#include "adaptcomm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "adaptcomm/status.h"
#include "lib/base/build_info.h"
#include "lib/base/byte_text.h"
#include "lib/base/log.h"
#include "lib/core/communicator/communicator_impl.h"
#include "lib/core/communicator/part_options.h"
#include "lib/core/elastic/elastic_grow.h"
#include "lib/core/executor/collective_check.h"
#include "lib/core/executor/validate.h"
#include "lib/core/resilience/heartbeat.h"

namespace adaptcomm {
namespace internal {

CommunicatorImpl::CommunicatorImpl(CommunicatorOptions options, EffectiveConfig config,
                                   Rendezvous rendezvous, std::unique_ptr<Backend> backend,
                                   std::string selection_reason, CommunicatorDeps deps,
                                   std::optional<JoinedAs> joined)
    : options_(std::move(options)),
      config_(std::move(config)),
      deps_(std::move(deps)),
      rendezvous_(std::move(rendezvous)),
      selection_reason_(std::move(selection_reason)) {
  // Every setting below is read from config_, the effective configuration Explain() prints.
  PartOptions parts = PartOptionsFor(config_);
  elastic_ = parts.elastic;
  InitMembership(joined);
  trace::FlightRecorderOptions& fr = parts.recorder;
  fr.rank = *options_.rank;
  fr.world_size = *options_.world_size;
  fr.communicator = options_.name;
  fr.job = rendezvous_.job_id;
  fr.backend = backend->name();
  recorder_ = std::make_shared<trace::FlightRecorder>(std::move(fr));
  ExecutorOptions& exec = parts.executor;
  if (joined.has_value()) {
    exec.initial_generation = joined->generation;
    exec.first_seq = joined->first_seq;
  }
  executor_ = std::make_shared<OpExecutor>(std::move(backend), exec);
  executor_->AddObserver(recorder_);
  if (config_.metrics.enabled) StartMetrics();
  // The timeline's rendezvous is the creators' only.
  if (config_.trace.enabled && !joined.has_value()) StartTimeline();
  if (rendezvous_.store != nullptr) StartCoordinator(std::move(parts.coordinator), joined);
  online_tuner_ =
      StartOnlineTuner(options_, config_, elastic_.elastic, rendezvous_.store, executor_);
  // A root of a family of its own until Split makes it a child of another communicator's.
  family_member_ = std::make_shared<FamilyMember>(options_.name, executor_, coordinator_);
  family_member_->JoinFamily(std::make_shared<CommunicatorFamily>(), "");
  executor_->SetBreakHook(
      [member = std::weak_ptr<FamilyMember>(family_member_)](const absl::Status& cause) {
        if (std::shared_ptr<FamilyMember> m = member.lock()) m->Broke(cause);
      });
  WatchHeartbeat();
  executor_->Start();
  if (config_.status.enabled && rendezvous_.root_store != nullptr) StartStatusRecord();
  if (metrics_ != nullptr && metrics_->slow_sampler() != nullptr) StartSlownessMonitor();
  if (coordinator_ != nullptr) StartFailureListener();
  links_ = MakeLinks();
}

void CommunicatorImpl::InitMembership(const std::optional<JoinedAs>& joined) {
  id_ = joined.has_value() ? joined->id : *options_.rank;
  next_id_ = *options_.world_size;
  // A joiner's world size is the admitted one: the ids given so far go up to its own.
  if (joined.has_value()) {
    for (int id : joined->ids) next_id_ = std::max(next_id_, id + 1);
    joiners_handled_ = joined->tickets_handled;
  }
  absl::MutexLock lock(&membership_mu_);
  membership_.rank = *options_.rank;
  membership_.world_size = *options_.world_size;
  if (joined.has_value()) {
    membership_.initial_ranks = joined->ids;
    membership_.joined = true;
    membership_.joined_ranks = {*options_.rank};
    membership_.reason =
        absl::StrCat("joined as rank ", *options_.rank, " of ", *options_.world_size,
                     " at generation ", joined->generation, " (id ", joined->id, ")");
  } else {
    for (int r = 0; r < *options_.world_size; ++r) membership_.initial_ranks.push_back(r);
  }
}

void CommunicatorImpl::StartMetrics() {
  trace::CommMetricsOptions mo;
  mo.comm_name = options_.name;
  mo.rank = *options_.rank;
  mo.nranks = *options_.world_size;
  mo.backend = executor_->backend().name();
  mo.slow_samples = config_.monitor.enabled && rendezvous_.store != nullptr;
  metrics_ = std::make_shared<trace::CommMetrics>(std::move(mo));
  executor_->AddObserver(metrics_);
  std::weak_ptr<OpExecutor> executor = executor_;
  metrics_->SetUnprotectedOpsSource([executor]() -> uint64_t {
    auto e = executor.lock();
    return e != nullptr ? e->unprotected_ops() : 0;
  });
  trace::RegisterMetrics(metrics_);
  metrics_export_ = StartMetricsExportFor(config_.metrics, *options_.rank, *options_.world_size);
}

void CommunicatorImpl::StartTimeline() {
  trace::TimelineOptions to;
  to.rank = *options_.rank;
  to.world_size = *options_.world_size;
  to.dir = config_.trace.dir;
  to.communicator = options_.name;
  to.backend = executor_->backend().name();
  auto timeline = trace::StartTimeline(rendezvous_.store.get(), std::move(to),
                                       std::min(config_.timeouts.store_connect, absl::Seconds(30)));
  if (timeline.ok()) {
    timeline_ = *std::move(timeline);
    executor_->AddObserver(timeline_);
  } else {
    ADAPTCOMM_LOG(kWarning, "timeline trace off: ", timeline.status().ToString());
  }
}

void CommunicatorImpl::StartCoordinator(FailureCoordinatorOptions fc,
                                        const std::optional<JoinedAs>& joined) {
  fc.rank = id_;
  fc.world_size = *options_.world_size;
  if (joined.has_value()) fc.initial_members = joined->ids;
  fc.name = options_.name;
  fc.rank0_serves_store = rendezvous_.store_server == StoreServer::kRankZero;
  coordinator_ = std::make_shared<FailureCoordinator>(fc, rendezvous_.store, recorder_.get());
  executor_->SetFailureHandler(coordinator_);
  if (config_.debug.check_collectives && !joined.has_value()) {
    auto check = std::make_shared<CollectiveCheck>(rendezvous_.store, *options_.rank,
                                                   *options_.world_size, options_.name);
    executor_->SetPreRunCheck([check](const OpDesc& op, const std::string& fingerprint) {
      return check->Check(op, fingerprint);
    });
  }
  if (metrics_ != nullptr) {
    executor_->SetRecoveryHandler(
        std::make_shared<CountingRecoveryHandler>(coordinator_, metrics_));
  } else {
    executor_->SetRecoveryHandler(coordinator_);
  }
}

void CommunicatorImpl::WatchHeartbeat() {
  HeartbeatMonitor::Watch watch;
  watch.name = absl::StrCat("communicator '", options_.name, "' rank ", *options_.rank);
  watch.timeout = config_.timeouts.heartbeat;
  watch.on_dump = [recorder = recorder_](const std::string& why) { (void)recorder->Dump(why); };
  watch.on_stall = [recorder = recorder_](const std::string& why) {
    // Nothing bounds this communicator's operations any more: end the process, loudly, with the
    // communication-failure exit code, after writing what there is to know.
    ADAPTCOMM_LOG(kError, why, "; dumping the flight record and exiting with code ",
                  kExitCommunicationFailure);
    (void)recorder->Dump(why);
    log::Flush();
    std::_Exit(kExitCommunicationFailure);
  };
  heartbeat_id_ = HeartbeatMonitor::Instance().Register(std::move(watch));
  executor_->SetHeartbeat([id = heartbeat_id_] { HeartbeatMonitor::Instance().Beat(id); });
}

void CommunicatorImpl::StartStatusRecord() {
  std::weak_ptr<OpExecutor> executor = executor_;
  StatusSources sources;
  sources.comm = options_.name;
  sources.recorder = recorder_;
  sources.metrics = metrics_;
  sources.rank = [executor, rank = *options_.rank] {
    auto e = executor.lock();
    return e != nullptr ? e->membership().rank : rank;
  };
  sources.world_size = [executor, world = *options_.world_size] {
    auto e = executor.lock();
    return e != nullptr ? e->membership().world_size : world;
  };
  sources.health = [executor] {
    auto e = executor.lock();
    return e != nullptr ? e->health() : absl::CancelledError("communicator destroyed");
  };
  status_ = std::make_unique<StatusPublisher>(rendezvous_.root_store, std::move(sources),
                                              config_.status.interval);
}

void CommunicatorImpl::StartSlownessMonitor() {
  SlownessMonitorOptions mo;
  mo.comm = options_.name;
  mo.settings = config_.monitor;
  mo.metrics = metrics_;
  mo.recorder = recorder_;
  mo.membership = [executor = std::weak_ptr<OpExecutor>(executor_), rank = *options_.rank] {
    auto e = executor.lock();
    return e != nullptr ? e->membership() : OpExecutor::MembershipSnapshot{0, rank, 1, 0};
  };
  mo.on_slow_rank = options_.on_slow_rank;
  monitor_ = std::make_unique<SlownessMonitor>(rendezvous_.store, std::move(mo));
}

void CommunicatorImpl::StartFailureListener() {
  std::weak_ptr<OpExecutor> executor = executor_;
  coordinator_->Start(
      [executor](const absl::Status& s) {
        if (auto e = executor.lock()) e->Abort(s);
      },
      [executor](int generation) {
        if (auto e = executor.lock()) e->RequestRecovery(generation);
      },
      BackendRebuilder{
          [this] { return WantsDegrade(); },
          [this](int generation, bool degrade) { return RebuildBackend(generation, degrade); },
          [this](const MembershipChange& change) {
            ApplyMembership(change);
            // Before the rebuild: every survivor with Split relatives stops here alike, where a
            // rebuild would race the peers that stopped to a different error.
            return family_member_->Changed(change.reason);
          },
          [this](const MembershipChange& change) { MembershipInstalled(change); }});
}

CommunicatorImpl::~CommunicatorImpl() {
  // Before anything is aborted: a communicator going away is not one that broke.
  family_member_->LeaveFamily();
  DropOpenGroup();
  links_.reset();  // while the store is there: idle links leave as communicators do
  HeartbeatMonitor::Instance().Unregister(heartbeat_id_);
  monitor_.reset();  // no callback once the communicator goes
  status_.reset();   // its last record says the rank left, while the store is still there
  // The store parts of teardown end within the abort bound whatever the store does (a flooded
  // store or a cut link must not keep the process alive after main returns, issue #11).
  const absl::Time deadline = absl::Now() + config_.timeouts.abort;
  if (coordinator_ != nullptr) coordinator_->Stop();
  executor_->Shutdown();
  if (timeline_ != nullptr) timeline_->Close().IgnoreError();  // the footer: a valid JSON file
  CommunicatorOptions leaving = options_;
  leaving.rank = id_;  // its keys ("left/<id>") are what the others look up
  leaving.world_size = executor_->membership().world_size;  // the lost ranks never leave
  LeaveRendezvous(std::move(rendezvous_), leaving, executor_->backend().health().ok(),
                  std::max(deadline - absl::Now(), absl::ZeroDuration()));
}

absl::StatusOr<std::shared_ptr<cuda::CudaApi>> CommunicatorImpl::cuda_api() const {
  if (!deps_.use_given_apis) return cuda::LoadCudaApi();  // one runtime per process
  if (deps_.cuda == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("communicator '", options_.name, "' was built without a CUDA runtime"));
  }
  return deps_.cuda;
}

std::string CommunicatorImpl::ProtectionText() const {
  const RetryPolicy& r = config_.retry;
  if (coordinator_ == nullptr || r.max_attempts < 2) {
    return "protection: off (no coordinated retry: a failed op or step breaks the communicator)";
  }
  const ReplayMode replay = r.replay;
  const bool copies = replay == ReplayMode::kCopy || elastic_.elastic;
  const uint64_t device_op_limit = r.record_bytes / (2 * static_cast<uint64_t>(r.in_flight));
  const uint64_t unprotected = executor_->unprotected_ops();
  return absl::StrCat(
      "protection: steps (BeginStep/CommitStep): a failed step is redone on every rank, no copies; "
      "outside a step (retry.replay ",
      ReplayModeName(replay), elastic_.elastic && replay != ReplayMode::kCopy ? ", elastic" : "",
      "): ",
      copies ? absl::StrCat("every op's input is copied first and any op is re-run alone (host "
                            "ops of any size; device ops into one slab of retry.record_bytes (",
                            ByteSizeText(r.record_bytes),
                            ") per device, allocated once: always up to ",
                            ByteSizeText(device_op_limit),
                            " each, retry.record_bytes / (2 x retry.in_flight), larger ones "
                            "while the records in flight leave room, else not protected)")
             : "ops with stable_input and barriers are re-run alone; other ops are not "
               "protected (a fault fails them and the communicator)",
      "; ", unprotected, " op(s) outside a step ran unprotected so far");
}

Work CommunicatorImpl::Submit(OpDesc&& desc, std::optional<absl::Duration> timeout) {
  desc.timeout = TimeoutOr(timeout);
  const OpExecutor::MembershipSnapshot members = executor_->membership();
  absl::Status valid = ValidateOp(desc, members.rank, members.world_size);
  if (valid.ok() && desc.wire.has_value() && !executor_->backend().capabilities().wire_cast) {
    valid = absl::InvalidArgumentError(
        absl::StrCat(OpKindName(desc.kind), ": backend ", executor_->backend().name(),
                     " cannot send f32 data as ", DTypeName(*desc.wire), " (no wire_cast)"));
  }
  if (valid.ok()) valid = executor_->backend().Supports(desc);
  if (group_open_.load(std::memory_order_acquire)) {
    if (valid.ok() && online_tuner_ != nullptr) online_tuner_->Assign(desc);
    if (std::optional<Work> grouped = AddToGroup(desc, valid, members.epoch)) {
      return *std::move(grouped);
    }
  }
  if (!valid.ok()) {
    // In a step its peers run the op this rank refused: the step cannot commit.
    executor_->FailStep(valid);
    return Work(WorkImpl::Failed(std::move(desc), std::move(valid)));
  }
  if (online_tuner_ != nullptr) online_tuner_->Assign(desc);  // this op's knob values
  return Work(executor_->Submit(std::move(desc), members.epoch));
}

void CommunicatorImpl::ApplyMembership(const MembershipChange& change) {
  if (metrics_ != nullptr) metrics_->AddMembershipChange();
  absl::MutexLock lock(&membership_mu_);
  std::vector<int> initial(change.new_world, -1);
  for (int r = 0; r < change.old_world; ++r) {
    if (change.old_to_new[r] >= 0) initial[change.old_to_new[r]] = membership_.initial_ranks[r];
  }
  membership_.joined_ranks.clear();
  for (size_t i = 0; i < change.joined_ids.size(); ++i) {
    const int rank =
        change.new_world - static_cast<int>(change.joined_ids.size()) + static_cast<int>(i);
    initial[rank] = change.joined_ids[i];
    membership_.joined_ranks.push_back(rank);
  }
  membership_.initial_ranks = std::move(initial);
  membership_.rank = change.new_rank;
  membership_.world_size = change.new_world;
  membership_.lost_ranks = change.lost;
  if (change.joined_ids.empty()) shrink_lost_ = change.lost;
  membership_.reason = change.reason;
  ++membership_.changes;
}

void CommunicatorImpl::MembershipInstalled(const MembershipChange& change) {
  ADAPTCOMM_LOG(kWarning, "communicator '", options_.name, "' goes on as rank ", change.new_rank,
                " of ", change.new_world, " (", change.reason, ")");
  if (options_.elastic.on_change) options_.elastic.on_change(membership());
}

std::map<int, std::string> CommunicatorImpl::HeldRanks(const std::vector<int>& member_ids,
                                                       const std::vector<ScreenedJoiner>& joiners,
                                                       const JoinerClaims& claims) const {
  std::map<int, std::string> held;
  for (size_t r = 0; r < member_ids.size(); ++r) {
    const int id = member_ids[r];
    auto joined = claims.find(id);
    const int rank_at_creation = joined == claims.end() ? id : joined->second.first;
    // Only the ranks a joiner claims are named: a member's name is one store request.
    if (std::none_of(joiners.begin(), joiners.end(),
                     [&](const ScreenedJoiner& j) { return j.claimed_rank == rank_at_creation; })) {
      continue;
    }
    const std::string who =
        joined != claims.end()
            ? joined->second.second
            : rendezvous_.store->Get(absl::StrCat("join/", id), absl::ZeroDuration())
                  .value_or("a process that did not say who it is");
    held[rank_at_creation] = absl::StrCat(who, " (a member, rank ", r, " now, id ", id, ")");
  }
  return held;
}

absl::StatusOr<int64_t> CommunicatorImpl::AnnounceJoiners(int rank,
                                                          std::vector<ScreenedJoiner>& joiners) {
  // Rank 0 alone looks in the store (one request); the others learn the outcome from a broadcast
  // they would have to wait for anyway: no per-op or per-rank store traffic while nobody waits.
  // It carries the last ticket admitted now (0: none) and the last one screened: every member
  // knows where screening stands, so a successor of a lost rank 0 neither screens a ticket twice
  // nor skips one.
  int64_t announced[2] = {0, joiners_handled_};
  if (rank == 0) {
    absl::StatusOr<ScreenedJoiners> screened = ScreenJoiners(
        *rendezvous_.store, joiners_handled_, config_, BuildVersion(), ElasticLimits(elastic_));
    if (!screened.ok()) {
      ADAPTCOMM_LOG(kWarning, "communicator '", options_.name,
                    "': cannot look for joiners: ", screened.status().ToString());
    } else {
      announced[1] = screened->count;
      joiners = std::move(screened->accepted);
      if (!joiners.empty()) announced[0] = screened->count;
    }
  }
  OpDesc bcast;
  bcast.kind = OpKind::kBroadcast;
  bcast.input = bcast.output = HostView(announced, 2);
  bcast.root = 0;
  const absl::Duration bound = bcast.timeout;  // OpDesc's own, not the collective default
  if (absl::Status s = Submit(std::move(bcast), bound).Wait(); !s.ok()) return s;
  joiners_handled_ = announced[1];
  return announced[0];
}

absl::StatusOr<GrowDecision> CommunicatorImpl::DecideGrowth(
    int64_t announce, const std::vector<ScreenedJoiner>& joiners,
    const OpExecutor::MembershipSnapshot& now) {
  Store& store = *rendezvous_.store;
  GrowDecision decision;
  if (now.rank != 0) {
    absl::StatusOr<GrowDecision> read =
        ReadGrowDecision(store, announce, absl::Now() + config_.timeouts.init);
    if (!read.ok()) {
      absl::Status s = absl::Status(
          read.status().code(),
          absl::StrCat("AdmitJoiners: rank 0's decision never came: ", read.status().message()));
      Abort(s);
      return s;
    }
    return read;
  }
  // Decided after the broadcast: a shrink during it is part of the world the joiners join, and
  // a rank it lost may be claimed by a replacement.
  decision.generation = now.generation + 1;
  decision.first_seq = executor_->next_seq();
  decision.ids = coordinator_->Members();
  absl::StatusOr<JoinerClaims> joined = ReadJoinerClaims(store);
  if (!joined.ok()) {
    Abort(joined.status());
    return joined.status();
  }
  RankClaims claims =
      CheckRankClaims(joiners, HeldRanks(decision.ids, joiners, *joined), options_.name);
  RefuseJoiners(store, claims.refused);
  std::vector<int64_t> tickets;
  for (const ScreenedJoiner& j : claims.admitted) {
    (*joined)[next_id_] = {j.claimed_rank, j.who};
    decision.ids.push_back(next_id_++);
    tickets.push_back(j.ticket);
  }
  if (absl::Status s = PublishAdmission(store, announce, decision.generation, decision.first_seq,
                                        decision.ids, tickets, now.world_size, *joined);
      !s.ok()) {
    Abort(s);
    return s;
  }
  return decision;
}

namespace {

// The change a grow decision makes to the world `now`: the members keep their ranks, the joiners
// come after them.
MembershipChange GrowthChange(const OpExecutor::MembershipSnapshot& now,
                              const GrowDecision& decision) {
  MembershipChange change;
  change.old_world = now.world_size;
  change.new_rank = now.rank;
  change.new_world = static_cast<int>(decision.ids.size());
  for (int r = 0; r < now.world_size; ++r) change.old_to_new.push_back(r);
  change.joined_ids.assign(decision.ids.begin() + now.world_size, decision.ids.end());
  std::vector<std::string> joined;
  for (int r = now.world_size; r < change.new_world; ++r) {
    joined.push_back(absl::StrCat(r, " (id ", decision.ids[r], ")"));
  }
  change.reason =
      absl::StrCat("rank(s) ", absl::StrJoin(joined, ", "), " joined; world ", change.old_world,
                   " -> ", change.new_world, " at generation ", decision.generation);
  return change;
}

}  // namespace

absl::Status CommunicatorImpl::AdmitJoiners() {
  if (absl::Status s = NoOpenGroup("AdmitJoiners"); !s.ok()) return s;
  if (!elastic_.elastic || coordinator_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "AdmitJoiners on communicator '", options_.name,
        "': admitting joiners needs elastic.on_loss shrink or wait_for_replacement and a store"));
  }
  std::vector<ScreenedJoiner> joiners;
  absl::StatusOr<int64_t> announce = AnnounceJoiners(executor_->membership().rank, joiners);
  if (!announce.ok()) return announce.status();
  if (*announce == 0) return absl::OkStatus();

  const OpExecutor::MembershipSnapshot now = executor_->membership();
  absl::StatusOr<GrowDecision> decided = DecideGrowth(*announce, joiners, now);
  if (!decided.ok()) return decided.status();
  const GrowDecision& decision = *decided;
  // Every member: whoever is rank 0 at the next admission gives fresh ids.
  for (int id : decision.ids) next_id_ = std::max(next_id_, id + 1);
  // Every joiner was refused (CheckRankClaims): nothing changes.
  if (static_cast<int>(decision.ids.size()) == now.world_size) return absl::OkStatus();
  const MembershipChange change = GrowthChange(now, decision);
  absl::Status grown = executor_->Reconfigure([&]() -> absl::StatusOr<RecoveryPlan> {
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        BuildBackendFor(decision.generation, change.new_rank, change.new_world, false);
    if (!backend.ok()) return backend.status();
    ApplyMembership(change);
    coordinator_->SetMembers(decision.ids);
    recorder_->SetGeneration(decision.generation, (*backend)->name());
    if (metrics_ != nullptr) metrics_->SetBackend((*backend)->name(), change.new_world);
    RecoveryPlan plan;
    plan.generation = decision.generation;
    plan.backend = *std::move(backend);
    plan.change = change;
    plan.on_installed = [this, &change] {
      // Joiners rendezvous with the new backend, so the family fails only once it is built.
      (void)family_member_->Changed(change.reason);
      MembershipInstalled(change);
    };
    return plan;
  });
  if (!grown.ok()) {
    // The members may disagree on whether the new backend exists (a joiner died during its
    // rendezvous): nothing safe is left to run on.
    absl::Status s =
        absl::Status(grown.code(), absl::StrCat("admitting joiners failed (", change.reason,
                                                "): ", grown.message(), "; communicator '",
                                                options_.name, "' is unusable"));
    if (!absl::IsFailedPrecondition(grown)) Abort(s);
    return s;
  }
  // The change failed its Split family, this communicator included (communicator_family.h).
  if (executor_->Aborted()) return executor_->health();
  return adaptcomm::MembershipChangedError(
      change.new_world, absl::StrCat(change.reason,
                                     "; send the joiners the state they need (e.g. a "
                                     "broadcast from rank 0), then go on"));
}

void CommunicatorImpl::Abort(const absl::Status& reason) {
  if (coordinator_ != nullptr) coordinator_->Cancel();  // a vote in progress ends too
  links_->Abort(reason);
  executor_->Abort(reason);
}

Membership CommunicatorImpl::membership() const {
  Membership m;
  {
    absl::MutexLock lock(&membership_mu_);
    m = membership_;
  }
  m.generation = executor_->generation();
  return m;
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    const CommunicatorOptions& options) {
  return internal::CreateCommunicatorWith(options, internal::CommunicatorDeps{});
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::CreateWithBackend(
    std::unique_ptr<Backend> backend, const CommunicatorOptions& options) {
  return internal::CreateCommunicatorWithBackend(std::move(backend), options,
                                                 internal::CommunicatorDeps{});
}

Communicator::Communicator(std::unique_ptr<internal::CommunicatorImpl> impl)
    : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->executor().membership().rank; }
int Communicator::size() const { return impl_->executor().membership().world_size; }
Membership Communicator::membership() const { return impl_->membership(); }
absl::Status Communicator::AdmitJoiners() { return impl_->AdmitJoiners(); }

namespace {
// How long a step boundary may wait for the ops before it and a recovery in progress: an op's
// bound, then the vote's and the rebuild's.
absl::Duration StepBound(const internal::CommunicatorImpl& impl) {
  const EffectiveConfig& c = impl.config();
  return c.timeouts.collective + c.retry.report_window + c.timeouts.init;
}
}  // namespace

namespace {
// Each rank's block of the commit's allgather: this word, then its count of ops in the step. A
// block without the word came from another kind of op that paired with the commit.
constexpr int64_t kCommitWord = 0x61634d6d69745354;  // "TStimMca"

// OK when every rank committed with as many ops in the step, else the error each rank reports.
absl::Status StepOpCountsAgree(uint64_t step, const std::string& name,
                               const std::vector<int64_t>& blocks) {
  const size_t ranks = blocks.size() / 2;
  std::vector<size_t> elsewhere;
  std::string each;
  bool differ = false;
  for (size_t r = 0; r < ranks; ++r) {
    if (blocks[2 * r] != kCommitWord) elsewhere.push_back(r);
    differ = differ || blocks[2 * r + 1] != blocks[1];
    absl::StrAppend(&each, r == 0 ? "" : ", ", "rank ", r, ": ", blocks[2 * r + 1]);
  }
  const std::string prefix = absl::StrCat("step ", step, " of communicator '", name, "': ");
  if (!elsewhere.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, "rank(s) ", absl::StrJoin(elsewhere, ", "),
        " ran another op against this rank's commit: an op of the step issued after CommitStep "
        "there, or skipped here; the communicator is broken"));
  }
  if (!differ) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      prefix, "the ranks issued different numbers of ops in it (", each,
      "): an op of the step issued after CommitStep on some ranks, or skipped on others; the "
      "communicator is broken"));
}
}  // namespace

absl::Status Communicator::BeginStep() {
  if (absl::Status s = impl_->NoOpenGroup("BeginStep"); !s.ok()) return s;
  return impl_->executor().BeginStep(StepBound(*impl_));
}

absl::Status Communicator::CommitStep() {
  // Its barrier would join the group, which cannot start before CommitStep returns.
  if (absl::Status s = impl_->NoOpenGroup("CommitStep"); !s.ok()) return s;
  internal::OpExecutor& executor = impl_->executor();
  if (!executor.StepOpen()) {
    return absl::FailedPreconditionError(absl::StrCat("CommitStep without BeginStep on rank ",
                                                      rank(), " of communicator '",
                                                      impl_->options().name, "'"));
  }
  // The commit is an allgather of the number of ops each rank issued in the step: it completes
  // anywhere only once every rank entered it, each with every op of its step done, so it proves
  // the step everywhere; and ranks that issued different ops in the step (one issued after its
  // commit, or skipped one) all learn it, naming each other.
  // A backend that takes device memory only (NCCL) commits with its barrier, without the counts.
  const bool counted = capabilities().host_memory;
  int64_t mine[2] = {kCommitWord, static_cast<int64_t>(executor.StepOpsIssued())};
  std::vector<int64_t> blocks(counted ? 2 * static_cast<size_t>(size()) : 0, 0);
  Work commit = counted ? Allgather(TensorView{mine, 2, DType::kI64},
                                    TensorView{blocks.data(), blocks.size(), DType::kI64})
                        : Barrier();
  const uint64_t commit_seq = commit.seq();
  const absl::Status agreed = commit.Wait();
  absl::StatusOr<internal::OpExecutor::StepOutcome> outcome = executor.EndStep(StepBound(*impl_));
  if (!outcome.ok()) return outcome.status();
  if (agreed.ok() && outcome->failure.ok()) {
    absl::Status agree = StepOpCountsAgree(outcome->step, impl_->options().name, blocks);
    // The ranks' op sequences no longer line up: any later op could pair with another kind.
    if (!agree.ok()) Abort(agree);
    return agree;
  }
  if (outcome->recovered && commit_seq != 0 && outcome->max_position > commit_seq) {
    // Another rank got past this commit before the failure (only this rank's end of it broke):
    // the step is committed there, hence here.
    ADAPTCOMM_LOG(kWarning, "step ", outcome->step,
                  " committed (another rank completed its commit #", commit_seq,
                  " before: ", outcome->failure.message(), ")");
    return absl::OkStatus();
  }
  const absl::Status& failure = outcome->failure.ok() ? agreed : outcome->failure;
  if (outcome->recovered) {
    return internal::StepRedoStatus(absl::StrCat(
        "step ", outcome->step, " of communicator '", impl_->options().name, "' failed on rank ",
        rank(), " (", failure.message(), "); the communicator recovered at ", "generation ",
        membership().generation, ": redo the step from the state before it"));
  }
  return failure;
}
const EffectiveConfig& Communicator::config() const { return impl_->config(); }
const char* Communicator::backend_name() const { return impl_->executor().backend().name(); }
const std::string& Communicator::selection_reason() const { return impl_->selection_reason(); }
Capabilities Communicator::capabilities() const {
  return impl_->executor().backend().capabilities();
}
absl::Status Communicator::health() const { return impl_->executor().health(); }
void Communicator::Abort(const absl::Status& reason) { impl_->Abort(reason); }
std::string Communicator::Explain() const {
  // The profile's settings, then what selection made of them (the backend, and whether a tuned
  // table fit this topology: lib/core/selection/backend_selection.h).
  const internal::OnlineTuner* tuner = impl_->online_tuner();
  return absl::StrCat(impl_->config().Explain(), "\nbackend: ", backend_name(), " (",
                      impl_->selection_reason(), ")\n", impl_->ProtectionText(), "\n",
                      tuner != nullptr ? tuner->Explain() : "");
}

Communicator::LongOperationScope::LongOperationScope(Communicator& comm) : comm_(comm) {
  comm_.impl_->EnterLongOperation();
}
Communicator::LongOperationScope::~LongOperationScope() { comm_.impl_->LeaveLongOperation(); }

absl::StatusOr<std::string> Communicator::DumpFlightRecord(const std::string& reason) {
  return impl_->recorder().Dump(reason);
}

namespace {
OpDesc InPlace(OpKind kind, TensorView data) {
  OpDesc d;
  d.kind = kind;
  d.input = data;
  d.output = data;
  return d;
}
OpDesc InOut(OpKind kind, TensorView input, TensorView output) {
  OpDesc d;
  d.kind = kind;
  d.input = input;
  d.output = output;
  return d;
}
}  // namespace

Work Communicator::Allreduce(TensorView data, const AllreduceOptions& options) {
  OpDesc d = InPlace(OpKind::kAllreduce, data);
  d.reduce = options.op;
  return impl_->Submit(std::move(d), options.timeout);
}

Work Communicator::Broadcast(TensorView data, const BroadcastOptions& options) {
  OpDesc d = InPlace(OpKind::kBroadcast, data);
  d.root = options.root;
  return impl_->Submit(std::move(d), options.timeout);
}

Work Communicator::Reduce(TensorView data, const ReduceOptions& options) {
  OpDesc d = InPlace(OpKind::kReduce, data);
  d.root = options.root;
  d.reduce = options.op;
  return impl_->Submit(std::move(d), options.timeout);
}

Work Communicator::Allgather(TensorView input, TensorView output, const AllgatherOptions& options) {
  OpDesc d = InOut(OpKind::kAllgather, input, output);
  d.stable_input = options.stable_input;
  return impl_->Submit(std::move(d), options.timeout);
}

Work Communicator::ReduceScatter(TensorView input, TensorView output,
                                 const ReduceScatterOptions& options) {
  OpDesc d = InOut(OpKind::kReduceScatter, input, output);
  d.reduce = options.op;
  d.stable_input = options.stable_input;
  return impl_->Submit(std::move(d), options.timeout);
}

Work Communicator::Alltoall(TensorView input, TensorView output, const AlltoallOptions& options) {
  OpDesc d = InOut(OpKind::kAlltoall, input, output);
  d.stable_input = options.stable_input;
  return impl_->Submit(std::move(d), options.timeout);
}

Work Communicator::Barrier(const BarrierOptions& options) {
  return impl_->Submit(InPlace(OpKind::kBarrier, TensorView{}), options.timeout);
}

Work Communicator::Send(TensorView data, int peer, const P2POptions& options) {
  OpDesc d = InOut(OpKind::kSend, data, TensorView{});
  d.peer = peer;
  d.tag = options.tag;
  return impl_->SubmitPointToPoint(std::move(d), options);
}

Work Communicator::Recv(TensorView data, int peer, const P2POptions& options) {
  OpDesc d = InOut(OpKind::kRecv, TensorView{}, data);
  d.peer = peer;
  d.tag = options.tag;
  return impl_->SubmitPointToPoint(std::move(d), options);
}

}  // namespace adaptcomm

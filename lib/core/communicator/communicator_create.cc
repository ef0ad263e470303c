// Creation of a communicator: options from the launcher's environment, the profile, the
// agreed backend selection (lib/core/selection/backend_selection.h) and its rebuilds for later
// generations, the elastic joiner's path, and the internal entry points of
// lib/core/communicator/communicator_factory.h. The running communicator is
// lib/core/communicator/communicator.cc.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/status.h"
#include "lib/base/build_info.h"
#include "lib/base/log.h"
#include "lib/config/settings.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/core/communicator/communicator_impl.h"
#include "lib/core/communicator/part_options.h"
#include "lib/core/elastic/elastic_grow.h"
#include "lib/core/selection/backend_selection.h"
#include "lib/core/selection/init_agreement.h"

namespace adaptcomm {
namespace internal {

namespace {

absl::Status ResolveOptions(CommunicatorOptions& o, std::string& launch_source) {
  launch_source = "options";
  if (!o.rank.has_value() || !o.world_size.has_value()) {
    absl::StatusOr<LaunchInfo> launch = DetectLaunchEnvironment();
    if (!launch.ok()) return launch.status();
    if (!o.rank.has_value()) o.rank = launch->rank;
    if (!o.world_size.has_value()) o.world_size = launch->world_size;
    if (!o.master_addr.has_value() && !launch->master_addr.empty()) {
      o.master_addr = launch->master_addr;
    }
    if (!o.master_port.has_value() && launch->master_port != 0) o.master_port = launch->master_port;
    launch_source = launch->source;
  }
  if (*o.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size must be at least 1, got ", *o.world_size));
  }
  if (*o.rank < 0 || *o.rank >= *o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", *o.rank, " is out of range for world size ", *o.world_size));
  }
  if (o.name.empty()) return absl::InvalidArgumentError("communicator name must not be empty");
  for (const auto& [name, value] :
       {std::pair{"master_addr", &o.master_addr}, std::pair{"model_size", &o.model_size},
        std::pair{"profile_file", &o.profile_file}}) {
    if (value->has_value() && (*value)->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CommunicatorOptions::", name, " is set but empty: leave it unset for the default"));
    }
  }
  if (o.master_port.has_value() && (*o.master_port < 1 || *o.master_port > 65535)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommunicatorOptions::master_port ", *o.master_port, " is not a TCP port"));
  }
  return absl::OkStatus();
}

// Every option that is a setting, as an API override: lib/config merges them with the environment,
// the profile and the tuned table (config::ResolveSettings), the one place a setting is decided.
ProfileRequest RequestFor(const CommunicatorOptions& o) {
  ProfileRequest req;
  req.model_size = o.model_size;
  req.world_size = *o.world_size;
  req.file = o.profile_file;
  req.strict = o.profile_strict;
  ProfileOverrides& v = req.overrides;
  v.backend = o.backend;
  if (o.fallback) v.allow_fallback = *o.fallback == Fallback::kAllow;
  v.collective_timeout = o.timeout;
  v.init_timeout = o.init_timeout;
  v.max_retry_attempts = o.max_retry_attempts;
  v.replay = o.replay;
  v.failure_report_window = o.failure_report_window;
  v.store_url = o.store_url;  // "": rank 0's TCP store, whatever the environment says
  v.flight_recorder_entries = o.flight_recorder_entries;
  v.flight_recorder_dir = o.flight_recorder_dir;
  v.check_collectives = o.check_collectives;
  v.on_loss = o.elastic.on_loss;
  v.min_world_size = o.elastic.min_world_size;
  v.loss_window = o.elastic.loss_window;
  v.replacement_timeout = o.elastic.replacement_timeout;
  v.after_timeout = o.elastic.after_timeout;
  return req;
}

// The effective configuration of `o` (see RequestFor). `store`: whether the communicator has a
// store to agree coordinated retries on. Backend selection and the rendezvous read their settings
// from the options they are given, so `o` carries the effective ones from here on.
absl::StatusOr<EffectiveConfig> ApplyProfile(CommunicatorOptions& o, bool store) {
  config::RunContext run;
  run.coordinated = store;
  run.why_not = "CreateWithBackend (no store)";
  absl::StatusOr<EffectiveConfig> cfg = config::ResolveSettings(RequestFor(o), run);
  if (!cfg.ok()) return cfg.status();
  o.backend = cfg->backend.choice;
  o.fallback = cfg->backend.allow_fallback ? Fallback::kAllow : Fallback::kDeny;
  o.timeout = cfg->timeouts.collective;
  o.init_timeout = cfg->timeouts.init;
  // The effective URL, unset for rank 0's TCP store: a Split child starts from these options and
  // takes an unset store.url from the same sources its parent did.
  if (cfg->store.url.empty()) {
    o.store_url.reset();
  } else {
    o.store_url = cfg->store.url;
  }
  for (const std::string& w : cfg->warnings) ADAPTCOMM_LOG(kWarning, "profile: ", w);
  ADAPTCOMM_LOG(kDebug, cfg->Explain());
  return cfg;
}

// The rendezvous `rv` on a store scope of its own (`scope` in the communicator's), for a backend
// that must not meet the keys of another: a later generation's, a retried creation's.
Rendezvous ScopedRendezvous(const Rendezvous& rv, const std::string& scope) {
  Rendezvous next;
  next.store = CreatePrefixStore(scope, rv.store);
  next.transport_host = rv.transport_host;
  next.transport_iface = rv.transport_iface;
  return next;
}

// The rendezvous of generation g's backend: its own store scope ("gen<g>").
Rendezvous GenerationRendezvous(const Rendezvous& rv, int generation) {
  return ScopedRendezvous(rv, absl::StrCat("gen", generation));
}

struct BackendSelection {
  std::unique_ptr<Backend> backend;
  std::string reason;
};

absl::StatusOr<BackendSelection> SelectBackend(const CommunicatorOptions& o,
                                               const EffectiveConfig& config, const Rendezvous& rv,
                                               absl::Time deadline, const CommunicatorDeps& seams,
                                               Backend* previous = nullptr,
                                               std::vector<int> shrink_lost = {}) {
  // NCCL where every rank can use it, else Gloo on every rank
  // (lib/core/selection/backend_selection.h).
  selection::SelectionDeps deps = PartOptionsFor(config).selection;
  deps.use_given_apis = seams.use_given_apis;
  deps.cuda = seams.cuda;
  deps.nccl = seams.nccl;
  deps.nccl_split = seams.nccl_split;  // a Split child's first selection (used up after)
  deps.previous = previous;            // a rebuild after a shrink: ncclCommShrink where NCCL can
  deps.lost_ranks = std::move(shrink_lost);
  absl::StatusOr<selection::SelectedBackend> selected =
      selection::SelectBackendWith(o, rv, deadline, deps);
  if (!selected.ok()) return selected.status();
  return BackendSelection{std::move(selected->backend), std::move(selected->reason)};
}

// Backend selection, retried on every rank when any rank's attempt failed with a retryable code
// (profile retry.*): each attempt rendezvouses under its own prefix, and the outcome is agreed
// (lib/core/selection/init_agreement.h). With retries off there is no extra store round.
absl::StatusOr<BackendSelection> CreateBackendAgreed(const CommunicatorOptions& o,
                                                     const EffectiveConfig& config,
                                                     const Rendezvous& rv, absl::Time deadline,
                                                     const CommunicatorDeps& deps) {
  const int attempts = config.retry.max_attempts;
  absl::Duration backoff = config.retry.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    const Rendezvous retry =
        attempt > 1 ? ScopedRendezvous(rv, absl::StrCat("init", attempt)) : Rendezvous{};
    absl::StatusOr<BackendSelection> selected =
        SelectBackend(o, config, attempt > 1 ? retry : rv, deadline, deps);
    if (attempts <= 1) return selected;
    absl::Status agreed = AgreeOnInit(*rv.store, *o.rank, *o.world_size, attempt, selected.status(),
                                      config.retry.retryable, deadline);
    if (agreed.ok()) return selected;
    // A backend that works here is useless when a peer's failed: drop it and go again together.
    if (!absl::IsUnavailable(agreed) || attempt >= attempts || absl::Now() + backoff >= deadline) {
      return absl::Status(agreed.code(), absl::StrCat(agreed.message(), " (", attempt, " of ",
                                                      attempts, " attempts)"));
    }
    ADAPTCOMM_LOG(kWarning, "communicator '", o.name, "': ", agreed.message(), "; every rank ",
                  "retries in ", absl::FormatDuration(backoff));
    absl::SleepFor(backoff);
    backoff = std::min(backoff * config.retry.multiplier, config.retry.max_backoff);
  }
}

}  // namespace

bool CommunicatorImpl::WantsDegrade() {
  // After K NCCL failures within the window, rebuild on Gloo. Every retry is agreed, so every rank
  // counts the same ones; the vote settles the window's edge (FailureCoordinator).
  const absl::Time now = absl::Now();
  recoveries_.push_back(now);
  while (!recoveries_.empty() && now - recoveries_.front() > config_.backend.degrade_window) {
    recoveries_.pop_front();
  }
  return std::string(executor_->backend().name()) == "nccl" && config_.backend.allow_fallback &&
         static_cast<int>(recoveries_.size()) >= config_.backend.degrade_after_failures;
}

absl::StatusOr<std::unique_ptr<Backend>> CommunicatorImpl::RebuildBackend(int generation,
                                                                          bool degrade) {
  int rank, world;
  std::vector<int> lost;
  {
    absl::MutexLock lock(&membership_mu_);
    rank = membership_.rank;  // changed by a shrink (ApplyMembership)
    world = membership_.world_size;
    lost.swap(shrink_lost_);
  }
  if (metrics_ != nullptr && degrade) metrics_->AddFallback();
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      BuildBackendFor(generation, rank, world, degrade, std::move(lost));
  if (backend.ok() && metrics_ != nullptr) metrics_->SetBackend((*backend)->name(), world);
  return backend;
}

absl::StatusOr<std::unique_ptr<Backend>> CommunicatorImpl::BuildBackendFor(
    int generation, int rank, int world, bool degrade, std::vector<int> shrink_lost) {
  CommunicatorOptions o = options_;
  o.rank = rank;
  o.world_size = world;
  if (degrade) {
    o.backend = BackendChoice::kGloo;
    ADAPTCOMM_LOG(kError, "DEGRADING communicator '", options_.name,
                  "' from NCCL to Gloo (agreed by all ranks): ", recoveries_.size(),
                  " NCCL failures here within ",
                  absl::FormatDuration(config_.backend.degrade_window),
                  " (profile backend.degrade_after_failures / degrade_window)");
  }
  absl::StatusOr<BackendSelection> selected = SelectBackend(
      o, config_, GenerationRendezvous(rendezvous_, generation),
      absl::Now() + config_.timeouts.init, deps_, &executor_->backend(), std::move(shrink_lost));
  if (!selected.ok()) return selected.status();
  ADAPTCOMM_LOG(kWarning, "communicator '", options_.name, "' rebuilt its backend as generation ",
                generation, ": ", selected->backend->name(), " (", selected->reason, ")");
  return std::move(selected->backend);
}

// The one code besides Communicator itself that reaches its private parts
// (include/adaptcomm/communicator.h befriends it).
struct CommunicatorAccess {
  static std::unique_ptr<Communicator> Wrap(std::unique_ptr<CommunicatorImpl> impl) {
    return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
  }
  static const CommunicatorImpl& Impl(const Communicator& comm) { return *comm.impl_; }
  static CommunicatorImpl& Impl(Communicator& comm) { return *comm.impl_; }
};

// Elastic grow, the joiner's side (lib/core/elastic/elastic_grow.h): the running communicator's
// store, admission at the members' next AdmitJoiners(), then the backend of the admitted
// generation.
absl::StatusOr<std::unique_ptr<Communicator>> JoinRunningCommunicator(
    CommunicatorOptions o, EffectiveConfig config, const CommunicatorDeps& deps) {
  const absl::Time deadline = absl::Now() + config.timeouts.init;
  const ElasticPolicy elastic = ElasticPolicyOf(config.elastic);
  const std::string what =
      absl::StrCat("replacement for rank ", *o.rank, " of communicator '", o.name, "'");
  if (!elastic.elastic) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": joining a running job needs elastic.on_loss shrink or wait_for_replacement"));
  }
  absl::StatusOr<StoreServer> server = ResolveStoreServer(o);
  if (!server.ok()) return server.status();
  if (*o.rank == 0 && *server == StoreServer::kRankZero) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": rank 0 cannot be replaced (it serves the store; its loss ends the job): serve the "
        "store apart from the ranks (`adaptcomm launch --elastic`, ADAPTCOMM_STORE_EXTERNAL=1)"));
  }
  absl::StatusOr<Rendezvous> rv =
      JoinRendezvous(o, config.timeouts.store_connect, deadline, /*replacement=*/true);
  if (!rv.ok()) return rv.status();
  char host[256] = "unknown";
  gethostname(host, sizeof(host) - 1);
  const absl::Time asked = absl::Now();
  JoinerIdentity me;
  me.who = absl::StrCat(host, ":", getpid());
  me.build = BuildVersion();
  me.claimed_rank = *o.rank;
  me.limits = ElasticLimits(elastic);
  absl::StatusOr<Admission> admitted = RequestAdmission(*rv->store, config, me, deadline);
  if (!admitted.ok()) {
    return absl::Status(admitted.status().code(),
                        absl::StrCat(what, ": ", admitted.status().message()));
  }
  o.rank = admitted->rank;
  o.world_size = static_cast<int>(admitted->ids.size());
  log::SetProcessRank(*o.rank);
  absl::StatusOr<BackendSelection> selected =
      SelectBackend(o, config, GenerationRendezvous(*rv, admitted->generation), deadline, deps);
  if (!selected.ok()) {
    return absl::Status(selected.status().code(),
                        absl::StrCat(what, ": admitted, but building the backend failed: ",
                                     selected.status().message()));
  }
  ADAPTCOMM_LOG(kWarning, "communicator '", o.name, "': ", what, " joined as rank ", *o.rank,
                " of ", *o.world_size, " at generation ", admitted->generation, " (id ",
                admitted->id, ", admitted after ", absl::FormatDuration(absl::Now() - asked),
                "): backend ", selected->backend->name());
  JoinedAs joined;
  joined.id = admitted->id;
  joined.generation = admitted->generation;
  joined.first_seq = admitted->first_seq;
  joined.ids = admitted->ids;
  joined.tickets_handled = admitted->count;
  return CommunicatorAccess::Wrap(std::make_unique<CommunicatorImpl>(
      std::move(o), std::move(config), *std::move(rv), std::move(selected->backend),
      std::move(selected->reason), deps, std::move(joined)));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicatorWith(
    const CommunicatorOptions& options, const CommunicatorDeps& deps) {
  CommunicatorOptions o = options;
  std::string launch_source;
  if (absl::Status s = ResolveOptions(o, launch_source); !s.ok()) return s;
  log::SetProcessRank(*o.rank);
  absl::StatusOr<EffectiveConfig> config = ApplyProfile(o, /*store=*/true);
  if (!config.ok()) return config.status();
  const absl::Time deadline = absl::Now() + config->timeouts.init;

  if (const char* join = std::getenv("ADAPTCOMM_ELASTIC_JOIN");
      join != nullptr && std::string(join) == "1") {
    o.elastic.join = true;
  }
  if (o.elastic.join) return JoinRunningCommunicator(std::move(o), *std::move(config), deps);

  absl::StatusOr<Rendezvous> rv = JoinRendezvous(o, config->timeouts.store_connect, deadline);
  if (!rv.ok()) return rv.status();
  if (absl::Status same =
          CheckSameConfigOnAllRanks(*rv->store, *o.rank, *o.world_size, *config,
                                    std::max(deadline - absl::Now(), absl::Milliseconds(1)));
      !same.ok()) {
    LeaveRendezvous(std::move(*rv), o, /*healthy=*/false, config->timeouts.abort);
    return same;
  }
  absl::StatusOr<BackendSelection> selected = CreateBackendAgreed(o, *config, *rv, deadline, deps);
  if (!selected.ok()) {
    LeaveRendezvous(std::move(*rv), o, /*healthy=*/false, config->timeouts.abort);
    return selected.status();
  }
  ADAPTCOMM_LOG(kInfo, "communicator '", o.name, "' rank ", *o.rank, " of ", *o.world_size,
                ": backend ", selected->backend->name(), " (", selected->reason, "), ",
                rv->description, ", rank/world from ", launch_source, ", profile tier '",
                config->tier, "' (", config->file, "), op timeout ",
                absl::FormatDuration(config->timeouts.collective),
                " (Communicator::Explain() lists every setting)");
  return CommunicatorAccess::Wrap(std::make_unique<CommunicatorImpl>(
      std::move(o), std::move(*config), std::move(*rv), std::move(selected->backend),
      std::move(selected->reason), deps));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicatorWithBackend(
    std::unique_ptr<Backend> backend, const CommunicatorOptions& options,
    const CommunicatorDeps& deps) {
  if (backend == nullptr) return absl::InvalidArgumentError("CreateWithBackend: backend is null");
  CommunicatorOptions o = options;
  o.rank = backend->rank();
  o.world_size = backend->size();
  std::string unused;
  if (absl::Status s = ResolveOptions(o, unused); !s.ok()) return s;
  // No store: no coordinated retry, and Explain() says so.
  absl::StatusOr<EffectiveConfig> config = ApplyProfile(o, /*store=*/false);
  if (!config.ok()) return config.status();
  std::string reason = absl::StrCat("backend ", backend->name(), " given by the caller");
  return CommunicatorAccess::Wrap(std::make_unique<CommunicatorImpl>(
      std::move(o), std::move(*config), Rendezvous{}, std::move(backend), std::move(reason), deps));
}

Work SubmitOp(Communicator& comm, OpDesc desc, std::optional<absl::Duration> timeout) {
  return CommunicatorAccess::Impl(comm).Submit(std::move(desc), timeout);
}

absl::StatusOr<std::shared_ptr<cuda::CudaApi>> CommunicatorCudaApi(const Communicator& comm) {
  return CommunicatorAccess::Impl(comm).cuda_api();
}

bool SetSlownessScore(Communicator& comm, double score) {
  trace::CommMetrics* metrics = CommunicatorAccess::Impl(comm).metrics();
  if (metrics == nullptr) return false;
  metrics->SetSlownessScore(score);
  return true;
}

std::vector<OnlineDecision> OnlineTuningDecisions(const Communicator& comm) {
  const OnlineTuner* tuner = CommunicatorAccess::Impl(comm).online_tuner();
  return tuner != nullptr ? tuner->Decisions() : std::vector<OnlineDecision>{};
}

}  // namespace internal
}  // namespace adaptcomm

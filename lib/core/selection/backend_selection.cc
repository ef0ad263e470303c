#include "lib/core/selection/backend_selection.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/cpu_binding.h"
#include "lib/base/log.h"
#include "lib/base/store_allgather.h"
#include "lib/gloo/gloo_backend.h"
#include "lib/hier/hier_backend.h"
#include "lib/hier/host_identity.h"
#include "lib/nccl/nccl_backend.h"
#include "lib/nccl/staged_backend.h"
#include "lib/shm/shm_backend.h"

namespace adaptcomm::internal::selection {
namespace {

// The communicator passes the effective backend.choice (EffectiveConfig); a direct caller that
// leaves it unset asks for auto, the built-in default.
BackendChoice ChoiceOf(const CommunicatorOptions& o) {
  return o.backend.value_or(BackendChoice::kAuto);
}

constexpr char kYes[] = "ok";
constexpr char kNoPrefix[] = "no:";
// Set by a rank whose NCCL init failed, so the ranks still in theirs stop waiting.
constexpr char kInitGaveUpKey[] = "select/init/gave-up";

// The APIs this rank can use; a null one comes with the reason it is missing.
struct Apis {
  std::shared_ptr<cuda::CudaApi> cuda;
  std::string cuda_error;
  std::shared_ptr<nccl::NcclApi> nccl;
  std::string nccl_error;
};

Apis LoadApis(const SelectionDeps& deps, bool want_nccl) {
  Apis a;
  if (deps.use_given_apis) {
    a.nccl = deps.nccl;
    a.cuda = deps.cuda;
    if (a.cuda == nullptr) a.cuda_error = "no CUDA runtime given";
    if (a.nccl == nullptr) a.nccl_error = std::string(deps.nccl_load_error.message());
    return a;
  }
  absl::StatusOr<std::shared_ptr<cuda::CudaApi>> runtime = cuda::LoadCudaApi();
  if (runtime.ok()) {
    a.cuda = *runtime;
  } else {
    a.cuda_error = std::string(runtime.status().message());
  }
  if (want_nccl) {
    absl::StatusOr<std::shared_ptr<nccl::NcclApi>> api = nccl::LoadNcclApi(deps.nccl_library);
    if (api.ok()) {
      a.nccl = *api;
    } else {
      a.nccl_error = std::string(api.status().message());
    }
  }
  return a;
}

int ChooseDevice(const SelectionDeps& deps) {
  return deps.device >= 0 ? deps.device : DefaultCudaDevice();
}

int VisibleDevices(cuda::CudaApi* runtime) {
  int count = 0;
  if (runtime == nullptr || runtime->GetDeviceCount(&count) != cuda::kCudaSuccess) return 0;
  return count;
}

// OK, or why this rank cannot run NCCL. Also describes the NCCL found, for the reason text.
absl::Status LocalCapability(const Apis& apis, const SelectionDeps& deps, int device,
                             std::string* found) {
  if (apis.cuda == nullptr) return absl::FailedPreconditionError(apis.cuda_error);
  if (apis.nccl == nullptr) return absl::UnavailableError(apis.nccl_error);
  int version = 0;
  if (nccl::NcclResult r = apis.nccl->GetVersion(&version); r != nccl::NcclResult::kSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclGetVersion of ", apis.nccl->library_path(),
                                               " failed: ", nccl::NcclResultName(r)));
  }
  *found =
      absl::StrCat("NCCL ", nccl::NcclVersionString(version), " from ", apis.nccl->library_path());
  if (nccl::NormalizeNcclVersion(version) < nccl::NormalizeNcclVersion(deps.min_nccl_version)) {
    return absl::FailedPreconditionError(
        absl::StrCat(*found, " is older than the minimum NCCL ",
                     nccl::NcclVersionString(deps.min_nccl_version)));
  }
  int count = 0;
  if (int e = apis.cuda->GetDeviceCount(&count); e != cuda::kCudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device (cudaGetDeviceCount: ",
                     e != cuda::kCudaSuccess ? apis.cuda->ErrorString(e) : std::string("0 devices"),
                     "); ", *found));
  }
  if (device >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device cuda:", device, " does not exist (", count, " visible); ", *found));
  }
  return absl::OkStatus();
}

// Publishes this rank's verdict under `phase` and reads every rank's. Returns the failures as
// (rank, reason); an error if some rank never reported by the deadline.
absl::StatusOr<std::vector<std::pair<int, std::string>>> Exchange(Store& store,
                                                                  const std::string& phase,
                                                                  int rank, int world,
                                                                  const absl::Status& mine,
                                                                  absl::Time deadline) {
  const std::string value = mine.ok() ? std::string(kYes) : absl::StrCat(kNoPrefix, mine.message());
  if (!mine.ok() && phase == "init") {
    // What NcclBackendOptions::peers_gave_up polls: one key, whatever the world size.
    if (absl::Status s = store.Set(kInitGaveUpKey, absl::StrCat(rank)); !s.ok()) return s;
  }
  absl::StatusOr<internal::StoreGathered> gathered = internal::AllGatherThroughStore(
      store, absl::StrCat("select/", phase, "/"), rank, world, value, deadline);
  if (!gathered.ok()) return gathered.status();
  if (!gathered->complete) {
    return absl::DeadlineExceededError(absl::StrCat(
        "backend selection (", phase, "): not every rank reported: ", gathered->DescribeMissing(),
        " of ", world, " did not within the bound"));
  }
  std::vector<std::pair<int, std::string>> failed;
  for (int r = 0; r < world; ++r) {
    const std::string& v = *gathered->values[static_cast<size_t>(r)];
    if (v != kYes) failed.emplace_back(r, v.substr(std::min(v.size(), sizeof(kNoPrefix) - 1)));
  }
  return failed;
}

// "rank 3: reason" or "ranks 0, 1, 2: reason", identical reasons grouped, "; "-separated.
std::string DescribeFailures(const std::vector<std::pair<int, std::string>>& failed) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& [rank, reason] : failed) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == reason; });
    if (it == groups.end()) {
      groups.push_back({reason, {rank}});
    } else {
      it->second.push_back(rank);
    }
  }
  std::vector<std::string> parts;
  for (const auto& [reason, ranks] : groups) {
    std::vector<int> shown(ranks.begin(), ranks.begin() + std::min<size_t>(ranks.size(), 8));
    std::string who =
        absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(shown, ", "));
    if (ranks.size() > shown.size())
      absl::StrAppend(&who, " and ", ranks.size() - shown.size(), " more");
    parts.push_back(absl::StrCat(who, ": ", reason));
  }
  return absl::StrJoin(parts, "; ");
}

// The tuned table's values for the backend chosen, once every rank agreed that the table was
// tuned for this job; empty (the static values) otherwise.
struct AppliedTuning {
  ShmBackendOptions::TunedBands shm_allreduce;
  ShmBackendOptions::TunedBands shm_reduce;
  config::SizeBands gloo_algorithm;
  config::SizeBands gloo_max_segment_bytes;
  std::string note;  // appended to the selection reason ("" without a table)
};

// Checks the table's fingerprint against this job's for `backend` on every rank and agrees on
// the verdict (cores may differ between hosts): the values apply on all ranks or on none.
absl::StatusOr<AppliedTuning> AgreeTuning(const CommunicatorOptions& o, const Rendezvous& rv,
                                          absl::Time deadline, const SelectionDeps& deps,
                                          const std::string& backend, int hosts, int per_host) {
  AppliedTuning t;
  const config::TunedTable* table = deps.tuned_table.get();
  if (table == nullptr) return t;
  const absl::Status mine =
      config::CheckFingerprint(*table, CurrentFingerprint(backend, hosts, per_host));
  absl::StatusOr<std::vector<std::pair<int, std::string>>> failed =
      Exchange(*rv.store, absl::StrCat("tuned/", backend), *o.rank, *o.world_size, mine, deadline);
  if (!failed.ok()) return failed.status();
  if (!failed->empty()) {
    t.note = absl::StrCat("; tuned table refused: ", DescribeFailures(*failed),
                          "; the static profile applies");
    ADAPTCOMM_LOG(kWarning, "communicator '", o.name, "': tuned table ", table->file,
                  " refused for ", backend, ": ", DescribeFailures(*failed),
                  "; the static profile applies");
    return t;
  }
  t.shm_allreduce.flat_max_bytes = table->KnobBands("shm", "allreduce", "flat_max_bytes");
  t.shm_allreduce.chunk_bytes = table->KnobBands("shm", "allreduce", "chunk_bytes");
  t.shm_reduce.flat_max_bytes = table->KnobBands("shm", "reduce", "flat_max_bytes");
  t.shm_reduce.chunk_bytes = table->KnobBands("shm", "reduce", "chunk_bytes");
  t.gloo_algorithm = table->KnobBands("gloo", "allreduce", "algorithm");
  t.gloo_max_segment_bytes = table->KnobBands("gloo", "allreduce", "max_segment_bytes");
  size_t values = 0;
  for (const config::TunedEntry& e : table->entries) values += e.backend != "nccl";
  t.note = absl::StrCat("; tuned table ", table->file, " (", values,
                        " values per size band, fingerprint ", table->fingerprint.Describe(), ")");
  return t;
}

// AgreeTuning for Gloo where selection did not learn the hosts (backend=gloo, or NCCL not
// usable): one more host exchange, only when there is a table.
absl::StatusOr<AppliedTuning> AgreeGlooTuning(const CommunicatorOptions& o, const Rendezvous& rv,
                                              absl::Time deadline, const SelectionDeps& deps) {
  if (deps.tuned_table == nullptr) return AppliedTuning{};
  const std::string mine = deps.host_identity.empty() ? LocalHostIdentity() : deps.host_identity;
  absl::StatusOr<std::vector<std::string>> ids = ExchangeHostIdentities(
      *CreatePrefixStore("select/tuned-host", rv.store), *o.rank, *o.world_size, mine, deadline);
  if (!ids.ok()) return ids.status();
  const HostAssignment hosts = AssignHosts(*ids, *o.rank);
  return AgreeTuning(o, rv, deadline, deps, "gloo", hosts.hosts, hosts.max_local);
}

// Host-memory backends serve CUDA views through pinned staging when a device is visible.
absl::StatusOr<std::unique_ptr<Backend>> MaybeStaged(std::unique_ptr<Backend> backend,
                                                     const Apis& apis, std::string* staging_note) {
  if (VisibleDevices(apis.cuda.get()) == 0) return backend;
  absl::StatusOr<std::unique_ptr<Backend>> staged =
      nccl::CreateStagedBackend(std::move(backend), apis.cuda);
  if (!staged.ok()) return staged.status();
  *staging_note = ", CUDA buffers staged through pinned host memory";
  return staged;
}

// Shared memory among `size` ranks of one host (this one is `rank`), host buffers only.
absl::StatusOr<std::unique_ptr<Backend>> CreateShm(int rank, int size, std::shared_ptr<Store> store,
                                                   absl::Time deadline,
                                                   const AppliedTuning& tuning) {
  ShmBackendOptions shm;
  shm.rank = rank;
  shm.size = size;
  shm.store = std::move(store);
  shm.init_timeout = std::max(deadline - absl::Now(), absl::Milliseconds(1));
  shm.tuned_allreduce = tuning.shm_allreduce;
  shm.tuned_reduce = tuning.shm_reduce;
  return CreateShmBackend(shm);
}

absl::StatusOr<std::unique_ptr<Backend>> BuildShm(const CommunicatorOptions& o,
                                                  const Rendezvous& rv, absl::Time deadline,
                                                  const Apis& apis, const AppliedTuning& tuning,
                                                  std::string* staging_note) {
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateShm(*o.rank, *o.world_size, CreatePrefixStore("shm", rv.store), deadline, tuning);
  if (!backend.ok()) return backend.status();
  return MaybeStaged(std::move(*backend), apis, staging_note);
}

// Gloo among `size` ranks (this one is `rank`) over `store`, with the profile's settings.
GlooBackendOptions GlooOptionsFor(const CommunicatorOptions& o, const Rendezvous& rv,
                                  absl::Time deadline, const SelectionDeps& deps,
                                  const AppliedTuning& tuning, int rank, int size,
                                  std::shared_ptr<Store> store) {
  GlooBackendOptions gloo;
  gloo.rank = rank;
  gloo.size = size;
  gloo.store = std::move(store);
  gloo.iface = rv.transport_iface;
  gloo.hostname = rv.transport_host;
  if (gloo.iface.empty() && gloo.hostname.empty()) gloo.hostname = "127.0.0.1";
  gloo.init_timeout = std::max(deadline - absl::Now(), absl::Milliseconds(1));
  if (o.timeout) gloo.default_timeout = *o.timeout;  // the effective timeouts.collective
  gloo.algorithm = deps.gloo_algorithm;
  gloo.max_segment_bytes = deps.gloo_max_segment_bytes;
  gloo.max_connections = deps.gloo_max_connections;
  gloo.tuned_algorithm = tuning.gloo_algorithm;
  gloo.tuned_max_segment_bytes = tuning.gloo_max_segment_bytes;
  return gloo;
}

// `note`: what the selection reason adds (staging; a rank confined to one CPU).
absl::StatusOr<std::unique_ptr<Backend>> BuildGloo(const CommunicatorOptions& o,
                                                   const Rendezvous& rv, absl::Time deadline,
                                                   const Apis& apis, const SelectionDeps& deps,
                                                   const AppliedTuning& tuning, std::string* note) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(GlooOptionsFor(
      o, rv, deadline, deps, tuning, *o.rank, *o.world_size, CreatePrefixStore("gloo", rv.store)));
  if (!backend.ok()) return backend.status();
  backend = MaybeStaged(std::move(*backend), apis, note);
  if (backend.ok() && AllowedCpuCount() == 1) {
    // Each Gloo op hands off from the caller to the executor's worker, whose transfers the event
    // loop thread of Gloo's tcp device carries: on one CPU every hand-off waits for the scheduler
    // to switch threads. `adaptcomm launch` binds a rank to one core where the host has just a core
    // per rank, which suits shm (the caller runs its ops itself) but not Gloo (README, "Where
    // ranks run", has the numbers). Said, not undone: the library never moves a thread.
    const std::string warning =
        "this rank may run on one CPU only (its affinity), where gloo's threads take turns on "
        "every op: small ops run several times slower (`adaptcomm launch --bind-to none`, or 2 or "
        "more CPUs per rank)";
    static std::once_flag logged;  // a process may create many communicators (adaptcomm tune)
    std::call_once(logged, [&] { ADAPTCOMM_LOG(kWarning, "rank ", *o.rank, ": ", warning); });
    absl::StrAppend(note, "; ", warning);
  }
  return backend;
}

// The hierarchical backend over hosts already agreed on (`ids`: every rank's host identity).
absl::StatusOr<SelectedBackend> BuildHierarchical(const CommunicatorOptions& o,
                                                  const Rendezvous& rv, absl::Time deadline,
                                                  const SelectionDeps& deps,
                                                  const AppliedTuning& tuning,
                                                  const HierarchicalDeps& hier,
                                                  const std::vector<std::string>& ids);

// Where the ranks run decides (hosts agreed through the store): all on this host -> shm; several
// hosts with several ranks on one of them -> hierarchical (shm inside each host, Gloo among the
// host leaders); one rank per host -> Gloo. The profile's backend.intra_host=gloo puts Gloo where
// shm would be, backend.hierarchical=off gives flat Gloo across hosts. backend=shm insists on shm.
// With fallback allowed, a failed shm or hierarchical creation (it fails on every rank alike) gives
// Gloo. `asked`/`why_not_nccl` prefix the reason.
absl::StatusOr<SelectedBackend> ShmOrGloo(const CommunicatorOptions& o, const Rendezvous& rv,
                                          absl::Time deadline, const Apis& apis,
                                          const SelectionDeps& deps, const std::string& asked,
                                          const std::string& why_not_nccl) {
  std::string staging;
  const bool forced = ChoiceOf(o) == BackendChoice::kShm;
  const std::string mine = deps.host_identity.empty() ? LocalHostIdentity() : deps.host_identity;
  absl::StatusOr<std::vector<std::string>> ids = ExchangeHostIdentities(
      *CreatePrefixStore("select/host", rv.store), *o.rank, *o.world_size, mine, deadline);
  if (!ids.ok()) return ids.status();
  const HostAssignment hosts = AssignHosts(*ids, *o.rank);
  std::string differs;
  for (int r = 0; r < *o.world_size && differs.empty(); ++r) {
    if ((*ids)[static_cast<size_t>(r)] != mine) {
      differs = absl::StrCat("rank ", r, " is on '", (*ids)[static_cast<size_t>(r)], "', rank ",
                             *o.rank, " on '", mine, "' (boot id/host name/network namespace)");
    }
  }
  std::string not_shm;
  if (hosts.hosts == 1 && *o.world_size > 1 && !forced && !deps.intra_host_shm) {
    not_shm = "; backend.intra_host is gloo";
  } else if (hosts.hosts == 1 && (*o.world_size > 1 || forced)) {
    absl::StatusOr<AppliedTuning> tuning =
        AgreeTuning(o, rv, deadline, deps, "shm", hosts.hosts, hosts.max_local);
    if (!tuning.ok()) return tuning.status();
    absl::StatusOr<std::unique_ptr<Backend>> shm =
        BuildShm(o, rv, deadline, apis, *tuning, &staging);
    if (shm.ok()) {
      return SelectedBackend{
          std::move(*shm), absl::StrCat(asked, forced ? "" : ": shm", ": all ", *o.world_size,
                                        " ranks on one host", why_not_nccl, staging, tuning->note)};
    }
    if (forced && o.fallback == Fallback::kDeny) {
      return absl::Status(shm.status().code(),
                          absl::StrCat(asked, " with fallback deny: ", shm.status().message()));
    }
    not_shm = absl::StrCat("shm could not be created: ", shm.status().message());
    ADAPTCOMM_LOG(kWarning, asked, ": every rank falls back to gloo: ", not_shm);
  } else if (forced) {
    not_shm = absl::StrCat("the ranks are not on one host: ", differs);
    if (o.fallback == Fallback::kDeny) {
      return absl::FailedPreconditionError(absl::StrCat(asked, " with fallback deny: ", not_shm));
    }
    ADAPTCOMM_LOG(kWarning, asked, ": every rank falls back to gloo: ", not_shm);
  } else if (hosts.max_local > 1 && !deps.hierarchical) {
    not_shm = absl::StrCat("; backend.hierarchical is off (", hosts.hosts, " hosts, up to ",
                           hosts.max_local, " ranks on one)");
  } else if (hosts.max_local > 1) {
    absl::StatusOr<AppliedTuning> tuning =
        AgreeTuning(o, rv, deadline, deps, "hier", hosts.hosts, hosts.max_local);
    if (!tuning.ok()) return tuning.status();
    HierarchicalDeps hier;
    if (deps.intra_host_shm) {  // else Gloo on loopback inside each host
      hier.intra = [&tuning](const IntraHostGroup& g) {
        return CreateShm(g.local_rank, g.local_size, g.store, g.deadline, *tuning);
      };
    }
    absl::StatusOr<SelectedBackend> h =
        BuildHierarchical(o, rv, deadline, deps, *tuning, hier, *ids);
    if (h.ok()) {
      absl::StatusOr<std::unique_ptr<Backend>> staged =
          MaybeStaged(std::move(h->backend), apis, &staging);
      if (!staged.ok()) return staged.status();
      return SelectedBackend{*std::move(staged), absl::StrCat(asked, ": ", h->reason, why_not_nccl,
                                                              staging, tuning->note)};
    }
    if (o.fallback == Fallback::kDeny) return h.status();
    not_shm =
        absl::StrCat("; the hierarchical backend could not be created: ", h.status().message());
    ADAPTCOMM_LOG(kWarning, asked, ": every rank falls back to gloo", not_shm);
  } else if (hosts.hosts > 1) {
    not_shm = absl::StrCat("; one rank per host (", hosts.hosts, " hosts)");
  }
  absl::StatusOr<AppliedTuning> tuning =
      AgreeTuning(o, rv, deadline, deps, "gloo", hosts.hosts, hosts.max_local);
  if (!tuning.ok()) return tuning.status();
  absl::StatusOr<std::unique_ptr<Backend>> gloo =
      BuildGloo(o, rv, deadline, apis, deps, *tuning, &staging);
  if (!gloo.ok()) return gloo.status();
  if (forced) {
    return SelectedBackend{std::move(*gloo), absl::StrCat(asked, ": gloo on every rank because ",
                                                          not_shm, staging, tuning->note)};
  }
  return SelectedBackend{std::move(*gloo), absl::StrCat(asked, ": gloo on every rank", why_not_nccl,
                                                        not_shm, staging, tuning->note)};
}

// The survivors' NCCL backend through ncclCommShrink of the previous one, when every survivor
// can (agreed first) and did (agreed after); null (the previous communicator aborted by the
// caller) when some could not or failed, so that every rank goes on to a fresh init alike.
absl::StatusOr<std::unique_ptr<Backend>> ShrinkAgreed(const CommunicatorOptions& o,
                                                      const Rendezvous& rv, absl::Time deadline,
                                                      const SelectionDeps& deps) {
  const absl::Status mine = nccl::CanShrinkNccl(*deps.previous);
  absl::StatusOr<std::vector<std::pair<int, std::string>>> failed =
      Exchange(*rv.store, "shrink", *o.rank, *o.world_size, mine, deadline);
  if (!failed.ok()) return failed.status();
  if (!failed->empty()) {
    ADAPTCOMM_LOG(kInfo, "communicator '", o.name, "': no ncclCommShrink (",
                  DescribeFailures(*failed), "); the survivors abort and init NCCL afresh");
    return nullptr;
  }
  nccl::NcclBackendOptions no;
  no.rank = *o.rank;
  no.size = *o.world_size;
  no.device = ChooseDevice(deps);
  no.store = rv.store;
  no.init_timeout = std::max((deadline - absl::Now()) / 2, absl::Milliseconds(1));
  no.keep_comm_for_shrink = deps.elastic;
  no.device_timing_every = deps.device_timing_every;
  absl::StatusOr<std::unique_ptr<Backend>> shrunk =
      nccl::ShrinkNcclBackend(*deps.previous, deps.lost_ranks, no);
  failed = Exchange(*rv.store, "shrunk", *o.rank, *o.world_size, shrunk.status(), deadline);
  if (!failed.ok()) return failed.status();
  if (!failed->empty()) {
    ADAPTCOMM_LOG(kWarning, "communicator '", o.name, "': ncclCommShrink failed (",
                  DescribeFailures(*failed), "); the survivors init NCCL afresh");
    if (shrunk.ok()) (*shrunk)->Abort(absl::CancelledError("another rank's ncclCommShrink failed"));
    return nullptr;
  }
  return shrunk;
}

// A Split child's backend on the communicator ncclCommSplit made for it, when every rank of the
// child holds one (agreed first) and built its backend on it (agreed after); null when there is
// none or some rank could not, every rank's split communicator then released, so that every rank
// goes on to a fresh init alike.
absl::StatusOr<std::unique_ptr<Backend>> SplitAgreed(const CommunicatorOptions& o,
                                                     const Rendezvous& rv, absl::Time deadline,
                                                     const SelectionDeps& deps,
                                                     const nccl::NcclBackendOptions& no) {
  if (deps.nccl_split == nullptr) return nullptr;
  const absl::Status mine = deps.nccl_split->available()
                                ? absl::OkStatus()
                                : absl::FailedPreconditionError("no split communicator");
  absl::StatusOr<std::vector<std::pair<int, std::string>>> failed =
      Exchange(*rv.store, "split", *o.rank, *o.world_size, mine, deadline);
  if (!failed.ok()) return failed.status();
  if (!failed->empty()) {
    deps.nccl_split->Release();
    ADAPTCOMM_LOG(kInfo, "communicator '", o.name, "': no ncclCommSplit communicator (",
                  DescribeFailures(*failed), "); every rank inits NCCL afresh");
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<Backend>> adopted = nccl::AdoptNcclSplitComm(*deps.nccl_split, no);
  failed = Exchange(*rv.store, "split/adopted", *o.rank, *o.world_size, adopted.status(), deadline);
  if (!failed.ok()) return failed.status();
  if (!failed->empty()) {
    ADAPTCOMM_LOG(kWarning, "communicator '", o.name,
                  "': a backend on the ncclCommSplit "
                  "communicator failed (",
                  DescribeFailures(*failed), "); every rank inits NCCL afresh");
    if (adopted.ok())
      (*adopted)->Abort(absl::CancelledError("another rank's split backend failed"));
    return nullptr;
  }
  return adopted;
}

// The NCCL backend's options for this rank on `device`, with the profile's ncclConfig_t values
// translated for the loaded NCCL.
nccl::NcclBackendOptions NcclOptionsFor(const CommunicatorOptions& o, const Rendezvous& rv,
                                        absl::Time deadline, const Apis& apis,
                                        const SelectionDeps& deps, int device) {
  nccl::NcclBackendOptions no;
  no.rank = *o.rank;
  no.size = *o.world_size;
  no.device = device;
  no.store = rv.store;
  // A peer whose init failed publishes that before the others finish theirs: stop waiting then.
  no.keep_comm_for_shrink = deps.elastic && apis.nccl->has_comm_shrink();
  no.device_timing_every = deps.device_timing_every;
  no.peers_gave_up = [&rv]() -> absl::Status {
    absl::StatusOr<std::string> who = rv.store->Get(kInitGaveUpKey, absl::ZeroDuration());
    if (who.ok()) return absl::UnavailableError(absl::StrCat("rank ", *who, " failed"));
    return absl::OkStatus();
  };
  // Half of the time left: a hung init still leaves time to agree and build Gloo.
  no.init_timeout = std::max((deadline - absl::Now()) / 2, absl::Milliseconds(1));
  int version = 0;
  (void)apis.nccl->GetVersion(&version);
  std::vector<std::string> notes;
  const config::NcclConfigValues wanted =
      deps.configure_nccl ? deps.configure_nccl(version) : deps.nccl_config;
  no.config = nccl::TranslateNcclConfig(wanted, version, &notes);
  for (const std::string& note : notes) ADAPTCOMM_LOG(kInfo, "nccl config: ", note);
  return no;
}

}  // namespace

absl::Status CanSplitParentNccl(const Backend& parent) { return nccl::CanSplitNccl(parent); }

absl::StatusOr<std::shared_ptr<nccl::NcclSplitComm>> SplitParentNccl(Backend& parent, bool no_color,
                                                                     int color, int key,
                                                                     absl::Duration bound) {
  return nccl::SplitNcclComm(parent, no_color ? nccl::kSplitNoColor : color, key, bound);
}

void ReleaseSplitComm(nccl::NcclSplitComm& split) { split.Release(); }

absl::StatusOr<SelectedBackend> SelectBackendWith(const CommunicatorOptions& o,
                                                  const Rendezvous& rv, absl::Time deadline,
                                                  const SelectionDeps& deps) {
  if (rv.store == nullptr) return absl::InvalidArgumentError("backend selection: no store");
  std::string staging;
  const BackendChoice choice = ChoiceOf(o);
  if (deps.previous != nullptr && choice != BackendChoice::kAuto &&
      choice != BackendChoice::kNccl) {
    nccl::ReleaseNcclComm(*deps.previous);  // a degrade to Gloo: the kept communicator goes
  }
  if (choice == BackendChoice::kGloo) {
    Apis apis = LoadApis(deps, /*want_nccl=*/false);
    absl::StatusOr<AppliedTuning> tuning = AgreeGlooTuning(o, rv, deadline, deps);
    if (!tuning.ok()) return tuning.status();
    absl::StatusOr<std::unique_ptr<Backend>> gloo =
        BuildGloo(o, rv, deadline, apis, deps, *tuning, &staging);
    if (!gloo.ok()) return gloo.status();
    return SelectedBackend{std::move(*gloo),
                           absl::StrCat("backend=gloo requested", staging, tuning->note)};
  }

  const std::string asked = absl::StrCat("backend=", BackendChoiceName(choice));
  if (choice == BackendChoice::kShm) {
    const Apis apis = LoadApis(deps, /*want_nccl=*/false);
    return ShmOrGloo(o, rv, deadline, apis, deps, asked, "");
  }
  const Apis apis = LoadApis(deps, /*want_nccl=*/true);
  const int device = ChooseDevice(deps);
  if (deps.previous != nullptr && !deps.lost_ranks.empty()) {
    absl::StatusOr<std::unique_ptr<Backend>> shrunk = ShrinkAgreed(o, rv, deadline, deps);
    if (!shrunk.ok()) return shrunk.status();
    if (*shrunk != nullptr) {
      return SelectedBackend{
          *std::move(shrunk),
          absl::StrCat(asked, ": nccl shrunk with ncclCommShrink on every survivor (ranks ",
                       absl::StrJoin(deps.lost_ranks, ", "), " of the previous ",
                       *o.world_size + static_cast<int>(deps.lost_ranks.size()),
                       " excluded; cuda:", device, ")")};
    }
  }
  if (deps.previous != nullptr) nccl::ReleaseNcclComm(*deps.previous);
  std::string found;
  const absl::Status mine = LocalCapability(apis, deps, device, &found);
  absl::StatusOr<std::vector<std::pair<int, std::string>>> failed =
      Exchange(*rv.store, "cap", *o.rank, *o.world_size, mine, deadline);
  if (!failed.ok()) return failed.status();

  std::unique_ptr<Backend> nccl_backend;
  bool init_phase = false;  // every rank was capable; then NCCL init itself failed somewhere
  absl::Status init;        // this rank's NCCL init outcome
  if (failed->empty()) {
    init_phase = true;
    const nccl::NcclBackendOptions no = NcclOptionsFor(o, rv, deadline, apis, deps, device);
    absl::StatusOr<std::unique_ptr<Backend>> created = SplitAgreed(o, rv, deadline, deps, no);
    const bool from_split = created.ok() && *created != nullptr;
    if (created.ok() && *created == nullptr) {
      created = nccl::CreateNcclBackend(apis.nccl, apis.cuda, no);
    }
    init = created.status();
    if (created.ok()) nccl_backend = std::move(*created);
    failed = Exchange(*rv.store, "init", *o.rank, *o.world_size, init, deadline);
    if (!failed.ok()) return failed.status();
    if (failed->empty()) {
      return SelectedBackend{
          std::move(nccl_backend),
          absl::StrCat(asked, ": nccl on every rank (", found, ", cuda:", device,
                       from_split ? "; built by ncclCommSplit of the parent's communicator" : "",
                       ")")};
    }
    if (nccl_backend != nullptr) {
      // Peers failed: abort rather than finalize, which would wait for them.
      nccl_backend->Abort(absl::CancelledError("another rank could not initialize NCCL"));
      nccl_backend.reset();
    }
  }

  const std::string why = DescribeFailures(*failed);
  if (o.fallback == Fallback::kDeny) {
    // A missing capability stays missing; a failed init (a lost connection) may pass next time,
    // so it is Unavailable, which Communicator::Create retries on every rank (init_agreement.h).
    const bool transient =
        init_phase && (init.ok() || absl::IsUnavailable(init) || absl::IsDeadlineExceeded(init));
    return absl::Status(
        transient ? absl::StatusCode::kUnavailable : absl::StatusCode::kFailedPrecondition,
        absl::StrCat(asked, " with fallback deny: NCCL is not usable on every rank: ", why));
  }
  if (ChoiceOf(o) == BackendChoice::kAuto) {
    // Host buffers on one host: shared memory beats loopback TCP by 10-100x.
    return ShmOrGloo(o, rv, deadline, apis, deps, asked,
                     absl::StrCat(" because NCCL is not usable: ", why));
  }
  ADAPTCOMM_LOG(kWarning, asked, ": NCCL is not usable on every rank, every rank falls back to ",
                "gloo: ", why);
  absl::StatusOr<AppliedTuning> tuning = AgreeGlooTuning(o, rv, deadline, deps);
  if (!tuning.ok()) return tuning.status();
  absl::StatusOr<std::unique_ptr<Backend>> gloo =
      BuildGloo(o, rv, deadline, apis, deps, *tuning, &staging);
  if (!gloo.ok()) return gloo.status();
  return SelectedBackend{std::move(*gloo),
                         absl::StrCat(asked, ": gloo on every rank because NCCL is not usable: ",
                                      why, staging, tuning->note)};
}

absl::StatusOr<SelectedBackend> CreateHierarchicalWith(const CommunicatorOptions& o,
                                                       const Rendezvous& rv, absl::Time deadline,
                                                       const SelectionDeps& deps,
                                                       const HierarchicalDeps& hier) {
  if (rv.store == nullptr) return absl::InvalidArgumentError("hierarchical backend: no store");
  const std::string mine = hier.host_identity.empty() ? LocalHostIdentity() : hier.host_identity;
  absl::StatusOr<std::vector<std::string>> ids = ExchangeHostIdentities(
      *CreatePrefixStore("hier", rv.store), *o.rank, *o.world_size, mine, deadline);
  if (!ids.ok()) return ids.status();
  return BuildHierarchical(o, rv, deadline, deps, AppliedTuning{}, hier, *ids);
}

namespace {

absl::StatusOr<SelectedBackend> BuildHierarchical(const CommunicatorOptions& o,
                                                  const Rendezvous& rv, absl::Time deadline,
                                                  const SelectionDeps& deps,
                                                  const AppliedTuning& tuning,
                                                  const HierarchicalDeps& hier,
                                                  const std::vector<std::string>& ids) {
  const HostAssignment a = AssignHosts(ids, *o.rank);
  const int host = a.host_of[static_cast<size_t>(*o.rank)];
  IntraHostGroup group;
  group.host = host;
  group.local_rank = a.local_rank;
  group.local_size = a.local_size;
  group.store = CreatePrefixStore(absl::StrCat("hier/intra/", host), rv.store);
  group.deadline = deadline;
  HierBackendOptions h;
  h.topology = {*o.rank, *o.world_size, a.host_of, a.local_rank};
  std::string intra_name = "gloo";
  if (hier.intra) {
    absl::StatusOr<std::unique_ptr<Backend>> intra = hier.intra(group);
    if (!intra.ok()) return intra.status();
    h.intra = *std::move(intra);
    intra_name = h.intra->name();
  } else {
    // Ranks of one host share its network namespace: loopback reaches them all.
    GlooBackendOptions g =
        GlooOptionsFor(o, rv, deadline, deps, tuning, a.local_rank, a.local_size, group.store);
    g.iface.clear();
    g.hostname = "127.0.0.1";
    absl::StatusOr<std::unique_ptr<Backend>> intra = CreateGlooBackend(g);
    if (!intra.ok()) return intra.status();
    h.intra = *std::move(intra);
  }
  if (a.local_rank == 0 && a.hosts > 1) {
    absl::StatusOr<std::unique_ptr<Backend>> inter = CreateGlooBackend(GlooOptionsFor(
        o, rv, deadline, deps, tuning, host, a.hosts, CreatePrefixStore("hier/inter", rv.store)));
    if (!inter.ok()) return inter.status();
    h.inter = *std::move(inter);
  }
  if (a.hosts > 1 && a.max_local > 1) {
    // Send/recv between hosts for a rank that is not its host's leader: a two-rank Gloo link per
    // pair, made when the pair first talks (only those two ranks run a send/recv, and a full mesh
    // of every rank up front would cost every job connections most never use).
    const GlooBackendOptions base = GlooOptionsFor(o, rv, deadline, deps, tuning, 0, 2, nullptr);
    h.pair_transport = [base, store = rv.store, me = *o.rank](
                           int peer,
                           absl::Duration bound) -> absl::StatusOr<std::unique_ptr<Backend>> {
      GlooBackendOptions g = base;
      const int lo = std::min(me, peer), hi = std::max(me, peer);
      g.rank = me == lo ? 0 : 1;
      g.store = CreatePrefixStore(absl::StrCat("hier/pair/", lo, "-", hi), store);
      g.init_timeout = bound;
      return CreateGlooBackend(g);
    };
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateHierarchicalBackend(std::move(h));
  if (!backend.ok()) return backend.status();
  return SelectedBackend{
      *std::move(backend),
      absl::StrCat("hierarchical: ", *o.world_size, " ranks on ", a.hosts,
                   a.hosts == 1 ? " host" : " hosts", " (at most ", a.max_local,
                   " per host; this rank is local rank ", a.local_rank, " of ", a.local_size,
                   " on host ", host, "); ", intra_name, " within each host, gloo among the ",
                   a.hosts, " host leaders")};
}

}  // namespace

config::TopologyFingerprint CurrentFingerprint(const std::string& backend, int hosts,
                                               int ranks_per_host) {
  config::TopologyFingerprint fp;
  fp.hosts = hosts;
  fp.ranks_per_host = ranks_per_host;
  fp.cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  fp.backend = backend;
  if (backend == "gloo" || backend == "hier") fp.gloo = GlooVersion();
  return fp;
}

}  // namespace adaptcomm::internal::selection

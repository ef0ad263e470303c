// Backend selection: NCCL where every rank can use it, otherwise a host backend (shm, hierarchical
// or Gloo) on every rank alike.
//
// backend=auto or nccl: each rank publishes to the communicator's store what it can do (the CUDA
// runtime is built in, NCCL loads, its version is recent enough, a CUDA device is visible); every
// rank reads every report. Only if all ranks can, they initialize NCCL (bounded by half of the time
// left), publish the init result and read everyone's again. Any "no" on any rank makes EVERY rank
// build Gloo (wrapped in staging when CUDA devices are visible, so device views keep working) and
// log the reasons with the ranks they came from ("rank 3: libnccl.so.2: cannot open shared object
// file: ..."), or, with Fallback::kDeny, makes creation fail on every rank with those reasons.
// backend=gloo: Gloo without asking NCCL anything (staged when CUDA devices are visible).
// With NCCL not usable, auto (fallback allowed) decides by where the ranks run (boot id, host
// name and network namespace, agreed through the store): every rank on one host -> shm; several
// hosts with more than one rank on some host -> hierarchical (shm inside each host, Gloo among
// one leader per host); one rank per host -> Gloo. A failed shm or hierarchical creation falls
// back to Gloo on every rank (logged once).
// backend=shm: shm when every rank is on one host; otherwise, or when the segment cannot be
// created, Gloo on every rank (logged once) or, with Fallback::kDeny, an error on every rank.
//
// Store keys (under the communicator's scope): "select/cap/<rank>", "select/init/<rank>",
// "select/host/<rank>", "nccl/uid", Gloo's under "gloo/" and shm's under "shm/".
#ifndef ADAPTCOMM_LIB_CORE_SELECTION_BACKEND_SELECTION_H_
#define ADAPTCOMM_LIB_CORE_SELECTION_BACKEND_SELECTION_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/ext/backend.h"
#include "adaptcomm/profile.h"
#include "lib/config/nccl_plan.h"
#include "lib/config/tuned_table.h"
#include "lib/core/selection/rendezvous.h"
#include "lib/cuda/cuda_api.h"
#include "lib/nccl/nccl_api.h"
#include "lib/nccl/nccl_backend.h"

namespace adaptcomm::internal::selection {

struct SelectedBackend {
  std::unique_ptr<Backend> backend;
  std::string reason;  // for the creation log line and Communicator::selection_reason()
};

// What selection uses besides the options; the defaults are the real loaders.
struct SelectionDeps {
  // Use `nccl` / `cuda` as given instead of loading anything (a communicator built with injected
  // seams, lib/core/communicator/communicator_factory.h; tests). A null `nccl` then means NCCL
  // failed to load with `nccl_load_error`; a null `cuda`, that there is no CUDA runtime.
  bool use_given_apis = false;
  std::shared_ptr<nccl::NcclApi> nccl;
  std::shared_ptr<cuda::CudaApi> cuda;
  absl::Status nccl_load_error = absl::UnavailableError("NCCL not loaded");
  // NCCL library for the real loader; empty: $ADAPTCOMM_NCCL_LIBRARY, else "libnccl.so.2".
  std::string nccl_library;
  // Oldest acceptable NCCL (version code). A profile may raise it.
  int min_nccl_version = nccl::kMinNcclVersion;
  // The profile's ncclConfig_t values (translated for the loaded version at init).
  config::NcclConfigValues nccl_config;
  // If set, called with the loaded NCCL's version right before the first init: applies the
  // profile's process environment for that version and returns its ncclConfig_t values (which
  // then replace nccl_config).
  std::function<config::NcclConfigValues(int nccl_version)> configure_nccl;
  // The profile's Gloo allreduce algorithm ("auto", "ring", "bcube") and segment size (0: default).
  // The profile's backend.intra_host (shm: true) and backend.hierarchical (auto: true); auto
  // selection only (backend=shm insists on shm).
  bool intra_host_shm = true;
  bool hierarchical = true;
  std::string gloo_algorithm = "auto";
  size_t gloo_max_segment_bytes = 0;
  int gloo_max_connections = 1024;  // the profile's gloo.max_connections
  // NCCL: one device op in this many timed on the device (NcclBackendOptions); 0: none.
  int device_timing_every = 0;
  // The tuned table (EffectiveConfig::tuning.loaded); null: none. Its shm and Gloo values go into
  // the backend's options per size band when its fingerprint is this job's (CurrentFingerprint
  // of the backend chosen) on every rank, agreed through the store ("select/tuned/<backend>/<r>");
  // otherwise every rank uses the static values and the reason is logged once and appended to
  // the selection reason. Not consulted for NCCL (the NCCL tuner plugin reads its own table).
  std::shared_ptr<const config::TunedTable> tuned_table;
  // This rank's host identity (lib/hier/host_identity.h); empty: the real one. Tests fake hosts
  // here to drive the shm / hierarchical / Gloo choice.
  std::string host_identity;
  // Elastic shrink (issue #14). `elastic`: NCCL backends keep a failed communicator for
  // ncclCommShrink (NcclBackendOptions::keep_comm_for_shrink) where the loaded NCCL has it.
  // `previous`: in a rebuild, the backend being replaced (still installed, idle); `lost_ranks`:
  // the ranks of its numbering that the membership lost. Then, where every survivor's previous
  // backend can shrink (agreed under "select/shrink/<rank>"), NCCL is rebuilt with ncclCommShrink
  // (outcome agreed under "select/shrunk/<rank>"); otherwise the previous communicator is
  // aborted and selection runs as at creation (a fresh init).
  bool elastic = false;
  Backend* previous = nullptr;
  std::vector<int> lost_ranks;
  // A child of Communicator::Split whose parent's NCCL communicator was split for it
  // (ncclCommSplit, nccl::SplitNcclComm): where NCCL is chosen and every rank of the child still
  // holds its split communicator (agreed under "select/split/<rank>"), the backend is built on it
  // instead of a fresh init; otherwise every rank releases its own and inits afresh.
  std::shared_ptr<nccl::NcclSplitComm> nccl_split;
  // CUDA device of this rank; -1: $ADAPTCOMM_CUDA_DEVICE, else the launcher's local rank
  // (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID), else 0.
  int device = -1;
};

// Communicator::Split's part on NCCL (nccl::SplitNcclComm), here in the composition root:
// whether `parent` (a communicator's backend) can be split with ncclCommSplit; the split
// communicator for a child (`no_color` true: this rank takes part and gets none, null), within
// `bound`; and the release of one that no child adopted.
[[nodiscard]] absl::Status CanSplitParentNccl(const Backend& parent);
[[nodiscard]] absl::StatusOr<std::shared_ptr<nccl::NcclSplitComm>> SplitParentNccl(
    Backend& parent, bool no_color, int color, int key, absl::Duration bound);
void ReleaseSplitComm(nccl::NcclSplitComm& split);

// REQUIRES: options.rank/world_size resolved, `rendezvous` joined. Bounded by `deadline`.
[[nodiscard]] absl::StatusOr<SelectedBackend> SelectBackendWith(const CommunicatorOptions& options,
                                                                const Rendezvous& rendezvous,
                                                                absl::Time deadline,
                                                                const SelectionDeps& deps);

// Hierarchical composition (lib/hier/hier_backend.h), built only when asked for: ranks grouped by
// host (boot id, host name and network namespace, agreed through the store under "hier/host/"),
// an intra-host backend per host (store prefix "hier/intra/<host>"; Gloo on loopback unless
// `intra` says otherwise) and Gloo among the host leaders ("hier/inter"). Hosts are numbered in
// the order of their lowest global rank; local ranks follow global rank order.
struct IntraHostGroup {
  int host = 0;
  int local_rank = 0;
  int local_size = 1;
  std::shared_ptr<Store> store;  // already prefixed for this host's group
  absl::Time deadline;
};
struct HierarchicalDeps {
  // Builds this rank's intra-host backend (e.g. shared memory); empty: Gloo.
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(const IntraHostGroup&)> intra;
  // This rank's host identity; empty: the real one (LocalHostIdentity). Tests fake hosts here.
  std::string host_identity;
};
[[nodiscard]] absl::StatusOr<SelectedBackend> CreateHierarchicalWith(
    const CommunicatorOptions& options, const Rendezvous& rendezvous, absl::Time deadline,
    const SelectionDeps& deps, const HierarchicalDeps& hier = {});

// This job's topology as a tuned table names it (lib/config/tuned_table.h): `backend` "shm",
// "gloo" or "hier"; `hosts` and the ranks on the most crowded host; the CPU cores online here;
// Gloo's version where Gloo carries traffic (gloo, hier), else "". No GPU model: the host
// backends never use the GPU for transport (NCCL's fingerprint is the tuner plugin's).
config::TopologyFingerprint CurrentFingerprint(const std::string& backend, int hosts,
                                               int ranks_per_host);

}  // namespace adaptcomm::internal::selection

#endif  // ADAPTCOMM_LIB_CORE_SELECTION_BACKEND_SELECTION_H_

// Communicator::Split: sub-communicators with MPI_Comm_split's semantics.
//
// The (color, key) exchange goes through the parent's store rather than one of its collectives:
// it works on every backend (NCCL's collectives take device memory only) and whatever state the
// parent's backend is in, and a rank that never calls Split is named by the key it never wrote.
// Each child is then an ordinary communicator of the job, created under its own name on the job's
// store: its own rendezvous, backend choice, op sequence, failure coordination and flight record.
// On NCCL, where every rank can, the parent's NCCL communicator is split first (ncclCommSplit, a
// collective over the parent) and a child on NCCL is built on that (docs/groups.md).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "adaptcomm/communicator.h"
#include "lib/base/log.h"
#include "lib/base/store_allgather.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/core/communicator/communicator_impl.h"
#include "lib/core/selection/backend_selection.h"

namespace adaptcomm {

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Split(int color, int key,
                                                                  const SplitOptions& split) {
  internal::CommunicatorImpl& impl = *impl_;
  const CommunicatorOptions& parent = impl.options();
  const int me = rank(), world = size();
  auto what = [&] {
    return absl::StrCat("Split of communicator '", parent.name, "' on rank ", me);
  };
  if (color < kNoColor) {
    return absl::InvalidArgumentError(
        absl::StrCat(what(), ": color ", color, " is negative (kNoColor is ", kNoColor, ")"));
  }
  const std::shared_ptr<Store>& store = impl.scoped_store();
  if (store == nullptr || impl.root_store() == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(what(), ": the communicator has no store (CreateWithBackend)"));
  }
  // ncclCommSplit where the parent runs on NCCL and the child may (SplitOptions::backend unset,
  // auto or nccl): a collective over the parent, so every rank must be able to, which each one
  // says with its color.
  Backend& parent_backend = impl.executor().backend();
  const bool may_split_nccl =
      (!split.backend.has_value() || *split.backend == BackendChoice::kAuto ||
       *split.backend == BackendChoice::kNccl) &&
      internal::selection::CanSplitParentNccl(parent_backend).ok();
  const int n = impl.NextSplit();
  // Keyed by the membership too: after a shrink the same rank numbers name other processes.
  const std::string prefix = absl::StrCat("split/", n, "/e", membership().changes, "/");
  const absl::Duration bound = impl.config().timeouts.init;
  absl::StatusOr<internal::StoreGathered> gathered = internal::AllGatherThroughStore(
      *store, prefix, me, world, absl::StrCat(color, " ", key, " ", may_split_nccl ? 1 : 0),
      absl::Now() + bound);
  if (!gathered.ok()) {
    return absl::Status(gathered.status().code(),
                        absl::StrCat(what(), ": exchanging colors: ", gathered.status().message()));
  }
  if (!gathered->complete) {
    return absl::DeadlineExceededError(absl::StrCat(
        what(), ": ", gathered->DescribeMissing(), " did not call split #", n, " within ",
        absl::FormatDuration(bound), " (every rank must call Split, in the same order)"));
  }
  struct Member {
    int color, key, rank;
  };
  std::vector<Member> members;
  bool every_rank_splits_nccl = true;
  for (int r = 0; r < world; ++r) {
    const std::string& value = *gathered->values[static_cast<size_t>(r)];
    std::vector<std::string> parts = absl::StrSplit(value, ' ');
    Member m{0, 0, r};
    int nccl_ok = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &m.color) ||
        !absl::SimpleAtoi(parts[1], &m.key) || !absl::SimpleAtoi(parts[2], &nccl_ok)) {
      return absl::InternalError(absl::StrCat(what(), ": rank ", r, " published '", value, "'"));
    }
    every_rank_splits_nccl = every_rank_splits_nccl && nccl_ok == 1;
    if (m.color == color) members.push_back(m);
  }
  std::shared_ptr<nccl::NcclSplitComm> nccl_split;
  if (every_rank_splits_nccl) {
    // Nothing of the parent's may run on its communicator meanwhile: its ops issued before end
    // first. A failure here leaves this rank without a split communicator; the child's ranks then
    // agree to init NCCL afresh (SelectionDeps::nccl_split).
    // Half the bound at most: a rank whose split failed still has time to create the child.
    const absl::Time deadline = absl::Now() + bound / 2;
    absl::Status drained = impl.executor().AwaitDrained(deadline, "Split (ncclCommSplit)");
    absl::StatusOr<std::shared_ptr<nccl::NcclSplitComm>> made =
        drained.ok() ? internal::selection::SplitParentNccl(
                           parent_backend, color == kNoColor, color, key,
                           std::max(deadline - absl::Now(), absl::ZeroDuration()))
                     : absl::StatusOr<std::shared_ptr<nccl::NcclSplitComm>>(drained);
    if (made.ok()) {
      nccl_split = *std::move(made);
    } else {
      ADAPTCOMM_LOG(kWarning, what(), ": ", made.status().message(),
                    "; the child's NCCL backend is initialized afresh");
    }
  }
  if (color == kNoColor) return std::unique_ptr<Communicator>();
  std::stable_sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  CommunicatorOptions child = parent;
  child.rank = static_cast<int>(
      std::find_if(members.begin(), members.end(), [&](const Member& m) { return m.rank == me; }) -
      members.begin());
  child.world_size = static_cast<int>(members.size());
  // A set empty name is refused by creation, as any empty communicator name.
  child.name = split.name.value_or(absl::StrCat(parent.name, "/split", n, "/color", color));
  child.backend = split.backend;
  // Its own flight records, beside the parent's: the files are named by rank only.
  if (const std::string& dir = impl.config().flight_recorder.dump_dir; !dir.empty()) {
    child.flight_recorder_dir =
        absl::StrCat(dir, "/", absl::StrReplaceAll(child.name, {{"/", "."}}));
  }
  child.store = impl.root_store();
  child.elastic.join = false;
  // With the parent's seams: an injected CUDA runtime and NCCL (the fake in tests) serve the
  // child too.
  internal::CommunicatorDeps deps = impl.deps();
  deps.nccl_split = nccl_split;
  absl::StatusOr<std::unique_ptr<Communicator>> made =
      internal::CreateCommunicatorWith(child, deps);
  // Not adopted (the child chose another backend, or some rank had none): freed now, not with the
  // child.
  if (nccl_split != nullptr) internal::selection::ReleaseSplitComm(*nccl_split);
  // One family from the root down: a break of any member fails the others (communicator_family.h).
  if (made.ok()) {
    (*made)->impl_->family_member().JoinFamily(impl.family_member().family(), parent.name);
  }
  return made;
}

}  // namespace adaptcomm

// Communicator::Send / Recv: ordered ops go through Submit like every op; asynchronous ones
// (P2POptions::async) to their direction's link (P2PLinks), a communicator of two ranks made with
// this one's options and seams.
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "adaptcomm/communicator.h"
#include "lib/core/communicator/communicator_impl.h"
#include "lib/core/executor/validate.h"

namespace adaptcomm::internal {

absl::Duration CommunicatorImpl::TimeoutOr(std::optional<absl::Duration> timeout) const {
  return timeout.has_value()                 ? *timeout
         : long_operation_scopes_.load() > 0 ? config_.timeouts.long_operation
                                             : config_.timeouts.collective;
}

std::unique_ptr<P2PLinks> CommunicatorImpl::MakeLinks() const {
  CommunicatorOptions base = options_;
  base.store = rendezvous_.root_store;
  // A link is a plain pair of ranks: no elastic membership of its own (its parent's changes
  // retire the links), no joiners.
  base.elastic = ElasticOptions{};
  // Two ranks on host memory: shared memory where the parent runs on it (one host), else Gloo,
  // which reaches any pair (auto could pick NCCL, which takes no host memory).
  base.backend = std::string_view(executor_->backend().name()) == "shm" ? BackendChoice::kShm
                                                                        : BackendChoice::kGloo;
  const std::string dump_dir = config_.flight_recorder.dump_dir;
  const int me = *options_.rank;
  CommunicatorDeps deps = deps_;
  deps.nccl_split = nullptr;  // the parent's own, at its creation
  return std::make_unique<P2PLinks>(
      me,
      [base = std::move(base), dump_dir, me, deps = std::move(deps)](
          int from, int to) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        CommunicatorOptions link = base;
        link.rank = me == from ? 0 : 1;
        link.world_size = 2;
        link.name = absl::StrCat(base.name, "/p2p/", from, "-", to);
        // Its own flight records, beside the parent's (the files are named by rank only).
        if (!dump_dir.empty()) {
          link.flight_recorder_dir =
              absl::StrCat(dump_dir, "/", absl::StrReplaceAll(link.name, {{"/", "."}}));
        }
        return CreateCommunicatorWith(link, deps);
      });
}

Work CommunicatorImpl::SubmitPointToPoint(OpDesc&& desc, const P2POptions& options) {
  const OpExecutor::MembershipSnapshot members = executor_->membership();
  // The links join the ranks of the first membership; a group or a step orders its ops itself.
  if (!options.async || group_open_.load(std::memory_order_acquire) || IsDeviceOp(desc) ||
      members.epoch != 0 || rendezvous_.root_store == nullptr || executor_->StepOpen()) {
    return Submit(std::move(desc), options.timeout);
  }
  desc.timeout = TimeoutOr(options.timeout);
  if (absl::Status valid = ValidateOp(desc, members.rank, members.world_size); !valid.ok()) {
    return Work(WorkImpl::Failed(std::move(desc), std::move(valid)));
  }
  return links_->Post(std::move(desc));
}

}  // namespace adaptcomm::internal

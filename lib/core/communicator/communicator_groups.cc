// Communicator::GroupStart / GroupEnd: the ops issued in between are held here, then queued on the
// executor as one unit (OpExecutor::SubmitGroup).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adaptcomm/communicator.h"
#include "lib/core/communicator/communicator_impl.h"

namespace adaptcomm {
namespace internal {

absl::Status CommunicatorImpl::GroupStart() {
  absl::MutexLock lock(&group_mu_);
  if (group_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GroupStart on communicator '", options_.name, "': a group is already open (",
        group_->works.size(), " op(s) in it); groups do not nest: call GroupEnd first"));
  }
  group_.emplace();
  group_open_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

std::optional<Work> CommunicatorImpl::AddToGroup(OpDesc& desc, const absl::Status& valid,
                                                 int epoch) {
  absl::MutexLock lock(&group_mu_);
  if (!group_.has_value()) return std::nullopt;  // GroupEnd came meanwhile: queued alone
  if (!valid.ok() && group_->refused.ok()) group_->refused = valid;
  if (group_->epoch < 0) group_->epoch = epoch;
  // Only a host op's waiter asks the executor for help (as Submit).
  std::weak_ptr<OpExecutor> helper;
  if (!IsDeviceOp(desc)) helper = executor_;
  std::shared_ptr<WorkImpl> work = WorkImpl::Grouped(std::move(desc), std::move(helper));
  group_->works.push_back(work);
  return Work(std::move(work));
}

absl::Status CommunicatorImpl::GroupEnd() {
  OpenGroup group;
  {
    absl::MutexLock lock(&group_mu_);
    if (!group_.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("GroupEnd on communicator '", options_.name, "' without GroupStart"));
    }
    group = *std::move(group_);
    group_.reset();
    group_open_.store(false, std::memory_order_release);
  }
  if (group.works.empty()) return absl::OkStatus();
  if (!group.refused.ok()) {
    // The peers run their part of the group, which cannot complete without this rank's: in a step
    // the step cannot commit; outside one the peers fail within their timeout.
    executor_->FailStep(group.refused);
    const absl::Status failed(
        group.refused.code(),
        absl::StrCat("group of ", group.works.size(),
                     " op(s) not run: one was refused at issue: ", group.refused.message()));
    for (const std::shared_ptr<WorkImpl>& w : group.works) {
      w->EndOpenGroup();
      w->Finish(failed);
    }
    return failed;
  }
  return executor_->SubmitGroup(std::move(group.works), group.epoch);
}

absl::Status CommunicatorImpl::NoOpenGroup(const char* what) const {
  if (!group_open_.load(std::memory_order_acquire)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, " on communicator '", options_.name,
                                                    "' inside a group: call GroupEnd first"));
}

void CommunicatorImpl::DropOpenGroup() {
  std::optional<OpenGroup> group;
  {
    absl::MutexLock lock(&group_mu_);
    group.swap(group_);
    group_open_.store(false, std::memory_order_release);
  }
  if (!group.has_value()) return;
  for (const std::shared_ptr<WorkImpl>& w : group->works) {
    w->EndOpenGroup();
    w->Finish(absl::CancelledError("communicator destroyed with this op's group still open"));
  }
}

}  // namespace internal

absl::Status Communicator::GroupStart() { return impl_->GroupStart(); }
absl::Status Communicator::GroupEnd() { return impl_->GroupEnd(); }
absl::Status Communicator::Group(const std::function<void()>& issue) {
  if (absl::Status s = impl_->GroupStart(); !s.ok()) return s;
  issue();
  return impl_->GroupEnd();
}

}  // namespace adaptcomm

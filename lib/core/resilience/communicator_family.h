// CommunicatorFamily: the communicators made from one root by Split (recursively) in one process.
//
// A family fails as a whole: when one member breaks (an abort, an op failure its ranks were told
// of, a coordinated retry that failed) every other member in this process is aborted naming the
// member that broke and why, and announces it to its own ranks (FailureCoordinator::Announce), so
// the failure crosses to every process the family spans within one store round trip per member,
// instead of leaving a sibling group to wait out its op timeout. A retry that recovers is no break.
// An elastic membership change of a member that has relatives fails the whole family
// (FailedPrecondition), without announcing it: its groups no longer describe the job, and every
// process that holds the changed member went through the same agreed change.
//
// Lifetimes: the family holds its members weakly; each member holds the family. A communicator
// leaves its family first thing in its destructor, so its teardown (which aborts what is still
// pending) breaks nobody, and a member being destroyed while another breaks is aborted through
// its executor's and coordinator's own shared ownership. No lock is held while a member is
// aborted: an abort re-enters the family (the aborted member's own break), which then finds the
// family broken already.
#ifndef ADAPTCOMM_LIB_CORE_RESILIENCE_COMMUNICATOR_FAMILY_H_
#define ADAPTCOMM_LIB_CORE_RESILIENCE_COMMUNICATOR_FAMILY_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "lib/core/executor/op_executor.h"
#include "lib/core/resilience/failure_coordinator.h"

namespace adaptcomm::internal {

class CommunicatorFamily;

// One communicator's place in its family: what the family needs to abort it, owned by the
// communicator.
class FamilyMember : public std::enable_shared_from_this<FamilyMember> {
 public:
  FamilyMember(std::string name, std::weak_ptr<OpExecutor> executor,
               std::weak_ptr<FailureCoordinator> coordinator)
      : name_(std::move(name)),
        executor_(std::move(executor)),
        coordinator_(std::move(coordinator)) {}

  const std::string& name() const { return name_; }
  // "communicator 'w/dp' (child of 'w')", or "communicator 'w'" for a root.
  std::string Describe() const;
  // Its family (null once it left), and its parent's name (empty for a root).
  std::shared_ptr<CommunicatorFamily> family() const;
  // Moves it into `family` as a child of `parent` (Split, before the child is handed out).
  void JoinFamily(std::shared_ptr<CommunicatorFamily> family, std::string parent);
  // It breaks nobody any more (its destructor).
  void LeaveFamily();
  // Aborted because another member broke: tells its ranks (with `announce`), then aborts it.
  void AbortForFamily(const absl::Status& reason, bool announce = true) const;

  // The communicator broke with `cause` (the executor's break hook).
  void Broke(const absl::Status& cause) const;
  // Its membership changed (elastic shrink or admitted joiners), `reason` in words. With
  // relatives it fails the whole family, itself included, and returns that FailedPrecondition;
  // alone it returns OK (it follows the change as any communicator).
  absl::Status Changed(const std::string& reason) const;

 private:
  const std::string name_;
  const std::weak_ptr<OpExecutor> executor_;
  const std::weak_ptr<FailureCoordinator> coordinator_;
  mutable absl::Mutex mu_;
  std::shared_ptr<CommunicatorFamily> family_ ABSL_GUARDED_BY(mu_);
  std::string parent_ ABSL_GUARDED_BY(mu_);
};

class CommunicatorFamily {
 public:
  // Adds `member`. Returns the family's break when it broke already (the member is to be aborted
  // with it), else OK.
  absl::Status Add(const std::shared_ptr<FamilyMember>& member);
  void Remove(const FamilyMember* member);
  // The first break aborts every other live member with `status`; later ones change nothing.
  // With `self_too`, `from` is aborted as well.
  void Break(const FamilyMember* from, const absl::Status& status, bool self_too);
  // Live members other than `member`.
  int Relatives(const FamilyMember* member);

 private:
  absl::Mutex mu_;
  std::vector<std::weak_ptr<FamilyMember>> members_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_RESILIENCE_COMMUNICATOR_FAMILY_H_

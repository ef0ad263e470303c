#include "lib/core/resilience/communicator_family.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/log.h"

namespace adaptcomm::internal {

std::string FamilyMember::Describe() const {
  absl::MutexLock lock(&mu_);
  return parent_.empty() ? absl::StrCat("communicator '", name_, "'")
                         : absl::StrCat("communicator '", name_, "' (child of '", parent_, "')");
}

std::shared_ptr<CommunicatorFamily> FamilyMember::family() const {
  absl::MutexLock lock(&mu_);
  return family_;
}

void FamilyMember::JoinFamily(std::shared_ptr<CommunicatorFamily> family, std::string parent) {
  if (family == nullptr) return;
  std::shared_ptr<CommunicatorFamily> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::exchange(family_, family);
    parent_ = std::move(parent);
  }
  if (old != nullptr) old->Remove(this);
  // Split from a parent that broke meanwhile: the child is born into a broken family.
  if (absl::Status broken = family->Add(shared_from_this()); !broken.ok()) {
    AbortForFamily(broken);
  }
}

void FamilyMember::LeaveFamily() {
  std::shared_ptr<CommunicatorFamily> family;
  {
    absl::MutexLock lock(&mu_);
    family.swap(family_);
  }
  if (family != nullptr) family->Remove(this);
}

void FamilyMember::AbortForFamily(const absl::Status& reason, bool announce) const {
  // Told before the abort, which cancels the coordinator: its ranks in other processes abort
  // their part now rather than at their op timeout, and spread it through their own families.
  if (std::shared_ptr<FailureCoordinator> c = coordinator_.lock()) {
    if (announce) c->Announce(reason);
    c->Cancel();
  }
  if (std::shared_ptr<OpExecutor> e = executor_.lock()) e->Abort(reason);
}

void FamilyMember::Broke(const absl::Status& cause) const {
  std::shared_ptr<CommunicatorFamily> f = family();
  if (f == nullptr) return;
  f->Break(this, absl::AbortedError(absl::StrCat(Describe(), " broke: ", cause.message())),
           /*self_too=*/false);
}

absl::Status FamilyMember::Changed(const std::string& reason) const {
  std::shared_ptr<CommunicatorFamily> f = family();
  // Alone (no sub-communicators, or all destroyed): it shrinks and grows as any communicator.
  if (f == nullptr || f->Relatives(this) == 0) return absl::OkStatus();
  // The other members were built for the old world and cannot follow it on their own, and its
  // peers elsewhere may break rather than change: the family fails as a whole, the same way on
  // every rank, and the trainer rebuilds its groups.
  absl::Status failed = absl::FailedPreconditionError(absl::StrCat(
      Describe(), " changed membership (", reason,
      "): the communicators split from one root are not rebuilt member by member, so every one "
      "of them fails; destroy them and rebuild the groups with Split from a communicator of the "
      "new world"));
  f->Break(this, failed, /*self_too=*/true);
  return failed;
}

absl::Status CommunicatorFamily::Add(const std::shared_ptr<FamilyMember>& member) {
  absl::MutexLock lock(&mu_);
  members_.push_back(member);
  return broken_;
}

void CommunicatorFamily::Remove(const FamilyMember* member) {
  absl::MutexLock lock(&mu_);
  members_.erase(std::remove_if(members_.begin(), members_.end(),
                                [&](const std::weak_ptr<FamilyMember>& w) {
                                  std::shared_ptr<FamilyMember> m = w.lock();
                                  return m == nullptr || m.get() == member;
                                }),
                 members_.end());
}

int CommunicatorFamily::Relatives(const FamilyMember* member) {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const std::weak_ptr<FamilyMember>& w : members_) {
    std::shared_ptr<FamilyMember> m = w.lock();
    if (m != nullptr && m.get() != member) ++n;
  }
  return n;
}

void CommunicatorFamily::Break(const FamilyMember* from, const absl::Status& status,
                               bool self_too) {
  std::vector<std::shared_ptr<FamilyMember>> abort;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return;
    broken_ = status;
    for (const std::weak_ptr<FamilyMember>& w : members_) {
      std::shared_ptr<FamilyMember> m = w.lock();
      if (m != nullptr && (self_too || m.get() != from)) abort.push_back(std::move(m));
    }
  }
  if (abort.empty()) return;
  ADAPTCOMM_LOG(kError, status.message(), "; aborting ", abort.size(),
                " communicator(s) of its Split family in this process");
  // A membership change is not announced: it was agreed by a vote of the changed member's ranks,
  // so every process that holds it fails its own family the same way, and any relative elsewhere
  // is a descendant of a root those processes hold too. Announcing it would abort peers still
  // building the new world's backend, which leaves the others waiting in that rendezvous.
  for (const std::shared_ptr<FamilyMember>& m : abort) m->AbortForFamily(status, !self_too);
}

}  // namespace adaptcomm::internal

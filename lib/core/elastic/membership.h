// Elastic membership (issue #14): what a lost rank does to a communicator, and what a membership
// change does to the ops that were issued before it.
//
// A change is agreed by the coordinated retry's vote (FailureCoordinator): the ranks that voted
// within the loss window survive, renumbered densely in their old order; the store decides the
// set once per generation ("members/<g>"), so every survivor applies the same one.
#ifndef ADAPTCOMM_LIB_CORE_ELASTIC_MEMBERSHIP_H_
#define ADAPTCOMM_LIB_CORE_ELASTIC_MEMBERSHIP_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/ext/backend.h"
#include "adaptcomm/profile.h"

namespace adaptcomm::internal {

// One membership change, from the old world's numbering to the new one's.
struct MembershipChange {
  int old_world = 0;
  int new_rank = 0;
  int new_world = 0;
  std::vector<int> old_to_new;  // indexed by old rank: its new rank, -1 when lost
  std::vector<int> lost;        // old ranks, ascending
  // Grow: the ids (ranks at creation, or assigned at admission) of the ranks appended after the
  // old ones, which keep their numbers (old_to_new is the identity).
  std::vector<int> joined_ids;
  std::string reason;  // "rank 2 lost (did not vote within 2s: dead or stalled); ..."
};

// What the communicator does with a lost rank, as its parts use it.
struct ElasticPolicy {
  bool elastic = false;         // anything but fail: the survivors agree on a membership
  bool shrink_on_loss = false;  // once the window ran out: shrink (else fail every rank)
  int min_world_size = 1;
  // How long after a retry began a rank that has not voted is lost (loss window, plus the
  // replacement timeout for wait_for_replacement).
  absl::Duration loss_window = absl::Seconds(5);
  std::string name = "fail";  // "fail", "shrink", "wait_for_replacement"
};
// The loss policy of the effective elastic.* settings (EffectiveConfig::elastic, where every source
// of them is already merged).
ElasticPolicy ElasticPolicyOf(const ElasticSettings& settings);
// The policy in words, as members and joiners compare it: "elastic.on_loss=shrink
// elastic.min_world_size=2 loss_window=1s" (wait_for_replacement adds elastic.after_timeout).
std::string ElasticLimits(const ElasticPolicy& policy);

// `op`, issued under the membership before `changes` (oldest first), as it reads on the newest:
// root and peer renumbered. A membership-changed status (IsMembershipChanged) when its meaning
// does not survive: its shapes depend on the world size (allgather, reduce_scatter, alltoall) or
// its root or peer was lost.
[[nodiscard]] absl::StatusOr<OpDesc> TranslateOp(
    const OpDesc& op, const std::vector<const MembershipChange*>& changes);

// The membership-changed status for `what` after `change`.
absl::Status MembershipChangedError(const MembershipChange& change, const std::string& what);

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_ELASTIC_MEMBERSHIP_H_

#include "lib/core/elastic/membership.h"

#include "absl/strings/str_cat.h"
#include "adaptcomm/status.h"

namespace adaptcomm::internal {

ElasticPolicy ElasticPolicyOf(const ElasticSettings& s) {
  ElasticPolicy p;
  p.name = s.on_loss;
  p.min_world_size = s.min_world_size;
  p.loss_window = s.loss_window;
  if (s.on_loss == "shrink") {
    p.elastic = true;
    p.shrink_on_loss = true;
  } else if (s.on_loss == "wait_for_replacement") {
    p.elastic = true;
    p.shrink_on_loss = s.after_timeout == "shrink";
    p.loss_window += s.replacement_timeout;
  } else {
    p.name = "fail";
  }
  return p;
}

std::string ElasticLimits(const ElasticPolicy& policy) {
  // wait_for_replacement names two policies: what it does once the wait ran out tells them apart.
  const std::string after = policy.name != "wait_for_replacement" ? ""
                            : policy.shrink_on_loss               ? " elastic.after_timeout=shrink"
                                                                  : " elastic.after_timeout=fail";
  return absl::StrCat("elastic.on_loss=", policy.name, after,
                      " elastic.min_world_size=", policy.min_world_size,
                      " loss_window=", absl::FormatDuration(policy.loss_window));
}

absl::Status MembershipChangedError(const MembershipChange& change, const std::string& what) {
  return adaptcomm::MembershipChangedError(
      change.new_world,
      absl::StrCat(change.reason, "; ", what, ": not run on the new membership, redo the step"));
}

absl::StatusOr<OpDesc> TranslateOp(const OpDesc& op,
                                   const std::vector<const MembershipChange*>& changes) {
  OpDesc out = op;
  if (changes.empty()) return out;
  const MembershipChange& last = *changes.back();
  const std::string name = absl::StrCat(OpKindName(op.kind), " #", op.seq);
  switch (op.kind) {
    case OpKind::kAllgather:
    case OpKind::kReduceScatter:
    case OpKind::kAlltoall:
      return MembershipChangedError(last, absl::StrCat(name, " depends on the world size"));
    default:
      break;
  }
  const bool rooted = op.kind == OpKind::kBroadcast || op.kind == OpKind::kReduce;
  const bool p2p = op.kind == OpKind::kSend || op.kind == OpKind::kRecv;
  for (const MembershipChange* c : changes) {
    int* who = rooted ? &out.root : p2p ? &out.peer : nullptr;
    if (who == nullptr) continue;
    const int was = *who;
    if (was < 0 || was >= static_cast<int>(c->old_to_new.size()) || c->old_to_new[was] < 0) {
      return MembershipChangedError(
          *c, absl::StrCat(name, "'s ", rooted ? "root" : "peer", " (rank ", was, ") was lost"));
    }
    *who = c->old_to_new[was];
  }
  return out;
}

}  // namespace adaptcomm::internal

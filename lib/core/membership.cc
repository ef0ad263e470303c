#include "lib/core/membership.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/status.h"

namespace adaptcomm::internal {

absl::StatusOr<ElasticPolicy> ResolveElasticPolicy(const ElasticOptions& given,
                                                   const ElasticSettings& profile) {
  // API > environment (`adaptcomm launch --elastic` exports these) > profile.
  ElasticOptions options = given;
  if (const char* env = std::getenv("ADAPTCOMM_ELASTIC");
      env != nullptr && *env != '\0' && options.on_loss == LossPolicy::kProfile) {
    const std::string v = env;
    if (v != "fail" && v != "shrink" && v != "wait_for_replacement") {
      return absl::InvalidArgumentError(
          absl::StrCat("ADAPTCOMM_ELASTIC=", v, ": must be fail, shrink or wait_for_replacement"));
    }
    options.on_loss = v == "shrink"                 ? LossPolicy::kShrink
                      : v == "wait_for_replacement" ? LossPolicy::kWaitForReplacement
                                                    : LossPolicy::kFail;
  }
  if (const char* env = std::getenv("ADAPTCOMM_ELASTIC_MIN_WORLD");
      env != nullptr && *env != '\0' && options.min_world_size == 0) {
    int v = 0;
    if (!absl::SimpleAtoi(env, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("ADAPTCOMM_ELASTIC_MIN_WORLD=", env, ": must be a positive integer"));
    }
    options.min_world_size = v;
  }
  auto from_name = [](const std::string& name) {
    return name == "shrink"                 ? LossPolicy::kShrink
           : name == "wait_for_replacement" ? LossPolicy::kWaitForReplacement
                                            : LossPolicy::kFail;
  };
  const LossPolicy on_loss =
      options.on_loss == LossPolicy::kProfile ? from_name(profile.on_loss) : options.on_loss;
  const LossPolicy after = options.after_timeout == LossPolicy::kProfile
                               ? from_name(profile.after_timeout)
                               : options.after_timeout;
  if (on_loss == LossPolicy::kWaitForReplacement && after != LossPolicy::kShrink &&
      after != LossPolicy::kFail) {
    return absl::InvalidArgumentError(
        "elastic.after_timeout must be shrink or fail (what wait_for_replacement does once the "
        "wait ran out)");
  }
  ElasticPolicy p;
  p.min_world_size = options.min_world_size > 0 ? options.min_world_size : profile.min_world_size;
  if (options.min_world_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("elastic.min_world_size must be positive, got ", options.min_world_size));
  }
  p.loss_window =
      options.loss_window > absl::ZeroDuration() ? options.loss_window : profile.loss_window;
  const absl::Duration wait = options.replacement_timeout > absl::ZeroDuration()
                                  ? options.replacement_timeout
                                  : profile.replacement_timeout;
  switch (on_loss) {
    case LossPolicy::kShrink:
      p.elastic = true;
      p.shrink_on_loss = true;
      p.name = "shrink";
      break;
    case LossPolicy::kWaitForReplacement:
      p.elastic = true;
      p.shrink_on_loss = after == LossPolicy::kShrink;
      p.loss_window += wait;
      p.name = "wait_for_replacement";
      break;
    default:
      break;
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

#include "lib/core/resilience/failure_coordinator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "lib/base/log.h"
#include "lib/base/store_allgather.h"
#include "lib/core/resilience/failure_protocol.h"
#include "lib/trace/culprit.h"

namespace adaptcomm::internal {
namespace {

using failure_protocol::AckKey;
using failure_protocol::FailureKey;
using failure_protocol::kFailPrefix;
using failure_protocol::kRetryPrefix;
using failure_protocol::Publish;
using failure_protocol::StoreUnreachable;
using failure_protocol::Wake;
using failure_protocol::WakeKey;

constexpr char kShutdown[] = "shutdown";
// Long enough to be cheap, short enough that a store that vanished is noticed.
constexpr absl::Duration kListenSlice = absl::Seconds(30);

std::string VoteKey(int generation, int rank) {
  return absl::StrCat("vote/", generation, "/", rank);
}
std::string MembersKey(int generation) { return absl::StrCat("members/", generation); }
// The votes of a generation are gathered as lib/base/store_allgather.h gathers: each voter adds
// to VoteCountKey, and the one whose vote completes the count publishes every vote under
// VotesKey, so a waiting rank polls one key, not one per member (N^2 requests per vote at N
// ranks otherwise). After a loss, the rank that decides the survivors publishes their votes.
std::string VoteCountKey(int generation) { return absl::StrCat("vote/", generation, "/count"); }
std::string VotesKey(int generation) { return absl::StrCat("vote/", generation, "/all"); }
std::string SurvivorVotesKey(int generation) {
  return absl::StrCat(MembersKey(generation), "/votes");
}
// How many ranks have left the communicator (LeaveRendezvous adds to it).
constexpr char kDepartedCount[] = "left";
// The first voters of a generation wake the other members; every later voter was woken already
// or is voting anyway, and a wake-up is two store requests per member. Two, in opposite orders,
// so that one voter dying mid-way leaves no member unwoken.
constexpr int kWakers = 2;
// How long one poll for the gathered votes waits at the store.
constexpr absl::Duration kVotePoll = absl::Milliseconds(50);
// Every key's value, "" where absent; the error of a store that cannot be reached.
absl::StatusOr<std::vector<std::string>> ReadVotes(Store& store,
                                                   const std::vector<std::string>& keys) {
  std::vector<std::string> votes;
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> v = store.Get(key, absl::ZeroDuration());
    if (!v.ok() && StoreUnreachable(v.status())) return v.status();
    votes.push_back(v.value_or(""));
  }
  return votes;
}

}  // namespace

// The listener's world. Everything it uses after Stop() is owned here; the communicator's
// recorder and callbacks are reached only under `mu` while `stopped` is false.
struct FailureCoordinator::Listener {
  Listener(int rank, std::string name, std::shared_ptr<Store> store, bool rank0_serves_store)
      : rank(rank),
        name(std::move(name)),
        store(std::move(store)),
        rank0_serves_store(rank0_serves_store) {}

  // Runs fn(recorder, abort, join_retry) unless Stop() came first.
  template <typename Fn>
  void Deliver(Fn fn) {
    absl::MutexLock lock(&mu);
    if (!stopped) fn(recorder, abort, join_retry);
  }
  bool Stopped() {
    absl::MutexLock lock(&mu);
    return stopped;
  }

  const int rank;
  const std::string name;
  const std::shared_ptr<Store> store;
  const bool rank0_serves_store;
  absl::Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  trace::FlightRecorder* recorder ABSL_GUARDED_BY(mu) = nullptr;
  std::function<void(const absl::Status&)> abort ABSL_GUARDED_BY(mu);
  std::function<void(int)> join_retry ABSL_GUARDED_BY(mu);
  absl::Notification done;
};

FailureCoordinator::FailureCoordinator(FailureCoordinatorOptions options,
                                       std::shared_ptr<Store> store,
                                       trace::FlightRecorder* recorder)
    : options_(std::move(options)), store_(std::move(store)), recorder_(recorder) {
  absl::MutexLock lock(&members_mu_);
  members_ = options_.initial_members;
  if (members_.empty()) {
    for (int r = 0; r < options_.world_size; ++r) members_.push_back(r);
  }
}

void FailureCoordinator::SetMembers(std::vector<int> ids) {
  absl::MutexLock lock(&members_mu_);
  members_ = std::move(ids);
}

std::vector<int> FailureCoordinator::Members() const {
  absl::MutexLock lock(&members_mu_);
  return members_;
}

FailureCoordinator::~FailureCoordinator() { Stop(); }

void FailureCoordinator::Start(std::function<void(const absl::Status&)> abort,
                               std::function<void(int)> join_retry, BackendRebuilder rebuilder) {
  rebuilder_ = std::move(rebuilder);
  listener_ =
      std::make_shared<Listener>(options_.rank, options_.name, store_, options_.rank0_serves_store);
  {
    absl::MutexLock lock(&listener_->mu);
    listener_->recorder = recorder_;
    listener_->abort = std::move(abort);
    listener_->join_retry = std::move(join_retry);
  }
  // Detached: Stop() waits for it only up to its bound, and it owns what it touches after that.
  std::thread([listener = listener_] { Listen(listener); }).detach();
}

void FailureCoordinator::Stop() {
  Cancel();
  if (listener_ == nullptr) return;
  {
    absl::MutexLock lock(&listener_->mu);
    if (listener_->stopped) return;
    listener_->stopped = true;
  }
  // The wake goes out on a thread of its own: on a store that does not answer (flooded, cut off,
  // rank 0 gone) it blocks for the store's own I/O bound, far past the teardown's.
  std::thread([store = store_, rank = options_.rank] {
    (void)Wake(*store, rank, kShutdown);
  }).detach();
  if (!listener_->done.WaitForNotificationWithTimeout(options_.stop_bound)) {
    ADAPTCOMM_LOG(kWarning, "communicator '", options_.name,
                  "': the failure listener did not leave its store wait within ",
                  absl::FormatDuration(options_.stop_bound),
                  " (the store is unreachable or overloaded); leaving it behind");
  }
}

bool FailureCoordinator::Retryable(const absl::Status& status) const {
  if (absl::IsInvalidArgument(status)) return false;
  for (absl::StatusCode code : options_.retryable) {
    if (status.code() == code) return true;
  }
  return false;
}

absl::Duration FailureCoordinator::Backoff(int attempt) const {
  absl::Duration d = options_.initial_backoff;
  for (int i = 1; i < attempt; ++i) d = d * options_.backoff_multiplier;
  d = std::min(d, options_.max_backoff);
  // Jitter spreads the reconnect storm of a large job; it need not agree across ranks, since
  // the rebuild waits for everyone anyway.
  const double u = static_cast<double>(std::rand()) / RAND_MAX;
  return d * (1.0 + options_.jitter * (2.0 * u - 1.0));
}

void FailureCoordinator::Listen(std::shared_ptr<Listener> listener) {
  Store& store = *listener->store;
  const int rank = listener->rank;
  for (int64_t next = 1; !listener->Stopped(); ++next) {
    absl::StatusOr<std::string> wake = store.Get(WakeKey(rank, next), kListenSlice);
    if (!wake.ok()) {
      --next;  // retry the same number
      if (absl::IsDeadlineExceeded(wake.status())) continue;
      absl::Status lost = absl::UnavailableError(absl::StrCat(
          "communicator '", listener->name, "' lost its store (", wake.status().message(), "); ",
          listener->rank0_serves_store
              ? "rank 0 at creation, which serves the store, may be gone: the job cannot go on "
                "without it"
              : "the process that serves it may be gone, or this rank is cut off"));
      listener->Deliver([&](trace::FlightRecorder* recorder, auto& abort, auto&) {
        ADAPTCOMM_LOG(kError, lost.message());
        if (recorder != nullptr) (void)recorder->Dump(std::string(lost.message()));
        abort(lost);
      });
      break;
    }
    if (*wake == kShutdown) break;
    if (absl::StartsWith(*wake, kRetryPrefix)) {
      int generation = 0;
      if (absl::SimpleAtoi(wake->substr(strlen(kRetryPrefix)), &generation)) {
        listener->Deliver([&](auto*, auto&, auto& join_retry) { join_retry(generation); });
      }
      continue;
    }
    int failed_rank = -1;
    (void)absl::SimpleAtoi(wake->substr(strlen(kFailPrefix)), &failed_rank);
    std::string detail = store.Get(FailureKey(failed_rank), absl::Seconds(5)).value_or("?");
    // The rank that reported first is not necessarily the one at fault (its link to a dead peer
    // broke first): say "reported", and let the reporter's final error name who went silent.
    absl::Status reason =
        absl::AbortedError(absl::StrCat("rank ", failed_rank, " reported a failure (", detail,
                                        "); rank ", rank, " aborts its pending operations"));
    // Dump before acknowledging, so the failed rank finds every dump once all have answered.
    listener->Deliver([&](trace::FlightRecorder* recorder, auto& abort, auto&) {
      ADAPTCOMM_LOG(kError, reason.message());
      if (recorder != nullptr) (void)recorder->Dump(std::string(reason.message()));
      abort(reason);
    });
    (void)Publish(store, AckKey(rank), "aborting");
    break;
  }
  listener->done.Notify();
}

absl::Status FailureCoordinator::CutOff(const absl::Status& store_error,
                                        const absl::Status& cause) {
  // This rank cannot see the votes, so it cannot say who is missing; what it knows is that it is
  // cut off from the store: its own link is down, or the store's server is gone. When rank 0
  // serves the store, rank 0's death looks the same here, and ends the job.
  vote_failed_.store(true);
  store_unreachable_.store(true);
  const std::string why =
      options_.rank0_serves_store && options_.rank != 0
          ? "rank 0 at creation, which serves the store, is gone or unreachable, or this rank "
            "is cut off: without the store the job cannot go on (`adaptcomm launch --elastic` "
            "serves the store apart from rank 0, ADAPTCOMM_STORE_EXTERNAL=1)"
          : "this rank is cut off from the job";
  absl::Status failed = absl::UnavailableError(
      absl::StrCat("coordinated retry of communicator '", options_.name, "' impossible: rank ",
                   options_.rank, " cannot reach the store (", store_error.message(), "): ", why,
                   "; first error here: ", cause.message()));
  if (recorder_ != nullptr) (void)recorder_->Dump(std::string(failed.message()));
  return failed;
}

absl::StatusOr<std::vector<int>> FailureCoordinator::DecideMembers(
    int generation, const std::vector<int>& members, absl::Time deadline, const absl::Status& cause,
    std::vector<std::string>* survivor_votes) {
  // The first rank to claim the decision writes the set it sees now; every other rank reads it.
  // One key per generation, set once: every survivor applies the same set (no split brain).
  const std::string key = MembersKey(generation);
  absl::StatusOr<int64_t> claim = store_->Add(absl::StrCat(key, "/claim"), 1);
  if (!claim.ok()) return CutOff(claim.status(), cause);
  std::string decision;
  if (*claim == 1) {
    std::vector<int> present, lost;
    std::vector<std::string> present_votes;
    for (size_t i = 0; i < members.size(); ++i) {
      absl::StatusOr<std::string> vote =
          store_->Get(VoteKey(generation, members[i]), absl::ZeroDuration());
      (vote.ok() ? present : lost).push_back(members[i]);
      if (vote.ok()) present_votes.push_back(*std::move(vote));
    }
    // Before the decision, so that every survivor that reads an "ok" finds them.
    (void)Publish(*store_, SurvivorVotesKey(generation), EncodeGathered(present_votes), deadline,
                  &cancelled_);
    std::vector<int> lost_ranks;  // in the current numbering
    for (size_t i = 0; i < members.size(); ++i) {
      if (std::find(lost.begin(), lost.end(), members[i]) != lost.end()) {
        lost_ranks.push_back(static_cast<int>(i));
      }
    }
    if (lost.empty()) {
      decision = absl::StrCat("ok|", absl::StrJoin(present, ","));
    } else if (!options_.elastic.shrink_on_loss) {
      decision = absl::StrCat(
          "fail|rank(s) ", absl::StrJoin(lost_ranks, ", "), " did not vote within ",
          absl::FormatDuration(options_.elastic.loss_window),
          " (dead or stalled; elastic.on_loss: ", options_.elastic.name, ", then fail)");
    } else if (static_cast<int>(present.size()) < options_.elastic.min_world_size) {
      decision = absl::StrCat(
          "fail|rank(s) ", absl::StrJoin(lost_ranks, ", "), " lost (did not vote within ",
          absl::FormatDuration(options_.elastic.loss_window), "); ", present.size(),
          " rank(s) left, below elastic.min_world_size ", options_.elastic.min_world_size);
    } else {
      decision = absl::StrCat("ok|", absl::StrJoin(present, ","));
    }
    if (absl::Status s = Publish(*store_, key, decision, deadline, &cancelled_); !s.ok()) {
      return CutOff(s, cause);
    }
  } else {
    absl::StatusOr<std::string> got =
        store_->Get(key, std::max(deadline - absl::Now(), absl::Seconds(5)));
    if (!got.ok()) {
      if (StoreUnreachable(got.status()) && !absl::IsDeadlineExceeded(got.status())) {
        return CutOff(got.status(), cause);
      }
      return absl::UnavailableError(absl::StrCat(
          "membership of communicator '", options_.name, "' for generation ", generation,
          " was never decided (the rank that claimed it is gone: ", got.status().message(),
          "); first error here: ", cause.message()));
    }
    decision = *got;
  }
  std::vector<std::string> parts = absl::StrSplit(decision, absl::MaxSplits('|', 1));
  if (parts.size() != 2 || parts[0] != "ok") {
    vote_failed_.store(true);
    decided_by_store_.store(true);
    return absl::UnavailableError(absl::StrCat(
        "coordinated retry of communicator '", options_.name, "' impossible: ",
        parts.size() == 2 ? parts[1] : decision, "; first error here: ", cause.message()));
  }
  std::vector<int> survivors;
  for (absl::string_view id : absl::StrSplit(parts[1], ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(id, &v)) survivors.push_back(v);
  }
  if (std::find(survivors.begin(), survivors.end(), options_.rank) == survivors.end()) {
    vote_failed_.store(true);
    decided_by_store_.store(true);
    return absl::UnavailableError(absl::StrCat(
        "communicator '", options_.name, "': this rank (rank ", options_.rank,
        " at creation) did not vote within ", absl::FormatDuration(options_.elastic.loss_window),
        " and the other ranks went on without it (elastic.on_loss: ", options_.elastic.name,
        "); first error here: ", cause.message()));
  }
  // Missing (a decider from before the votes were published with the decision): Recover reads
  // each survivor's vote instead.
  if (absl::StatusOr<std::string> votes =
          store_->Get(SurvivorVotesKey(generation), absl::ZeroDuration());
      votes.ok()) {
    absl::StatusOr<std::vector<std::string>> decoded =
        DecodeGathered(*votes, static_cast<int>(survivors.size()));
    if (decoded.ok()) *survivor_votes = *std::move(decoded);
  }
  return survivors;
}

namespace {

// What the votes of a coordinated retry say (FailureCoordinator's comment has their format).
struct VoteTally {
  uint64_t restart = 0;       // the smallest position
  uint64_t max_position = 0;  // the largest position
  uint64_t max_issued = 0;    // the last seq any rank issued
  bool degrade = false;       // any rank's wish
};

// Tallies the votes (one per member, "" where absent); InvalidArgument if ranks at the same
// position are in different ops (mismatched collectives, which no retry can help).
absl::StatusOr<VoteTally> TallyVotes(const std::vector<std::string>& votes, uint64_t position,
                                     uint64_t issued_through, const std::string& name) {
  VoteTally tally{position, position, issued_through, false};
  // Ranks at the same position must be in the same op; if not, the collectives are mismatched
  // and no retry can help.
  std::map<uint64_t, std::map<std::string, std::vector<int>>> ops_at;
  for (int r = 0; r < static_cast<int>(votes.size()); ++r) {
    if (votes[r].empty()) continue;  // absent
    std::vector<std::string> parts = absl::StrSplit(votes[r], absl::MaxSplits('|', 3));
    uint64_t p = 0, issued = 0;
    if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &p) ||
        !absl::SimpleAtoi(parts[2], &issued)) {
      continue;
    }
    tally.restart = std::min(tally.restart, p);
    tally.max_position = std::max(tally.max_position, p);
    tally.max_issued = std::max(tally.max_issued, issued);
    tally.degrade = tally.degrade || parts[1] == "1";
    if (!parts[3].empty()) ops_at[p][parts[3]].push_back(r);
  }
  for (const auto& [seq, ops] : ops_at) {
    if (ops.size() < 2) continue;
    std::vector<std::string> who;
    for (const auto& [op, ranks] : ops) {
      who.push_back(absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","),
                                 " called ", op));
    }
    return absl::InvalidArgumentError(absl::StrCat("mismatched collectives at #", seq,
                                                   " of communicator '", name,
                                                   "': ", absl::StrJoin(who, "; "),
                                                   " (not retried: every rank must issue the "
                                                   "same collectives in the same order)"));
  }
  return tally;
}

}  // namespace

absl::Status FailureCoordinator::CastVote(int generation, uint64_t position,
                                          uint64_t issued_through, const std::string& fingerprint,
                                          const std::vector<int>& members, absl::Time deadline) {
  const bool wants_degrade = rebuilder_.wants_degrade && rebuilder_.wants_degrade();
  absl::Status store_error = Publish(
      *store_, VoteKey(generation, options_.rank),
      absl::StrCat(position, "|", wants_degrade ? 1 : 0, "|", issued_through, "|", fingerprint),
      deadline, &cancelled_);
  if (!store_error.ok()) return store_error;
  absl::StatusOr<int64_t> order = store_->Add(VoteCountKey(generation), 1);
  if (!order.ok()) return order.status();
  if (*order == static_cast<int64_t>(members.size())) {
    // The last vote in: publish them all (best effort; waiters read each key if this fails).
    std::vector<std::string> keys;
    for (int id : members) keys.push_back(VoteKey(generation, id));
    absl::StatusOr<std::vector<std::string>> votes = ReadVotes(*store_, keys);
    if (votes.ok() && std::none_of(votes->begin(), votes->end(),
                                   [](const std::string& v) { return v.empty(); })) {
      (void)Publish(*store_, VotesKey(generation), EncodeGathered(*votes), deadline, &cancelled_);
    }
  }
  if (*order > kWakers) return absl::OkStatus();
  // The wake-ups stop at the first store error but do not fail the vote: the polling that
  // follows finds out whether the store is gone.
  absl::Status woken;
  for (size_t i = 0; i < members.size() && woken.ok(); ++i) {
    const int member = members[*order == 1 ? i : members.size() - 1 - i];
    if (member != options_.rank) {
      woken = Wake(*store_, member, absl::StrCat(kRetryPrefix, generation), deadline, &cancelled_);
    }
  }
  return absl::OkStatus();
}

absl::Status FailureCoordinator::ScanVotes(const std::vector<int>& members,
                                           const std::vector<std::string>& keys,
                                           std::vector<int>& missing, std::vector<int>& departed) {
  missing.clear();
  departed.clear();
  for (size_t r = 0; r < members.size(); ++r) {
    absl::StatusOr<std::string> vote = store_->Get(keys[r], absl::ZeroDuration());
    if (vote.ok()) continue;
    if (StoreUnreachable(vote.status())) return vote.status();
    (store_->Get(absl::StrCat("left/", members[r]), absl::ZeroDuration()).ok() ? departed : missing)
        .push_back(static_cast<int>(r));
  }
  return absl::OkStatus();
}

absl::Status FailureCoordinator::AwaitVotes(int generation, const std::vector<int>& members,
                                            const std::vector<std::string>& keys, bool elastic,
                                            absl::Time deadline, const absl::Status& cause,
                                            std::vector<int>& missing, std::vector<int>& departed,
                                            std::vector<std::string>& votes) {
  absl::Status store_error;
  // A round that cannot reach the store ends early and is tried again (a link may flap back
  // before the deadline); the last round's error decides whether this rank was cut off.
  while (true) {
    missing.clear();
    departed.clear();
    store_error = absl::OkStatus();
    const absl::Duration slice =
        std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kVotePoll);
    absl::StatusOr<std::string> all = store_->Get(VotesKey(generation), slice);
    if (all.ok()) {
      absl::StatusOr<std::vector<std::string>> decoded =
          DecodeGathered(*all, static_cast<int>(members.size()));
      if (decoded.ok()) {
        votes = *std::move(decoded);
        return absl::OkStatus();
      }
    } else if (!absl::IsDeadlineExceeded(all.status()) && !absl::IsNotFound(all.status())) {
      store_error = all.status();
    }
    if (cancelled_.load()) {
      return absl::AbortedError(absl::StrCat("communicator '", options_.name,
                                             "' was aborted during a coordinated retry vote; "
                                             "first error here: ",
                                             cause.message()));
    }
    // A rank that destroyed its communicator ("left/<r>") will never vote, and saying so at once
    // beats waiting out the deadline: only then (rare) is every member's key read each round.
    const bool someone_left =
        store_error.ok() && store_->Get(kDepartedCount, absl::ZeroDuration()).value_or("0") != "0";
    const bool last_round = absl::Now() >= deadline;
    if (store_error.ok() && (someone_left || (last_round && !elastic))) {
      store_error = ScanVotes(members, keys, missing, departed);
    }
    if ((store_error.ok() && someone_left && missing.empty() && (elastic || departed.empty())) ||
        (!elastic && !departed.empty()) || last_round) {
      break;
    }
    if (!store_error.ok()) absl::SleepFor(absl::Milliseconds(10));
  }
  if (!store_error.ok()) return CutOff(store_error, cause);
  return absl::OkStatus();
}

absl::Status FailureCoordinator::VoteFailed(const std::vector<int>& missing,
                                            const std::vector<int>& departed,
                                            const absl::Status& cause) {
  std::string who;
  if (!departed.empty()) {
    absl::StrAppend(&who, "rank(s) ", absl::StrJoin(departed, ", "),
                    " already destroyed the communicator");
  }
  if (!missing.empty()) {
    absl::StrAppend(&who, who.empty() ? "" : "; ", "rank(s) ", absl::StrJoin(missing, ", "),
                    " did not vote within ", absl::FormatDuration(options_.vote_timeout),
                    " (dead or stalled)");
  }
  vote_failed_.store(true);
  absl::Status failed = absl::UnavailableError(
      absl::StrCat("coordinated retry of communicator '", options_.name, "' impossible: ", who,
                   "; first error here: ", cause.message()));
  if (recorder_ != nullptr) (void)recorder_->Dump(std::string(failed.message()));
  return failed;
}

MembershipChange FailureCoordinator::ChangeMembership(const std::vector<int>& members,
                                                      const std::vector<int>& survivors,
                                                      int generation, const absl::Status& cause) {
  MembershipChange c;
  c.old_world = static_cast<int>(members.size());
  c.new_world = static_cast<int>(survivors.size());
  c.old_to_new.assign(members.size(), -1);
  for (size_t i = 0; i < members.size(); ++i) {
    auto it = std::find(survivors.begin(), survivors.end(), members[i]);
    if (it == survivors.end()) {
      c.lost.push_back(static_cast<int>(i));
    } else {
      c.old_to_new[i] = static_cast<int>(it - survivors.begin());
    }
    if (members[i] == options_.rank) c.new_rank = c.old_to_new[i];
  }
  std::vector<std::string> lost_names;
  for (int r : c.lost) {
    lost_names.push_back(members[r] == r ? absl::StrCat(r)
                                         : absl::StrCat(r, " (rank ", members[r], " at creation)"));
  }
  c.reason = absl::StrCat(
      "rank(s) ", absl::StrJoin(lost_names, ", "), " of ", c.old_world, " lost (no vote within ",
      absl::FormatDuration(options_.elastic.loss_window), ": dead, stalled or cut off); world ",
      c.old_world, " -> ", c.new_world, " at generation ", generation,
      " (elastic.on_loss: ", options_.elastic.name, ")");
  ADAPTCOMM_LOG(kError, "communicator '", options_.name, "': ", c.reason, "; this rank is now ",
                c.new_rank, " (cause: ", cause.message(), ")");
  if (recorder_ != nullptr) (void)recorder_->Dump(c.reason);
  {
    absl::MutexLock lock(&members_mu_);
    members_ = survivors;
  }
  return c;
}

absl::Status FailureCoordinator::WaitBackoff(int attempt, const absl::Status& cause) {
  // The backoff ends early if the communicator is aborted.
  const absl::Time until = absl::Now() + Backoff(attempt);
  while (absl::Now() < until && !cancelled_.load()) {
    absl::SleepFor(std::min(until - absl::Now(), absl::Milliseconds(10)));
  }
  if (cancelled_.load()) {
    return absl::AbortedError(absl::StrCat("communicator '", options_.name,
                                           "' was aborted during a coordinated retry; first "
                                           "error here: ",
                                           cause.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<RecoveryPlan> FailureCoordinator::Recover(int generation, uint64_t position,
                                                         uint64_t issued_through,
                                                         const std::string& fingerprint,
                                                         int attempt, const absl::Status& cause) {
  ADAPTCOMM_LOG(kWarning, "coordinated retry: rank ", options_.rank, " votes to build generation ",
                generation, " from op #", position, " (attempt ", attempt + 1, " of ",
                options_.max_attempts, "; cause: ", cause.message(), ")");
  // The record at the moment of the fault says who was behind (`adaptcomm trace culprit`).
  if (recorder_ != nullptr) {
    (void)recorder_->Dump(
        absl::StrCat("coordinated retry to generation ", generation, ": ", cause.message()));
  }
  const std::vector<int> members = Members();
  const bool elastic = options_.elastic.elastic;
  const absl::Time started = absl::Now();
  // Elastic: a rank that has not voted by the loss deadline is lost; the store requests around the
  // decision get a little more than that.
  const absl::Time loss_deadline = started + options_.elastic.loss_window;
  const absl::Time vote_deadline =
      started +
      (elastic ? std::max(options_.vote_timeout, options_.elastic.loss_window + absl::Seconds(5))
               : options_.vote_timeout);
  if (absl::Status s =
          CastVote(generation, position, issued_through, fingerprint, members, vote_deadline);
      !s.ok()) {
    return CutOff(s, cause);
  }
  std::vector<std::string> keys;
  for (int id : members) keys.push_back(VoteKey(generation, id));
  std::vector<int> missing, departed;  // current ranks
  std::vector<std::string> votes;      // one per key, once gathered
  if (absl::Status s =
          AwaitVotes(generation, members, keys, elastic, elastic ? loss_deadline : vote_deadline,
                     cause, missing, departed, votes);
      !s.ok()) {
    return s;
  }
  // Elastic: the members that go on, as the store decided (the same on every survivor).
  std::vector<int> survivors = members;
  if (elastic) {
    std::vector<std::string> survivor_votes;
    absl::StatusOr<std::vector<int>> decided =
        DecideMembers(generation, members, vote_deadline, cause, &survivor_votes);
    if (!decided.ok()) {
      if (recorder_ != nullptr) (void)recorder_->Dump(std::string(decided.status().message()));
      return decided.status();
    }
    survivors = *std::move(decided);
    if (survivors != members) {
      keys.clear();
      for (int id : survivors) keys.push_back(VoteKey(generation, id));
      votes = std::move(survivor_votes);
    }
  } else if (!missing.empty() || !departed.empty()) {
    return VoteFailed(missing, departed, cause);
  }
  if (votes.size() != keys.size()) {
    absl::StatusOr<std::vector<std::string>> read = ReadVotes(*store_, keys);
    if (!read.ok()) return CutOff(read.status(), cause);
    votes = *std::move(read);
  }
  absl::StatusOr<VoteTally> tally = TallyVotes(votes, position, issued_through, options_.name);
  if (!tally.ok()) {
    if (recorder_ != nullptr) (void)recorder_->Dump(std::string(tally.status().message()));
    return tally.status();
  }
  std::optional<MembershipChange> change;
  if (survivors != members) {
    change = ChangeMembership(members, survivors, generation, cause);
    if (rebuilder_.apply_membership) {
      if (absl::Status followed = rebuilder_.apply_membership(*change); !followed.ok()) {
        change_refused_.store(true);
        return followed;
      }
    }
  } else if (absl::Status s = WaitBackoff(attempt, cause); !s.ok()) {
    // A membership change rebuilds at once; otherwise the backoff comes first.
    return s;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = rebuilder_.build(generation, tally->degrade);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("coordinated retry: rebuilding the backend (generation ",
                                     generation, ") failed: ", backend.status().message()));
  }
  if (recorder_ != nullptr) recorder_->SetGeneration(generation, (*backend)->name());
  RecoveryPlan plan;
  plan.restart_seq = tally->restart;
  plan.max_position = tally->max_position;
  plan.max_issued = tally->max_issued;
  plan.generation = generation;
  plan.backend = std::move(*backend);
  if (change.has_value()) {
    plan.change = change;
    if (rebuilder_.installed) {
      plan.on_installed = [installed = rebuilder_.installed, c = *change] { installed(c); };
    }
  }
  return plan;
}

}  // namespace adaptcomm::internal

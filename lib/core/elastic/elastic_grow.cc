#include "lib/core/elastic/elastic_grow.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/base/log.h"
#include "lib/config/listing.h"

namespace adaptcomm::internal {
namespace {

constexpr char kJoiners[] = "grow/joiners";
// How long rank 0 waits for a ticket's description: the joiner writes it right after taking the
// ticket, so only a joiner that died in between is missing it.
constexpr absl::Duration kDescribeBound = absl::Seconds(2);
constexpr int kMaxKeysNamed = 8;

std::string JoinerKey(int64_t n) { return absl::StrCat("grow/joiner/", n); }
std::string ListingKey(int64_t n) { return absl::StrCat("grow/joiner/", n, "/listing"); }
std::string LimitsKey(int64_t n) { return absl::StrCat("grow/joiner/", n, "/limits"); }
std::string AdmitKey(int64_t n) { return absl::StrCat("grow/admit/", n); }
std::string DecisionKey(int64_t count) { return absl::StrCat("grow/decision/", count); }
constexpr char kClaims[] = "grow/claims";

std::string HashText(const EffectiveConfig& config) {
  return absl::StrFormat("%016x", config.Hash());
}

// "key (joiner's vs rank 0's), ..." for the settings that differ.
std::string Differences(const std::string& joiner, const std::string& ours) {
  const std::map<std::string, std::string> a = config::ParseCanonicalListing(joiner),
                                           b = config::ParseCanonicalListing(ours);
  std::map<std::string, std::string> all = a;
  all.insert(b.begin(), b.end());
  std::vector<std::string> diffs;
  for (const auto& [key, unused] : all) {
    auto x = a.find(key), y = b.find(key);
    const std::string vx = x == a.end() ? "(unset)" : x->second;
    const std::string vy = y == b.end() ? "(unset)" : y->second;
    if (vx == vy) continue;
    if (static_cast<int>(diffs.size()) == kMaxKeysNamed) {
      diffs.push_back("...");
      break;
    }
    diffs.push_back(absl::StrCat(key, " (", vx, " vs ", vy, ")"));
  }
  return diffs.empty() ? "the profile's hash" : absl::StrJoin(diffs, ", ");
}

absl::StatusOr<std::vector<int>> ParseIds(absl::string_view csv) {
  std::vector<int> ids;
  for (absl::string_view id : absl::StrSplit(csv, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(id, &v)) return absl::InternalError(absl::StrCat("bad id list ", csv));
    ids.push_back(v);
  }
  return ids;
}

}  // namespace

absl::StatusOr<Admission> RequestAdmission(Store& store, const EffectiveConfig& config,
                                           const JoinerIdentity& me, absl::Time deadline) {
  absl::StatusOr<int64_t> ticket = store.Add(kJoiners, 1);
  if (!ticket.ok()) return ticket.status();
  // The listing first: once rank 0 sees the description, the listing is there to compare.
  if (absl::Status s = store.Set(ListingKey(*ticket), config.CanonicalListing()); !s.ok()) return s;
  if (absl::Status s = store.Set(LimitsKey(*ticket), me.limits); !s.ok()) return s;
  if (absl::Status s = store.Set(
          JoinerKey(*ticket),
          absl::StrCat(HashText(config), "|", me.build, "|", me.claimed_rank, "|", me.who));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> answer =
      store.Get(AdmitKey(*ticket), std::max(deadline - absl::Now(), absl::Milliseconds(1)));
  if (!answer.ok()) {
    if (absl::IsDeadlineExceeded(answer.status())) {
      return absl::DeadlineExceededError(absl::StrCat(
          "not admitted within the init timeout (ticket ", *ticket,
          "): the members admit joiners only when they call Communicator::AdmitJoiners()"));
    }
    return answer.status();
  }
  if (absl::StartsWith(*answer, "refused|")) {
    return absl::FailedPreconditionError(
        absl::StrCat("refused by rank 0: ", answer->substr(std::strlen("refused|"))));
  }
  std::vector<std::string> parts = absl::StrSplit(*answer, '|');
  Admission a;
  if (parts.size() != 7 || parts[0] != "ok" || !absl::SimpleAtoi(parts[1], &a.generation) ||
      !absl::SimpleAtoi(parts[2], &a.id) || !absl::SimpleAtoi(parts[3], &a.rank) ||
      !absl::SimpleAtoi(parts[4], &a.first_seq) || !absl::SimpleAtoi(parts[6], &a.count)) {
    return absl::InternalError(absl::StrCat("malformed admission '", *answer, "'"));
  }
  absl::StatusOr<std::vector<int>> ids = ParseIds(parts[5]);
  if (!ids.ok()) return ids.status();
  a.ids = *std::move(ids);
  if (a.rank < 0 || a.rank >= static_cast<int>(a.ids.size()) || a.ids[a.rank] != a.id) {
    return absl::InternalError(absl::StrCat("inconsistent admission '", *answer, "'"));
  }
  return a;
}

absl::StatusOr<ScreenedJoiners> ScreenJoiners(Store& store, int64_t handled,
                                              const EffectiveConfig& config,
                                              const std::string& build, const std::string& limits) {
  ScreenedJoiners out;
  absl::StatusOr<int64_t> count = store.Add(kJoiners, 0);
  if (!count.ok()) return count.status();
  out.count = *count;
  const std::string ours = HashText(config);
  std::vector<std::pair<int64_t, std::string>> refused;
  for (int64_t n = handled + 1; n <= out.count; ++n) {
    absl::StatusOr<std::string> description = store.Get(JoinerKey(n), kDescribeBound);
    if (!description.ok()) continue;  // died between its ticket and its description
    // hash|build|claimed rank|who
    std::vector<std::string> parts = absl::StrSplit(*description, absl::MaxSplits('|', 3));
    ScreenedJoiner joiner;
    joiner.ticket = n;
    if (parts.size() != 4 || !absl::SimpleAtoi(parts[2], &joiner.claimed_rank)) {
      refused.emplace_back(n, absl::StrCat("joiner's request '", *description,
                                           "' is not understood by rank 0 (another build?)"));
      continue;
    }
    joiner.who = parts[3];
    if (parts[1] != build) {
      // Checked first: two builds' profiles, wire formats and keys need not be comparable.
      refused.emplace_back(
          n, absl::StrCat("joiner ", joiner.who, " runs another build than rank 0: adaptcomm ",
                          parts[1], " vs ", build));
      continue;
    }
    // A replacement that would shrink, wait or fail otherwise than the members (#14, bad input).
    if (const std::string theirs = store.Get(LimitsKey(n), kDescribeBound).value_or("(unknown)");
        theirs != limits) {
      refused.emplace_back(
          n, absl::StrCat("joiner ", joiner.who, " has other elastic limits than rank 0: ", theirs,
                          " vs ", limits));
      continue;
    }
    if (parts[0] != ours) {
      const std::string listing = store.Get(ListingKey(n), kDescribeBound).value_or("");
      refused.emplace_back(n,
                           absl::StrCat("joiner ", joiner.who, " has another profile than rank 0: ",
                                        Differences(listing, config.CanonicalListing())));
      continue;
    }
    out.accepted.push_back(std::move(joiner));
  }
  RefuseJoiners(store, refused);
  return out;
}

RankClaims CheckRankClaims(const std::vector<ScreenedJoiner>& joiners,
                           std::map<int, std::string> holders, const std::string& name) {
  RankClaims out;
  for (const ScreenedJoiner& j : joiners) {
    auto held = holders.find(j.claimed_rank);
    if (held == holders.end()) {
      holders[j.claimed_rank] = absl::StrCat("joiner ", j.who, " (admitted now)");
      out.admitted.push_back(j);
      continue;
    }
    out.refused.emplace_back(
        j.ticket, absl::StrCat("joiner ", j.who, " claims rank ", j.claimed_rank,
                               " of communicator '", name, "', which is held by ", held->second,
                               ": two processes cannot be one rank (restart only a rank that was "
                               "lost)"));
  }
  return out;
}

void RefuseJoiners(Store& store, const std::vector<std::pair<int64_t, std::string>>& refused) {
  for (const auto& [ticket, why] : refused) {
    ADAPTCOMM_LOG(kWarning, "elastic grow: refused ticket ", ticket, ": ", why);
    (void)store.Set(AdmitKey(ticket), absl::StrCat("refused|", why));
  }
}

absl::StatusOr<JoinerClaims> ReadJoinerClaims(Store& store) {
  JoinerClaims claims;
  absl::StatusOr<std::string> text = store.Get(kClaims, absl::ZeroDuration());
  if (absl::IsNotFound(text.status())) return claims;  // nobody joined yet
  if (!text.ok()) return text.status();
  // One line per joiner: id|rank at creation|who.
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits('|', 2));
    int id = 0, rank = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &id) ||
        !absl::SimpleAtoi(parts[1], &rank)) {
      return absl::InternalError(absl::StrCat("malformed joiner claim '", line, "' in ", kClaims));
    }
    claims[id] = {rank, parts[2]};
  }
  return claims;
}

absl::Status PublishAdmission(Store& store, int64_t count, int generation, uint64_t first_seq,
                              const std::vector<int>& ids, const std::vector<int64_t>& tickets,
                              int first_new_rank, const JoinerClaims& claims) {
  // The claims before the decision: once a member sees the decision, a successor of this rank 0
  // finds the claims of every joiner in it.
  if (!tickets.empty()) {
    std::string text;
    for (const auto& [id, claim] : claims) {
      absl::StrAppend(&text, id, "|", claim.first, "|", claim.second, "\n");
    }
    if (absl::Status s = store.Set(kClaims, text); !s.ok()) return s;
  }
  const std::string csv = absl::StrJoin(ids, ",");
  if (absl::Status s =
          store.Set(DecisionKey(count), absl::StrCat(generation, "|", first_seq, "|", csv));
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < tickets.size(); ++i) {
    const int rank = first_new_rank + static_cast<int>(i);
    if (absl::Status s = store.Set(AdmitKey(tickets[i]),
                                   absl::StrCat("ok|", generation, "|", ids[rank], "|", rank, "|",
                                                first_seq, "|", csv, "|", count));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GrowDecision> ReadGrowDecision(Store& store, int64_t count, absl::Time deadline) {
  absl::StatusOr<std::string> got =
      store.Get(DecisionKey(count), std::max(deadline - absl::Now(), absl::Milliseconds(1)));
  if (!got.ok()) return got.status();
  std::vector<std::string> parts = absl::StrSplit(*got, '|');
  GrowDecision d;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &d.generation) ||
      !absl::SimpleAtoi(parts[1], &d.first_seq)) {
    return absl::InternalError(absl::StrCat("malformed grow decision '", *got, "'"));
  }
  absl::StatusOr<std::vector<int>> ids = ParseIds(parts[2]);
  if (!ids.ok()) return ids.status();
  d.ids = *std::move(ids);
  return d;
}

}  // namespace adaptcomm::internal

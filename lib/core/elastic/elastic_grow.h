// Elastic grow (issue #14 item 3): how a process that replaces a lost rank is admitted into a
// running communicator, through the communicator's store.
//
// A joiner takes a ticket (n = Add("grow/joiners")), publishes who it is, its build, the rank it
// replaces and its profile's hash and listing ("grow/joiner/<n>"), and waits for
// "grow/admit/<n>". The members admit at a step boundary (Communicator::AdmitJoiners, a
// collective): the current rank 0 screens the tickets not screened yet (a joiner from another
// build, or whose profile differs, is refused, naming the versions or the settings), broadcasts
// the number of the last ticket it accepted (0: none) and of the last it screened (so that every
// member knows where screening stands), refuses the joiners that claim a rank some member or an
// earlier joiner holds (naming both processes; the claims of joiners admitted before are kept in
// the store, "grow/claims"), and then writes the decision ("grow/decision/<c>" = generation|first
// seq|ids) and each joiner's admission. Every member and joiner builds the backend of that
// generation for the new world: the members keep their ranks, the joiners come after them in
// ticket order. Ids (ranks at creation for the first members, world size at creation and up for
// joiners) key each rank's coordinator entries (votes, wake-ups) and are never given twice: every
// member follows the largest id of each decision. Nothing is kept on rank 0 alone: when a shrink
// loses rank 0 (the store served apart from it, ADAPTCOMM_STORE_EXTERNAL=1), the new rank 0 admits
// as its predecessor would have.
#ifndef ADAPTCOMM_LIB_CORE_ELASTIC_ELASTIC_GROW_H_
#define ADAPTCOMM_LIB_CORE_ELASTIC_ELASTIC_GROW_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"

namespace adaptcomm::internal {

// What a joiner learns when it is admitted.
struct Admission {
  int generation = 0;      // of the backend every rank builds now
  int id = 0;              // this joiner's id
  int rank = 0;            // its rank in the new world
  uint64_t first_seq = 1;  // the sequence number of the first op on the new world
  std::vector<int> ids;    // every rank's id, in rank order (new world size = ids.size())
  int64_t count = 0;       // the last ticket screened by this admission
};

// Who asks to join.
struct JoinerIdentity {
  std::string who;       // "host:pid"
  std::string build;     // BuildVersion() (lib/base/build_info.h); no '|'
  int claimed_rank = 0;  // the rank at creation it replaces (its RANK)
  // Its loss policy and world limits in words (ElasticLimits, lib/core/elastic/membership.h): they
  // come from the API or the environment as well as the profile, so the profile's hash does not
  // cover them.
  std::string limits;
};

// Joiner: asks to join and waits until `deadline` for the members' answer. FailedPrecondition
// naming the reason when rank 0 refused it.
[[nodiscard]] absl::StatusOr<Admission> RequestAdmission(Store& store,
                                                         const EffectiveConfig& config,
                                                         const JoinerIdentity& me,
                                                         absl::Time deadline);

// Rank 0: the tickets after `handled` that may join (rank 0's build, `build`, its elastic limits,
// `limits`, and its profile); each refused one is told why at once. `count`: the last ticket seen.
struct ScreenedJoiner {
  int64_t ticket = 0;
  int claimed_rank = 0;
  std::string who;
};
struct ScreenedJoiners {
  int64_t count = 0;
  std::vector<ScreenedJoiner> accepted;
};
[[nodiscard]] absl::StatusOr<ScreenedJoiners> ScreenJoiners(Store& store, int64_t handled,
                                                            const EffectiveConfig& config,
                                                            const std::string& build,
                                                            const std::string& limits);

// Rank 0, once the members are final for this admission: a rank at creation is held by at most
// one process. `holders`: rank at creation -> the process that holds it now, in words
// ("host:pid (a member, rank 1 now)"); a joiner claiming a held rank, or one an earlier joiner of
// `joiners` claimed, is refused naming both processes (two processes as one rank: a launcher
// restarting a live rank, or two replacements for one lost rank).
struct RankClaims {
  std::vector<ScreenedJoiner> admitted;
  std::vector<std::pair<int64_t, std::string>> refused;  // ticket, why
};
RankClaims CheckRankClaims(const std::vector<ScreenedJoiner>& joiners,
                           std::map<int, std::string> holders, const std::string& name);

// Rank 0: tells each refused joiner why (best effort: a joiner that died does not read it).
void RefuseJoiners(Store& store, const std::vector<std::pair<int64_t, std::string>>& refused);

// Every joiner admitted so far: its id -> the rank at creation it claimed and who it is
// ("host:pid"). In the store, so that whichever rank is rank 0 knows which rank a member that
// joined holds.
using JoinerClaims = std::map<int, std::pair<int, std::string>>;
[[nodiscard]] absl::StatusOr<JoinerClaims> ReadJoinerClaims(Store& store);

// Rank 0: publishes `claims` (those read, plus the joiners admitted now), the decision for
// `count` (members' ids, then the joiners', in ticket order) and each accepted joiner's
// admission.
[[nodiscard]] absl::Status PublishAdmission(Store& store, int64_t count, int generation,
                                            uint64_t first_seq, const std::vector<int>& ids,
                                            const std::vector<int64_t>& tickets, int first_new_rank,
                                            const JoinerClaims& claims);

// Members other than rank 0: the decision for `count` (generation, first seq, ids in rank order).
struct GrowDecision {
  int generation = 0;
  uint64_t first_seq = 0;
  std::vector<int> ids;
};
[[nodiscard]] absl::StatusOr<GrowDecision> ReadGrowDecision(Store& store, int64_t count,
                                                            absl::Time deadline);

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_ELASTIC_ELASTIC_GROW_H_

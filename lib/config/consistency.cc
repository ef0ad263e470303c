// Same profile on every rank: compare hashes gathered through the store (O(1) requests per rank,
// lib/base/store_allgather.h); on a mismatch every rank reads the listings it needs and fails with
// the same message naming ranks and keys.
#include <map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "lib/base/store_allgather.h"
#include "lib/config/listing.h"

namespace adaptcomm {
namespace {

constexpr int kMaxRanksDetailed = 8;  // beyond that, only a count (the message stays readable)
constexpr int kMaxKeysPerRank = 8;

constexpr char kHashPrefix[] = "adaptcomm/config/hash/";
std::string ListingKey(int rank) { return absl::StrCat("adaptcomm/config/listing/", rank); }

}  // namespace

namespace config {

std::map<std::string, std::string> ParseCanonicalListing(const std::string& listing) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(listing, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    out[kv.first] = kv.second;
  }
  return out;
}

}  // namespace config

absl::Status CheckSameConfigOnAllRanks(Store& store, int rank, int world_size,
                                       const EffectiveConfig& cfg, absl::Duration timeout) {
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside world ", world_size));
  }
  const absl::Time deadline = absl::Now() + timeout;
  const std::string mine = absl::StrFormat("%016x", cfg.Hash());
  // The listing first: once a rank sees my hash, my listing is already there to read.
  if (absl::Status s = store.Set(ListingKey(rank), cfg.CanonicalListing()); !s.ok()) return s;
  absl::StatusOr<internal::StoreGathered> gathered =
      internal::AllGatherThroughStore(store, kHashPrefix, rank, world_size, mine, deadline);
  if (!gathered.ok()) {
    return absl::Status(gathered.status().code(),
                        absl::StrCat("configuration check: ", gathered.status().message()));
  }
  if (!gathered->complete) {
    return absl::DeadlineExceededError(absl::StrCat(
        "configuration check: ", gathered->DescribeMissing(), " of ", world_size,
        " did not publish a configuration hash within ", absl::FormatDuration(timeout)));
  }
  std::vector<int> differing;
  for (int r = 1; r < world_size; ++r) {
    if (*gathered->values[static_cast<size_t>(r)] != *gathered->values[0]) differing.push_back(r);
  }
  if (differing.empty()) return absl::OkStatus();

  auto listing = [&](int r) -> absl::StatusOr<std::map<std::string, std::string>> {
    auto l = store.Get(ListingKey(r), std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!l.ok()) return l.status();
    return config::ParseCanonicalListing(*l);
  };
  auto base = listing(0);
  if (!base.ok()) return base.status();
  std::vector<std::string> parts;
  for (size_t i = 0; i < differing.size() && static_cast<int>(i) < kMaxRanksDetailed; ++i) {
    const int r = differing[i];
    auto other = listing(r);
    if (!other.ok()) return other.status();
    std::vector<std::string> diffs;
    std::map<std::string, std::string> all = *base;
    all.insert(other->begin(), other->end());
    for (const auto& [key, unused] : all) {
      auto a = other->find(key);
      auto b = base->find(key);
      std::string va = a == other->end() ? "(unset)" : a->second;
      std::string vb = b == base->end() ? "(unset)" : b->second;
      if (va == vb) continue;
      if (static_cast<int>(diffs.size()) == kMaxKeysPerRank) {
        diffs.push_back("...");
        break;
      }
      diffs.push_back(absl::StrCat(key, " (", va, " vs ", vb, ")"));
    }
    parts.push_back(
        absl::StrCat("rank ", r, " differs from rank 0 on ", absl::StrJoin(diffs, ", ")));
  }
  if (static_cast<int>(differing.size()) > kMaxRanksDetailed) {
    parts.push_back(absl::StrCat(differing.size() - kMaxRanksDetailed, " more ranks differ"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("ranks use different profiles (", differing.size(), " of ", world_size,
                   " differ from rank 0; this is rank ", rank, "): ", absl::StrJoin(parts, "; "),
                   ". Give every rank the same profile file, model size and overrides."));
}

}  // namespace adaptcomm

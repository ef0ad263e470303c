#include "lib/base/store_allgather.h"

#include <algorithm>
#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace adaptcomm::internal {
namespace {

// How long the completing rank waits for a contribution it knows is there: each rank sets its
// value before it adds to the count, so this bounds only a store's own delay.
constexpr absl::Duration kContributionBound = absl::Seconds(5);

// Ranks that count their arrival on one key: past this many, they count in groups of it, and the
// last of each group counts the group on the top key. A store whose add is a compare-and-swap
// (etcd) serves n^2/2 attempts to n ranks adding at once, so one key of 256 ranks costs ~33,000
// transactions where 17 keys of 16 cost ~2,300; a store with an atomic add (Redis, TCP) pays one
// more add for one rank in 16.
constexpr int kArrivalFanIn = 16;

// Counts this rank's arrival; true when it is the last of `world` (the completing rank).
absl::StatusOr<bool> CountArrival(Store& store, const std::string& prefix, int rank, int world) {
  auto add = [&](const std::string& key, int64_t expected) -> absl::StatusOr<bool> {
    absl::StatusOr<int64_t> count = store.Add(key, 1);
    if (!count.ok()) return count.status();
    if (*count > expected) {
      return absl::FailedPreconditionError(
          absl::StrCat("store exchange '", prefix, "' counted ", *count, " arrivals at '", key,
                       "' for ", expected, ": two exchanges share this prefix"));
    }
    return *count == expected;
  };
  if (world <= kArrivalFanIn) return add(absl::StrCat(prefix, "count"), world);
  const int group = rank / kArrivalFanIn;
  const int groups = (world + kArrivalFanIn - 1) / kArrivalFanIn;
  const int in_group = std::min(kArrivalFanIn, world - group * kArrivalFanIn);
  absl::StatusOr<bool> group_done = add(absl::StrCat(prefix, "count/", group), in_group);
  if (!group_done.ok() || !*group_done) return group_done;
  return add(absl::StrCat(prefix, "count"), groups);
}

// Every rank's contribution key, in rank order.
std::vector<std::string> ContributionKeys(const std::string& prefix, int world) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) keys.push_back(absl::StrCat(prefix, r));
  return keys;
}

absl::Duration Left(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

}  // namespace

std::vector<int> StoreGathered::Missing() const {
  std::vector<int> missing;
  for (size_t r = 0; r < values.size(); ++r) {
    if (!values[r].has_value()) missing.push_back(static_cast<int>(r));
  }
  return missing;
}

std::string StoreGathered::DescribeMissing() const {
  const std::vector<int> missing = Missing();
  return absl::StrCat(missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "));
}

std::string EncodeGathered(const std::vector<std::string>& values) {
  std::string text;
  for (const std::string& v : values) absl::StrAppend(&text, v.size(), ":", v);
  return text;
}

absl::StatusOr<std::vector<std::string>> DecodeGathered(absl::string_view text, int world) {
  std::vector<std::string> values;
  while (!text.empty()) {
    const size_t colon = text.find(':');
    size_t length = 0;
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(text.substr(0, colon), &length) ||
        length > text.size() - colon - 1) {
      return absl::InternalError("a gathered store value is malformed");
    }
    values.emplace_back(text.substr(colon + 1, length));
    text.remove_prefix(colon + 1 + length);
  }
  if (static_cast<int>(values.size()) != world) {
    return absl::InternalError(absl::StrCat("a gathered store value holds ", values.size(),
                                            " values for a world of ", world));
  }
  return values;
}

absl::StatusOr<StoreGathered> AllGatherThroughStore(Store& store, const std::string& prefix,
                                                    int rank, int world, const std::string& mine,
                                                    absl::Time deadline) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("store exchange '", prefix, "': rank ", rank, " outside a world of ", world));
  }
  const std::string all_key = absl::StrCat(prefix, "all");
  if (absl::Status s = store.Set(absl::StrCat(prefix, rank), mine); !s.ok()) return s;
  absl::StatusOr<bool> last = CountArrival(store, prefix, rank, world);
  if (!last.ok()) return last.status();
  StoreGathered gathered;
  gathered.values.resize(static_cast<size_t>(world));
  if (*last) {
    // Every contribution in one read where the store can (Redis: one MGET, not one GET per rank).
    absl::StatusOr<std::vector<std::string>> read =
        store.MultiGet(ContributionKeys(prefix, world), kContributionBound);
    if (!read.ok()) return read.status();
    std::vector<std::string> values = *std::move(read);
    if (absl::Status s = store.Set(all_key, EncodeGathered(values)); !s.ok()) return s;
    for (int r = 0; r < world; ++r) gathered.values[r] = std::move(values[r]);
    gathered.complete = true;
    return gathered;
  }
  absl::StatusOr<std::string> all = store.Get(all_key, Left(deadline));
  if (all.ok()) {
    absl::StatusOr<std::vector<std::string>> values = DecodeGathered(*all, world);
    if (!values.ok()) return values.status();
    for (int r = 0; r < world; ++r) gathered.values[r] = std::move((*values)[r]);
    gathered.complete = true;
    return gathered;
  }
  if (!absl::IsDeadlineExceeded(all.status()) && !absl::IsNotFound(all.status())) {
    return all.status();
  }
  // Late or gone ranks: read each contribution once to name them. Every value may be there after
  // all (the completing rank died before publishing them together); then the exchange is done,
  // found in one read where the store can.
  absl::StatusOr<std::vector<std::string>> every =
      store.MultiGet(ContributionKeys(prefix, world), absl::ZeroDuration());
  if (every.ok()) {
    for (int r = 0; r < world; ++r) gathered.values[r] = std::move((*every)[r]);
    gathered.complete = true;
    return gathered;
  }
  if (!absl::IsNotFound(every.status()) && !absl::IsDeadlineExceeded(every.status())) {
    return every.status();
  }
  gathered.complete = true;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<std::string> v = store.Get(absl::StrCat(prefix, r), absl::ZeroDuration());
    if (v.ok()) {
      gathered.values[r] = *std::move(v);
    } else if (absl::IsNotFound(v.status()) || absl::IsDeadlineExceeded(v.status())) {
      gathered.complete = false;
    } else {
      return v.status();
    }
  }
  return gathered;
}

}  // namespace adaptcomm::internal

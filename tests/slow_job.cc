#include "tests/slow_job.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/harness.h"

namespace adaptcomm::testing {

namespace {

constexpr size_t kElements = 1024;  // 4 KiB of floats
// The gradient's first two elements carry the loop's agreement (summed by the allreduce): how
// many ranks heard of every slowed rank, and how many ran past the bound.
constexpr size_t kToldAll = 0;
constexpr size_t kPastBound = 1;

std::string WriteProfile(const SlowJobSpec& spec) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", spec.name, ".profile.yaml");
  std::ofstream(path) << "schema: 1\ndefaults:\n  status:\n    interval: 200ms\n  monitor:\n"
                      << (spec.monitor_yaml.empty() ? "    enabled: true\n" : spec.monitor_yaml)
                      << "tiers:\n  - name: only\n";
  return path;
}

bool ToldOfAll(const std::vector<TimedEvent>& events, const std::vector<int>& ranks) {
  for (int r : ranks) {
    const bool told = std::any_of(events.begin(), events.end(), [r](const TimedEvent& t) {
      return t.event.rank == r && t.event.slow;
    });
    if (!told) return false;
  }
  return true;
}

std::vector<std::string> FlightEvents(Communicator& comm) {
  absl::StatusOr<std::string> path = comm.DumpFlightRecord("fail-slow test");
  EXPECT_TRUE(path.ok()) << path.status();
  std::vector<std::string> out;
  if (!path.ok()) return out;
  const nlohmann::json doc = nlohmann::json::parse(ReadTextFile(*path), nullptr, false);
  if (doc.is_discarded() || !doc.contains("events")) return out;
  for (const auto& e : doc["events"]) out.push_back(e.value("text", ""));
  return out;
}

double StatusSlowness(Store& store, const std::string& comm, int rank) {
  absl::StatusOr<std::string> record =
      store.Get(absl::StrCat("adaptcomm/status/", comm, "/rank", rank), absl::ZeroDuration());
  if (!record.ok()) return -1;
  const nlohmann::json j = nlohmann::json::parse(*record, nullptr, false);
  return j.is_discarded() ? -1 : j.value("slowness", -1.0);
}

}  // namespace

std::vector<int> SlowedRanks(const SlowJobSpec& spec) {
  std::vector<int> ranks;
  for (size_t r = 0; r < spec.slowdown.size(); ++r) {
    if (spec.slowdown[r] > 0) ranks.push_back(static_cast<int>(r));
  }
  return ranks;
}

SlowJobResult RunSlowJob(const SlowJobSpec& spec) {
  const auto world = static_cast<size_t>(spec.world_size);
  const std::string profile = WriteProfile(spec);
  const std::vector<int> slowed = SlowedRanks(spec);
  SlowJobResult result;
  result.events.resize(world);
  result.flight_events.resize(world);
  result.status_slowness.assign(world, -1);
  absl::Mutex mu;
  std::vector<char> values_ok(world, 1);  // not vector<bool>: ranks write their own at once
  RunRanks(RankMode::kThreads, spec.world_size, [&](const RankEnv& env) {
    const auto r = static_cast<size_t>(env.rank);
    absl::Time start = absl::Now();
    CommunicatorOptions o = env.options;
    o.name = spec.name;
    o.backend = spec.backend;
    if (!profile.empty()) o.profile_file = profile;
    o.flight_recorder_dir = absl::StrCat(::testing::TempDir(), "/", spec.name);
    o.on_slow_rank = [&, r](const SlowRankEvent& e) {
      absl::MutexLock lock(&mu);
      result.events[r].push_back({absl::Now() - start, e});
    };
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    const double slowdown = r < spec.slowdown.size() ? spec.slowdown[r] : 0;
    const absl::Duration work = spec.work * (1 + slowdown);
    const float expected = static_cast<float>(spec.world_size * (spec.world_size + 1) / 2);
    std::vector<float> g(kElements);
    int steps = 0;
    {
      absl::MutexLock lock(&mu);
      start = absl::Now();
    }
    while (true) {
      absl::SleepFor(work);  // the step's compute
      bool told = false;
      {
        absl::MutexLock lock(&mu);
        told = ToldOfAll(result.events[r], slowed);
      }
      std::fill(g.begin(), g.end(), static_cast<float>(env.rank + 1));
      g[kToldAll] = told && !slowed.empty() && !spec.keep_running ? 1.0f : 0.0f;
      g[kPastBound] = absl::Now() - start > spec.bound ? 1.0f : 0.0f;
      const absl::Status s = (*comm)->Allreduce(HostView(g.data(), g.size())).Wait();
      ASSERT_TRUE(s.ok()) << "rank " << env.rank << " step " << steps << ": " << s;
      ++steps;
      for (size_t i = kPastBound + 1; i < kElements; ++i) {
        if (g[i] != expected) {
          values_ok[r] = 0;
          ADD_FAILURE() << "rank " << env.rank << " step " << steps << " element " << i << ": "
                        << g[i] << " != " << expected;
          break;
        }
      }
      if (g[kPastBound] > 0 || g[kToldAll] == static_cast<float>(spec.world_size)) break;
    }
    // Two state-record intervals: the last verdict's score reaches the record.
    absl::SleepFor(absl::Milliseconds(400));
    const double slowness = StatusSlowness(*env.options.store, spec.name, env.rank);
    std::vector<std::string> flight = FlightEvents(**comm);
    absl::MutexLock lock(&mu);
    result.status_slowness[r] = slowness;
    result.flight_events[r] = std::move(flight);
    if (r == 0) {
      result.steps = steps;
      result.ran = absl::Now() - start;
    }
  });
  result.values_ok = std::all_of(values_ok.begin(), values_ok.end(), [](char b) { return b != 0; });
  return result;
}

absl::Duration TimeAllTold(const SlowJobResult& result, const std::vector<int>& ranks) {
  absl::Duration latest = absl::ZeroDuration();
  for (const std::vector<TimedEvent>& events : result.events) {
    for (int r : ranks) {
      auto it = std::find_if(events.begin(), events.end(), [r](const TimedEvent& t) {
        return t.event.rank == r && t.event.slow;
      });
      if (it == events.end()) return absl::InfiniteDuration();
      latest = std::max(latest, it->after);
    }
  }
  return latest;
}

std::vector<int> WronglyNamed(const SlowJobResult& result, const std::vector<int>& ranks) {
  std::set<int> wrong;
  for (const std::vector<TimedEvent>& events : result.events) {
    for (const TimedEvent& t : events) {
      if (t.event.slow && std::find(ranks.begin(), ranks.end(), t.event.rank) == ranks.end()) {
        wrong.insert(t.event.rank);
      }
    }
  }
  return {wrong.begin(), wrong.end()};
}

}  // namespace adaptcomm::testing

// How elastic shrink's recovery time grows with the world size (issue #14, "Measured").
//
//   elastic_scaling_bench [--ranks 4,8,16,32,64] [--backend gloo|shm] [--bound 60]
//                         [--loss-window 1] (elastic.loss_window; the profile default is 5 s)
//
// N ranks are threads of this process (tests/harness.h RunRanks, an in-process store) with
// elastic.on_loss shrink, a 10 s op timeout and a 1 s loss window (--loss-window). After two
// checked allreduces, rank N/2 vanishes instead of joining the third: its store link is cut (it
// cannot vote, as a dead rank cannot: tests/cuttable_store.h) and its communicator aborted (its
// backend breaks the group, as a killed process's sockets and shared-memory pid do). The survivors'
// third allreduce fails, they vote, declare the vanished rank lost after the loss window, rebuild
// for N-1 ranks and run it again. Printed per N: the time from the loss to each survivor's first
// successful allreduce (median and max over the survivors), the time all N took to create their
// communicators (what a rebuild for N-1 costs too), with every result of every survivor checked
// element by element against the sum over the current members' inputs (before and after).
//
// A size that does not finish within --bound seconds (creation included) ends the program with a
// line saying how far its ranks got: thread ranks cannot be killed one by one.
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "adaptcomm/adaptcomm.h"
#include "tests/cuttable_store.h"
#include "tests/harness.h"

namespace {

using adaptcomm::BackendChoice;
using adaptcomm::Communicator;
using adaptcomm::CommunicatorOptions;
using adaptcomm::HostView;
using adaptcomm::Membership;

constexpr int kLossStep = 2;  // steps 0 and 1 run on the full world
constexpr int kSteps = 5;     // steps 3 and 4 check the shrunk world once more
constexpr size_t kFloats = 4096;

struct Config {
  std::vector<int> ranks = {4, 8, 16, 32, 64};
  BackendChoice backend = BackendChoice::kGloo;
  absl::Duration bound = absl::Seconds(60);
  absl::Duration loss_window = absl::Seconds(1);
};

// Input of the rank that was `initial` at creation, step s, element i: small integers, so float
// sums over 64 ranks are exact.
float Input(int initial, int step, size_t i) {
  return static_cast<float>((initial + 1) * (step + 1) + static_cast<int>(i % 11));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// What one size's ranks did; the watchdog reads the counters when the size runs out of time.
struct SizeRun {
  int world = 0;
  int victim = 0;
  std::atomic<int> created{0};
  std::atomic<int> reached_loss_step{0};
  std::atomic<int> recovered{0};
  std::atomic<int> finished{0};
  std::atomic<int64_t> loss_at_us{0};
  std::atomic<int64_t> last_created_us{0};  // the slowest rank's Create, from the size's start
  int64_t start_us = 0;
  absl::Notification survivors_done;
  absl::Mutex mu;
  std::vector<double> recovery_s ABSL_GUARDED_BY(mu);
  std::vector<std::string> errors ABSL_GUARDED_BY(mu);
  int64_t checked_values ABSL_GUARDED_BY(mu) = 0;

  void SurvivorFinished() {
    if (++finished == world - 1) survivors_done.Notify();
  }
  void Fail(std::string what) {
    absl::MutexLock lock(&mu);
    errors.push_back(std::move(what));
  }
};

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

// Fills buf with this rank's input for `step`, allreduces it and checks every element against
// the sum over the members after the op. Returns the op's status (values checked only if OK).
absl::Status CheckedAllreduce(Communicator& comm, int step, std::vector<float>& buf, SizeRun& run) {
  const Membership before = comm.membership();
  for (size_t i = 0; i < buf.size(); ++i) {
    buf[i] = Input(before.initial_ranks[static_cast<size_t>(before.rank)], step, i);
  }
  absl::Status s = comm.Allreduce(HostView(buf.data(), buf.size())).Wait();
  if (!s.ok()) return s;
  const Membership m = comm.membership();
  for (size_t i = 0; i < buf.size(); ++i) {
    float want = 0;
    for (int initial : m.initial_ranks) want += Input(initial, step, i);
    if (buf[i] != want) {
      return absl::InternalError(absl::StrCat("step ", step, " element ", i, ": ", buf[i],
                                              " instead of ", want, " (world ", m.world_size, ")"));
    }
  }
  absl::MutexLock lock(&run.mu);
  run.checked_values += static_cast<int64_t>(buf.size());
  return absl::OkStatus();
}

void RankBody(const adaptcomm::testing::RankEnv& env, BackendChoice backend,
              absl::Duration loss_window, SizeRun& run) {
  auto store = std::make_shared<adaptcomm::testing::CuttableStore>(env.options.store);
  CommunicatorOptions o = env.options;
  o.name = absl::StrCat("elastic_scaling_", env.world_size);
  o.store = store;
  o.backend = backend;
  o.fallback = adaptcomm::Fallback::kDeny;
  o.timeout = absl::Seconds(10);
  o.init_timeout = absl::Seconds(300);  // 64 thread ranks on two cores take a while to connect
  o.failure_report_window = absl::Seconds(2);
  o.elastic.on_loss = adaptcomm::LossPolicy::kShrink;
  o.elastic.loss_window = loss_window;
  o.elastic.min_world_size = 2;
  auto comm = Communicator::Create(o);
  if (!comm.ok()) {
    run.Fail(absl::StrCat("rank ", env.rank, ": create: ", comm.status().ToString()));
    if (env.rank != run.victim) run.SurvivorFinished();
    return;
  }
  ++run.created;
  const int64_t created_after = NowMicros() - run.start_us;
  for (int64_t seen = run.last_created_us.load();
       seen < created_after && !run.last_created_us.compare_exchange_weak(seen, created_after);) {
  }
  std::vector<float> buf(kFloats);
  for (int step = 0; step < kSteps; ++step) {
    if (step == kLossStep) ++run.reached_loss_step;
    if (step == kLossStep && env.rank == run.victim) {
      // Vanishes: no vote, no part in the op. Its communicator goes once the survivors are done.
      run.loss_at_us.store(NowMicros());
      store->Cut();
      (*comm)->Abort(absl::UnavailableError("rank vanished (elastic_scaling_bench)"));
      run.survivors_done.WaitForNotificationWithTimeout(absl::Minutes(10));
      comm->reset();
      return;
    }
    absl::Status s = CheckedAllreduce(**comm, step, buf, run);
    if (!s.ok()) {
      run.Fail(absl::StrCat("rank ", env.rank, " step ", step, ": ", s.ToString()));
      break;
    }
    if (step == kLossStep) {
      const int64_t loss_at = run.loss_at_us.load();
      const Membership m = (*comm)->membership();
      if (m.world_size != env.world_size - 1 || m.lost_ranks != std::vector<int>{run.victim}) {
        run.Fail(absl::StrCat("rank ", env.rank, ": world ", m.world_size, " after the loss"));
      }
      absl::MutexLock lock(&run.mu);
      run.recovery_s.push_back(loss_at == 0 ? -1 : (NowMicros() - loss_at) / 1e6);
      ++run.recovered;
    }
  }
  run.SurvivorFinished();
  comm->reset();
}

// Runs one size and prints its line; false when a rank failed. Ends the program when the size
// runs out of time.
bool RunSize(int world, const Config& config) {
  SizeRun run;
  run.world = world;
  run.victim = world / 2;
  absl::Notification size_done;
  const absl::Time start = absl::Now();
  run.start_us = absl::ToUnixMicros(start);
  std::thread watchdog([&] {
    if (size_done.WaitForNotificationWithTimeout(config.bound)) return;
    std::printf(
        "%d ranks: did not finish within %s: %d of %d created, %d reached the loss step, %d of "
        "%d survivors recovered, %d finished; giving up (thread ranks cannot be killed)\n",
        world, absl::FormatDuration(config.bound).c_str(), run.created.load(), world,
        run.reached_loss_step.load(), run.recovered.load(), world - 1, run.finished.load());
    std::fflush(stdout);
    std::_Exit(2);
  });
  adaptcomm::testing::RunRanks(adaptcomm::testing::RankMode::kThreads, world,
                               [&](const adaptcomm::testing::RankEnv& env) {
                                 RankBody(env, config.backend, config.loss_window, run);
                               });
  size_done.Notify();
  watchdog.join();
  const double total_s = absl::ToDoubleSeconds(absl::Now() - start);
  absl::MutexLock lock(&run.mu);
  std::vector<double> times = run.recovery_s;
  const bool ok = run.errors.empty() && static_cast<int>(times.size()) == world - 1;
  std::printf("%-6d %-8s %-10.3f %-10.3f %-10d %-12lld %-9.2f %-8.1f %s\n", world,
              adaptcomm::BackendChoiceName(config.backend), Median(times),
              times.empty() ? 0.0 : *std::max_element(times.begin(), times.end()),
              static_cast<int>(times.size()), static_cast<long long>(run.checked_values),
              run.last_created_us.load() / 1e6, total_s, ok ? "ok" : "FAILED");
  for (const std::string& e : run.errors) std::printf("  error: %s\n", e.c_str());
  std::fflush(stdout);
  return ok;
}

bool ParseArgs(int argc, char** argv, Config& config) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "--ranks" && value != nullptr) {
      config.ranks.clear();
      for (absl::string_view n : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        int r = 0;
        if (!absl::SimpleAtoi(n, &r) || r < 3) {
          std::fprintf(stderr, "--ranks: '%s' is not a world size of 3 or more\n",
                       std::string(n).c_str());
          return false;
        }
        config.ranks.push_back(r);
      }
      ++i;
    } else if (arg == "--backend" && value != nullptr) {
      if (std::string(value) == "gloo") {
        config.backend = BackendChoice::kGloo;
      } else if (std::string(value) == "shm") {
        config.backend = BackendChoice::kShm;
      } else {
        std::fprintf(stderr, "--backend: '%s' is not gloo or shm\n", value);
        return false;
      }
      ++i;
    } else if ((arg == "--bound" || arg == "--loss-window") && value != nullptr) {
      int seconds = 0;
      if (!absl::SimpleAtoi(value, &seconds) || seconds <= 0) {
        std::fprintf(stderr, "%s: '%s' is not a number of seconds\n", arg.c_str(), value);
        return false;
      }
      (arg == "--bound" ? config.bound : config.loss_window) = absl::Seconds(seconds);
      ++i;
    } else {
      std::fprintf(stderr,
                   "usage: elastic_scaling_bench [--ranks 4,8,16,32,64] [--backend gloo|shm] "
                   "[--bound SECONDS] [--loss-window SECONDS]\n");
      return false;
    }
  }
  return !config.ranks.empty();
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  if (!ParseArgs(argc, argv, config)) return 2;
  setenv("ADAPTCOMM_LOG_LEVEL", "off", /*overwrite=*/0);  // lines per survivor otherwise
  std::printf(
      "elastic shrink recovery, ranks as threads: op timeout 10s, loss window %s, rank N/2 "
      "vanishes at step %d\n"
      "seconds from the loss to each survivor's first successful allreduce (%zu floats)\n",
      absl::FormatDuration(config.loss_window).c_str(), kLossStep, kFloats);
  std::printf("%-6s %-8s %-10s %-10s %-10s %-12s %-9s %-8s %s\n", "ranks", "backend", "median_s",
              "max_s", "survivors", "checked", "create_s", "total_s", "result");
  std::fflush(stdout);
  bool all_ok = true;
  for (int world : config.ranks) all_ok = RunSize(world, config) && all_ok;
  return all_ok ? 0 : 1;
}

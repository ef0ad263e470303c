// What online tuning (issue #15 item 3, lib/core/tuning/online_tuner.h) costs during its trial
// window and gains after it, per message size.
//
//   online_tuning_bench [--ranks 2] [--sizes 4KiB,256KiB,4MiB,64MiB] [--trials 5] [--reps 3]
//                       [--steady N]   (ops timed after the window; 0: by size)
//
// Ranks are threads of this process on the shm backend, over an in-process store. For each size,
// each repetition creates two fresh communicators per rank, side by side (which one is created
// first alternates between repetitions): one with online tuning off, one with tuning.online
// {enabled, trials_per_candidate: --trials}. Both run the same ops,
// allreduce f32 sum of that size, every op waited for as a training step waits, op i on both
// before op i + 1 (which one first alternates), so that the machine's load hits both alike:
//   window: the first 1 + candidates x trials + 1 ops (the warm-up op, the trials, and the op at
//           whose issue the ranks agree on the winner), summed per op;
//   steady: the next --steady ops, median per op.
// Reported, the median over repetitions of the slowest rank's numbers: window time off and on,
// the overhead (on - off, absolute and relative), steady time per op off and on, and the winner
// rank 0 reports. Inputs are reset before each op, outside the timed span; every result is
// checked element by element. One untimed run per size comes first.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "adaptcomm/adaptcomm.h"
#include "lib/base/byte_text.h"
#include "lib/config/online_tuning.h"
#include "lib/config/units.h"
#include "lib/core/tuning/online_tuner.h"
#include "lib/shm/shm_backend.h"

namespace {

using adaptcomm::Communicator;
using adaptcomm::CommunicatorOptions;
using Clock = std::chrono::steady_clock;

struct Config {
  int ranks = 2;
  std::vector<uint64_t> sizes = {4 << 10, 256 << 10, 4 << 20, 64 << 20};
  int trials = 5;
  int reps = 3;
  int steady = 0;
};

int SteadyOps(const Config& c, uint64_t bytes) {
  if (c.steady > 0) return c.steady;
  return bytes <= (64u << 10) ? 1000 : bytes <= (1u << 20) ? 200 : bytes <= (8u << 20) ? 30 : 8;
}

// One rank's numbers for one communicator.
struct Side {
  double window_us = 0;
  double steady_us = 0;  // median per op
  std::string winner;
  int candidates = 0;   // what the tuned communicator tried (OnlineDecision::candidates)
  bool checked = true;  // every result right
};
struct RankResult {
  Side off, on;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::unique_ptr<Communicator> Create(const Config& c, int rank,
                                     std::shared_ptr<adaptcomm::Store> store,
                                     const std::string& profile, const std::string& name) {
  CommunicatorOptions o;
  o.rank = rank;
  o.world_size = c.ranks;
  o.store = std::move(store);
  o.name = name;
  if (!profile.empty()) o.profile_file = profile;
  o.backend = adaptcomm::BackendChoice::kShm;
  o.fallback = adaptcomm::Fallback::kDeny;
  o.timeout = absl::Seconds(120);
  o.init_timeout = absl::Seconds(60);
  auto comm = Communicator::Create(o);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(comm);
}

// One timed allreduce of `data` (reset first, outside the timed span) on `comm`, microseconds.
double TimedAllreduce(Communicator& comm, std::vector<float>& data, int rank) {
  for (size_t k = 0; k < data.size(); ++k) data[k] = static_cast<float>(rank + 1 + k % 7);
  const auto t0 = Clock::now();
  absl::Status s = comm.Allreduce(adaptcomm::HostView(data.data(), data.size())).Wait();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    std::exit(1);
  }
  return us;
}

bool Checked(const std::vector<float>& data, int n) {
  for (size_t k = 0; k < data.size(); ++k) {
    if (data[k] != static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(k % 7))) return false;
  }
  return true;
}

// Per rank (threads), an untuned and a tuned communicator side by side: `window` + `steady`
// allreduces of `bytes` on each, op i on both before op i + 1 (which one first alternates), so a
// change of the machine's load hits both alike.
std::vector<RankResult> Run(const Config& c, uint64_t bytes, int window, int steady,
                            const std::string& off, const std::string& on, int serial) {
  std::shared_ptr<adaptcomm::Store> store = adaptcomm::CreateHashStore();
  std::vector<RankResult> out(c.ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < c.ranks; ++r) {
    threads.emplace_back([&, r] {
      // The communicator created second ran small ops up to 1.7x slower here whatever its
      // settings: which one is created first alternates between repetitions too.
      std::unique_ptr<Communicator> comm_off, comm_on;
      for (int k = 0; k < 2; ++k) {
        if ((k + serial) % 2 == 0) {
          comm_off = Create(c, r, store, off, absl::StrCat("off", serial));
        } else {
          comm_on = Create(c, r, store, on, absl::StrCat("on", serial));
        }
      }
      std::vector<float> data(bytes / sizeof(float));
      std::vector<double> steady_off, steady_on;
      // Untimed, on the untuned one: the ranks leave creation at different times.
      (void)TimedAllreduce(*comm_off, data, r);
      for (int i = 0; i < window + steady; ++i) {
        for (int turn = 0; turn < 2; ++turn) {
          const bool tuned = (turn + i) % 2 == 1;
          const double us = TimedAllreduce(tuned ? *comm_on : *comm_off, data, r);
          Side& side = tuned ? out[r].on : out[r].off;
          if (i < window) {
            side.window_us += us;
          } else {
            (tuned ? steady_on : steady_off).push_back(us);
          }
          side.checked = side.checked && Checked(data, c.ranks);
        }
      }
      out[r].off.steady_us = Median(steady_off);
      out[r].on.steady_us = Median(steady_on);
      for (const auto& d : adaptcomm::internal::OnlineTuningDecisions(*comm_on)) {
        out[r].on.candidates = d.candidates;
        out[r].on.winner = d.reason.empty() ? absl::StrCat(d.winner, " (", d.values, ")")
                                            : absl::StrCat("static: ", d.reason);
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::string WriteProfile(const std::string& tuning) {
  const std::string path =
      absl::StrCat("/tmp/online_tuning_bench_", getpid(), "_", tuning.size(), ".yaml");
  std::ofstream(path) << "schema: 1\ndefaults:\n  tuning: " << tuning << "\ntiers:\n  - name: b\n";
  return path;
}

bool Parse(int argc, char** argv, Config& c) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--ranks" && has_value) {
      if (!absl::SimpleAtoi(argv[++i], &c.ranks) || c.ranks < 2) return false;
    } else if (a == "--trials" && has_value) {
      if (!absl::SimpleAtoi(argv[++i], &c.trials) || c.trials < 1) return false;
    } else if (a == "--reps" && has_value) {
      if (!absl::SimpleAtoi(argv[++i], &c.reps) || c.reps < 1) return false;
    } else if (a == "--steady" && has_value) {
      if (!absl::SimpleAtoi(argv[++i], &c.steady) || c.steady < 0) return false;
    } else if (a == "--sizes" && has_value) {
      c.sizes.clear();
      for (absl::string_view t : absl::StrSplit(argv[++i], ',', absl::SkipEmpty())) {
        auto b = adaptcomm::config::ParseByteSize(std::string(t));
        if (!b.ok() || *b < 4 || *b % 4 != 0) return false;
        c.sizes.push_back(*b);
      }
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  if (!Parse(argc, argv, c)) {
    std::fprintf(stderr,
                 "usage: online_tuning_bench [--ranks N] [--sizes 4KiB,...] [--trials K] "
                 "[--reps R] [--steady N]\n");
    return 2;
  }
  setenv("ADAPTCOMM_LOG_LEVEL", "warning", 0);
  const std::string off = WriteProfile("{online: {enabled: false}}");
  const std::string on =
      WriteProfile(absl::StrCat("{online: {enabled: true, trials_per_candidate: ", c.trials, "}}"));
  std::printf(
      "online tuning, %d thread ranks on shm, allreduce f32 sum, %d trials per candidate, median "
      "of %d repetitions, slowest rank\n",
      c.ranks, c.trials, c.reps);
  std::printf("%-8s %5s %6s %12s %12s %16s %12s %12s  %s\n", "size", "cands", "window",
              "window off", "window on", "overhead", "steady off", "steady on", "winner");
  bool all_checked = true;
  int serial = 0;
  for (uint64_t bytes : c.sizes) {
    // The shm backend's own values (the default profile has no shm knobs): a candidate that runs
    // what they run is not tried (lib/config/online_tuning.h).
    adaptcomm::config::OnlineSpaceInputs in;
    in.world_size = c.ranks;
    in.static_knobs = [](uint64_t) {
      const adaptcomm::ShmBackendOptions defaults;
      return std::vector<std::pair<std::string, int64_t>>{
          {"flat_max_bytes", static_cast<int64_t>(defaults.flat_max_bytes)},
          {"chunk_bytes", static_cast<int64_t>(defaults.chunk_bytes)}};
    };
    const int candidates =
        static_cast<int>(adaptcomm::config::OnlineCandidates(
                             "shm", "allreduce", adaptcomm::config::OnlineBand(bytes), in)
                             .size());
    const int window = 1 + candidates * c.trials + 1;
    const int steady = SteadyOps(c, bytes);
    std::vector<double> w_off, w_on, s_off, s_on;
    std::string winner;
    // Untimed: the first communicators of a size pay for first touches the others do not.
    (void)Run(c, bytes, window, 1, off, on, serial++);
    for (int rep = 0; rep < c.reps; ++rep) {
      const std::vector<RankResult> res = Run(c, bytes, window, steady, off, on, serial++);
      double wf = 0, wn = 0, sf = 0, sn = 0;
      for (const RankResult& r : res) {
        wf = std::max(wf, r.off.window_us);
        wn = std::max(wn, r.on.window_us);
        sf = std::max(sf, r.off.steady_us);
        sn = std::max(sn, r.on.steady_us);
        all_checked = all_checked && r.off.checked && r.on.checked;
        if (r.on.candidates != candidates) {
          std::fprintf(stderr, "%s: the tuned communicator tried %d candidates, not %d\n",
                       adaptcomm::CompactByteSizeText(bytes).c_str(), r.on.candidates, candidates);
          return 1;
        }
      }
      w_off.push_back(wf);
      w_on.push_back(wn);
      s_off.push_back(sf);
      s_on.push_back(sn);
      winner = res[0].on.winner;
    }
    const double won = Median(w_on), woff = Median(w_off);
    std::printf("%-8s %5d %6d %10.2fms %10.2fms %8.2fms %+5.0f%% %10.1fus %10.1fus  %s\n",
                adaptcomm::CompactByteSizeText(bytes).c_str(), candidates, window, woff / 1000,
                won / 1000, (won - woff) / 1000, woff > 0 ? 100 * (won - woff) / woff : 0,
                Median(s_off), Median(s_on), winner.c_str());
    std::fflush(stdout);
  }
  std::remove(off.c_str());
  std::remove(on.c_str());
  if (!all_checked) {
    std::printf("RESULT CHECK FAILED: some allreduce gave a wrong sum\n");
    return 1;
  }
  std::printf("every rank's last result checked element by element: ok\n");
  return 0;
}

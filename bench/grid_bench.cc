// A child of the 3D grid against a communicator of the child's size: 100 allreduces of 64 KiB on
// the tensor group (2 ranks, shared memory) of an 8-rank tensor 2 x pipeline 2 x data 2 grid, and
// on a 2-rank shared-memory communicator created directly on the same two ranks, batches
// alternating in rounds (drift of the machine hits both alike), the other six ranks idle. Prints
// the CreateGrid time (slowest rank) and, per round, both batches; then the best of each and their
// ratio (child / direct: 1.0 is "a child costs what a communicator of its size costs").
//
//   grid_bench [--rounds 6]
//
// Ranks are threads of one process (the test harness's RunRanks).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "adaptcomm/adaptcomm.h"
#include "adaptcomm/grid.h"
#include "tests/harness.h"

namespace {

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::_Exit(1);
  }
}

// 100 allreduces of 64 KiB.
absl::Duration Batch(adaptcomm::Communicator& c) {
  std::vector<float> x(16384, 1.0f);
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 100; ++i)
    Check(c.Allreduce(adaptcomm::HostView(x.data(), x.size())).Wait(), "allreduce");
  return absl::Now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 6;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc &&
        absl::SimpleAtoi(argv[i + 1], &rounds) && rounds >= 2) {
      ++i;
    } else {
      std::fprintf(stderr, "usage: grid_bench [--rounds N (>= 2)]\n");
      return 2;
    }
  }
  std::atomic<int> finished{0};
  std::atomic<int64_t> create_us{0};
  adaptcomm::testing::RunRanks(
      adaptcomm::testing::RankMode::kThreads, 8,
      [&](const adaptcomm::testing::RankEnv& env) {
        auto parent = adaptcomm::Communicator::Create(env.options);
        Check(parent.status(), "create");
        adaptcomm::GridOptions o;
        o.tensor = 2;
        o.pipeline = 2;
        o.backend = adaptcomm::BackendChoice::kShm;
        const absl::Time t0 = absl::Now();
        absl::StatusOr<adaptcomm::Grid> grid = adaptcomm::CreateGrid(**parent, o);
        Check(grid.status(), "CreateGrid");
        const int64_t us = absl::ToInt64Microseconds(absl::Now() - t0);
        for (int64_t seen = create_us.load();
             us > seen && !create_us.compare_exchange_weak(seen, us);) {
        }
        if (env.rank < 2) {
          adaptcomm::CommunicatorOptions direct = env.options;
          direct.world_size = 2;
          direct.name = "direct";
          direct.backend = adaptcomm::BackendChoice::kShm;
          auto pair = adaptcomm::Communicator::Create(direct);
          Check(pair.status(), "create direct");
          double best_child = 1e30, best_direct = 1e30;
          for (int round = 0; round < rounds; ++round) {
            const bool child_first = round % 2 == 0;
            absl::Duration child, alone;
            if (child_first) {
              child = Batch(*grid->tensor);
              alone = Batch(**pair);
            } else {
              alone = Batch(**pair);
              child = Batch(*grid->tensor);
            }
            if (env.rank == 0 && round > 0) {  // the first round warms up
              best_child = std::min(best_child, absl::ToDoubleMilliseconds(child));
              best_direct = std::min(best_direct, absl::ToDoubleMilliseconds(alone));
              std::printf("round %d: tensor group %.2f ms, 2-rank communicator %.2f ms\n", round,
                          absl::ToDoubleMilliseconds(child), absl::ToDoubleMilliseconds(alone));
            }
          }
          if (env.rank == 0) {
            std::printf("best: tensor group %.2f ms, 2-rank communicator %.2f ms, ratio %.2f\n",
                        best_child, best_direct, best_child / best_direct);
          }
          finished.fetch_add(1);
        }
        // The other ranks keep their grid until both timing ranks are done with theirs.
        const absl::Time deadline = absl::Now() + absl::Seconds(120);
        while (finished.load() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
      },
      absl::Seconds(300));
  std::printf("CreateGrid (tensor 2 x pipeline 2 x data 2, slowest rank): %.1f ms\n",
              static_cast<double>(create_us.load()) / 1000.0);
  return 0;
}

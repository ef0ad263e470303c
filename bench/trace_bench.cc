// Tracing overhead: allreduce with and without the timeline writer, same run, same ranks.
//
//   trace_bench [--rounds 10] [--quick]
//
// 2 ranks as threads of this process (Gloo over loopback, an in-process store). Each size runs
// in rounds that alternate "off" and "on" (so machine drift hits both alike); "on" wraps every
// op in the writer's OnEnqueue/OnStart/OnEnd, the calls the executor makes on its observers, with
// every op sampled (the worst case). Per-op time is rank 0's wall time of one op including those
// calls; the median of each mode and their ratio are printed, then the writer's own cost per op
// measured without a collective.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "adaptcomm/adaptcomm.h"
#include "adaptcomm/ext/backend.h"
#include "lib/trace/timeline_writer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct SizeCase {
  const char* label;
  size_t floats;
  int ops_per_round;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

adaptcomm::OpDesc Desc(adaptcomm::TensorView view, uint64_t seq) {
  adaptcomm::OpDesc op;
  op.kind = adaptcomm::OpKind::kAllreduce;
  op.input = view;
  op.output = view;
  op.seq = seq;
  return op;
}

struct RankResult {
  // [size index][mode 0 off, 1 on]: per-op microseconds.
  std::vector<std::vector<std::vector<double>>> us;
  std::string error;
  uint64_t trace_bytes = 0;
  uint64_t trace_events = 0;
};

void RunRank(int rank, int world, std::shared_ptr<adaptcomm::Store> store, const std::string& dir,
             const std::vector<SizeCase>& sizes, int rounds, RankResult& out) {
  adaptcomm::CommunicatorOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store = store;
  o.name = "trace_bench";
  o.backend = adaptcomm::BackendChoice::kGloo;
  o.timeout = absl::Seconds(60);
  auto comm = adaptcomm::Communicator::Create(o);
  if (!comm.ok()) {
    out.error = comm.status().ToString();
    return;
  }
  adaptcomm::trace::TimelineOptions to;
  to.rank = rank;
  to.world_size = world;
  to.dir = dir;
  to.backend = (*comm)->backend_name();
  auto writer = adaptcomm::trace::StartTimeline(
      adaptcomm::CreatePrefixStore("trace_bench", store).get(), to, absl::Seconds(30));
  if (!writer.ok()) {
    out.error = writer.status().ToString();
    return;
  }
  adaptcomm::trace::TimelineWriter& w = **writer;
  out.us.assign(sizes.size(), std::vector<std::vector<double>>(2));
  uint64_t seq = 0;
  for (size_t si = 0; si < sizes.size(); ++si) {
    std::vector<float> data(sizes[si].floats, 1.0f);
    const adaptcomm::TensorView view = adaptcomm::HostView(data.data(), data.size());
    // Warm-up: connections, first touch of buffers.
    for (int i = 0; i < 5; ++i) {
      ++seq;
      if (absl::Status s = (*comm)->Allreduce(view).Wait(); !s.ok()) {
        out.error = s.ToString();
        return;
      }
    }
    for (int round = 0; round < 2 * rounds; ++round) {
      const int mode = round % 2;
      if (absl::Status s = (*comm)->Barrier().Wait(); !s.ok()) {
        out.error = s.ToString();
        return;
      }
      ++seq;
      for (int i = 0; i < sizes[si].ops_per_round; ++i) {
        const adaptcomm::OpDesc op = Desc(view, ++seq);
        const auto t0 = Clock::now();
        if (mode == 1) {
          const absl::Time now = absl::Now();
          w.OnEnqueue(op, now);
          w.OnStart(op, now);
        }
        absl::Status s = (*comm)->Allreduce(view).Wait();
        if (mode == 1) w.OnEnd(op, s, absl::Now());
        const auto t1 = Clock::now();
        if (!s.ok()) {
          out.error = s.ToString();
          return;
        }
        out.us[si][mode].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    }
  }
  if (absl::Status s = w.Close(); !s.ok()) out.error = s.ToString();
  out.trace_bytes = w.stats().bytes;
  out.trace_events = w.stats().events_written;
}

// The writer's cost per op on the calling thread, no collective: the floor of its overhead.
double WriterCostUs(const std::string& dir, int sample_every) {
  adaptcomm::trace::TimelineOptions to;
  to.dir = dir + "/solo";
  to.sample_every = sample_every;
  auto w = adaptcomm::trace::OpenTimeline(to);
  if (!w.ok()) return -1;
  std::vector<float> data(1024);
  constexpr int kOps = 200000;
  const auto t0 = Clock::now();
  for (int i = 1; i <= kOps; ++i) {
    const adaptcomm::OpDesc op =
        Desc(adaptcomm::HostView(data.data(), data.size()), static_cast<uint64_t>(i));
    const absl::Time now = absl::Now();
    (*w)->OnEnqueue(op, now);
    (*w)->OnStart(op, now);
    (*w)->OnEnd(op, absl::OkStatus(), now);
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kOps;
  (*w)->Close().IgnoreError();
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 10;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: trace_bench [--rounds N] [--quick]\n");
      return 2;
    }
  }
  if (quick) rounds = 2;
  const std::vector<SizeCase> sizes = {{"4 KiB", 1024, quick ? 20 : 100},
                                       {"1 MiB", 262144, quick ? 5 : 20}};
  std::string dir = "/tmp/adaptcomm_trace_bench_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  constexpr int kWorld = 2;
  auto store = adaptcomm::CreateHashStore();
  std::vector<RankResult> results(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back(
        [&, r] { RunRank(r, kWorld, store, dir, sizes, rounds, results[static_cast<size_t>(r)]); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    if (!results[r].error.empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, results[r].error.c_str());
      return 1;
    }
  }
  std::printf(
      "trace_bench: 2 ranks (threads, gloo, loopback), %d rounds per mode, every op "
      "traced in 'on'\n",
      rounds);
  std::printf("%-7s %8s %14s %14s %9s\n", "size", "ops", "off med us", "on med us", "on/off");
  for (size_t si = 0; si < sizes.size(); ++si) {
    const double off = Median(results[0].us[si][0]);
    const double on = Median(results[0].us[si][1]);
    std::printf("%-7s %8zu %14.1f %14.1f %9.3f\n", sizes[si].label, results[0].us[si][0].size(),
                off, on, off > 0 ? on / off : 0);
  }
  std::printf("trace file rank 0: %llu events, %llu bytes (%.0f bytes/event)\n",
              static_cast<unsigned long long>(results[0].trace_events),
              static_cast<unsigned long long>(results[0].trace_bytes),
              results[0].trace_events
                  ? static_cast<double>(results[0].trace_bytes) / results[0].trace_events
                  : 0.0);
  std::printf(
      "writer cost on the op thread, no collective: %.3f us/op (all sampled), %.3f us/op "
      "(1 in 100 sampled)\n",
      WriterCostUs(dir, 1), WriterCostUs(dir, 100));
  for (int r = 0; r < kWorld; ++r) {
    std::remove((dir + "/trace.rank" + std::to_string(r) + ".json").c_str());
  }
  std::remove((dir + "/solo/trace.rank0.json").c_str());
  std::remove((dir + "/solo").c_str());
  std::remove(dir.c_str());
  return 0;
}

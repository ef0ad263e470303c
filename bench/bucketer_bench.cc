// The gradient bucketer against one allreduce per tensor and against one allreduce of the same
// total bytes, on shared memory and Gloo, in the same run (rounds alternate the variants, so drift
// of a shared machine hits them alike).
//
//   bucketer_bench [--ranks 2] [--rounds 5] [--backends shm,gloo] [--bucket-bytes 26214400]
//                  [--direct-bytes 1048576] [--wire f32|bf16|f16] [--compute-us 0]
//
// 1,000 f32 tensors like a model's gradients: 10 of 4 MiB, 90 of 256 KiB to 1 MiB, 900 of 4 to
// 32 KiB (about 100 MiB), avg over the ranks (forked processes). Variants:
//   bucketed      every tensor marked ready (last registered first) with its own buffer, then
//                 Wait(): the copies in and out are counted
//   in place      the same with each gradient written in its bucket slot (Storage(i)): no copies
//   per tensor    one Allreduce per tensor, all issued, then all waited for
//   single        one Allreduce of the total bytes (the floor for the bytes moved)
// With --wire bf16 (or f16) every variant sends that wire through the mixed-precision path
// (AllreduceMixed per tensor, per bucket, or once). Prints the median time of each and the ratios.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "adaptcomm/adaptcomm.h"
#include "adaptcomm/bucketer.h"
#include "adaptcomm/precision.h"
#include "tests/harness.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int ranks = 2;
  int rounds = 5;
  std::vector<std::string> backends = {"shm", "gloo"};
  std::optional<size_t> bucket_bytes;     // unset: the profile's (25 MiB)
  size_t direct_bytes = size_t{1} << 20;  // BucketerOptions' default
  adaptcomm::DType wire = adaptcomm::DType::kF32;
  // Backward's work before each gradient is ready, as on a GPU: the host sleeps (a busy wait would
  // take the cores the transport needs on a small host). What the bucketer's launches can overlap;
  // the single allreduce comes after all of it, as without overlap.
  int compute_us = 0;
};

std::vector<size_t> TensorCounts() {
  std::mt19937 rng(2024);
  std::vector<size_t> counts;
  auto between = [&](size_t lo, size_t hi) {
    return (lo + rng() % (hi - lo + 1)) / 4;  // bytes -> f32 elements
  };
  for (int i = 0; i < 10; ++i) counts.push_back((4u << 20) / 4);
  for (int i = 0; i < 90; ++i) counts.push_back(between(256u << 10, 1u << 20));
  for (int i = 0; i < 900; ++i) counts.push_back(between(4u << 10, 32u << 10));
  std::shuffle(counts.begin(), counts.end(), rng);
  return counts;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::_Exit(1);
  }
}

void RunBackend(const Config& cfg, const std::string& backend) {
  const std::vector<size_t> counts = TensorCounts();
  size_t total = 0;
  for (size_t c : counts) total += c;
  adaptcomm::testing::RunRanks(
      adaptcomm::testing::RankMode::kProcesses, cfg.ranks,
      [&](const adaptcomm::testing::RankEnv& env) {
        adaptcomm::CommunicatorOptions o = env.options;
        o.backend =
            backend == "gloo" ? adaptcomm::BackendChoice::kGloo : adaptcomm::BackendChoice::kShm;
        o.fallback = adaptcomm::Fallback::kDeny;
        auto comm = adaptcomm::Communicator::Create(o);
        Check(comm.status(), "create");
        adaptcomm::Communicator& c = **comm;
        std::vector<adaptcomm::GradientSpec> specs;
        for (size_t i = 0; i < counts.size(); ++i) {
          specs.push_back({"t" + std::to_string(i), counts[i]});
        }
        adaptcomm::BucketerOptions bo;
        bo.bucket_bytes = cfg.bucket_bytes;
        bo.direct_bytes = cfg.direct_bytes;
        bo.wire = cfg.wire;
        // A bf16/fp16 wire: the baselines go through AllreduceMixed too, with one context.
        adaptcomm::MixedPrecisionContext ctx(c);
        adaptcomm::MixedOptions mo;
        mo.wire = cfg.wire;
        mo.op = adaptcomm::ReduceOp::kAvg;
        mo.context = &ctx;
        auto bucketer = adaptcomm::GradientBucketer::Create(c, specs, bo);
        Check(bucketer.status(), "bucketer");
        std::vector<std::vector<float>> grads(counts.size());
        for (size_t i = 0; i < counts.size(); ++i) grads[i].assign(counts[i], 1.0f + env.rank);
        std::vector<float> flat(total, 1.0f);
        const int n = static_cast<int>(counts.size());
        auto time = [&](auto&& body) {
          Check(c.Barrier().Wait(), "barrier");
          const auto t0 = Clock::now();
          body();
          return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        };
        auto compute = [&] {
          if (cfg.compute_us == 0) return;
          absl::SleepFor(absl::Microseconds(cfg.compute_us));
        };
        std::vector<double> bucketed, in_place, per_tensor, single, compute_alone;
        int overlapped = 0;
        for (int round = 0; round <= cfg.rounds; ++round) {
          const double b = time([&] {
            for (int i = n - 1; i >= 0; --i) {
              compute();
              Check((*bucketer)->MarkReady(i, adaptcomm::HostView(grads[i].data(), counts[i])),
                    "mark");
            }
            auto st = (*bucketer)->Wait();
            Check(st.status(), "wait");
            overlapped = st->launched_before_wait;
          });
          const double p = time([&] {
            for (int i = n - 1; i >= 0; --i) {
              compute();
              Check((*bucketer)->MarkReady(i), "mark in place");
            }
            Check((*bucketer)->Wait().status(), "wait in place");
          });
          const double t = time([&] {
            if (cfg.wire != adaptcomm::DType::kF32) {
              for (int i = n - 1; i >= 0; --i) {
                compute();
                Check(adaptcomm::AllreduceMixed(c, adaptcomm::HostView(grads[i].data(), counts[i]),
                                                mo)
                          .status(),
                      "per tensor mixed");
              }
              return;
            }
            std::vector<adaptcomm::Work> works;
            works.reserve(n);
            for (int i = n - 1; i >= 0; --i) {
              compute();
              works.push_back(c.Allreduce(adaptcomm::HostView(grads[i].data(), counts[i]),
                                          {adaptcomm::ReduceOp::kAvg}));
            }
            for (auto& w : works) Check(w.Wait(), "per tensor");
          });
          const double s = time([&] {
            for (int i = 0; i < n; ++i) compute();
            if (cfg.wire != adaptcomm::DType::kF32) {
              Check(adaptcomm::AllreduceMixed(c, adaptcomm::HostView(flat.data(), flat.size()), mo)
                        .status(),
                    "single mixed");
              return;
            }
            Check(c.Allreduce(adaptcomm::HostView(flat.data(), flat.size()),
                              {adaptcomm::ReduceOp::kAvg})
                      .Wait(),
                  "single");
          });
          const double a = cfg.compute_us == 0 ? 0 : time([&] {
            for (int i = 0; i < n; ++i) compute();
          });
          if (round == 0) continue;  // warm-up: first touch of every buffer
          compute_alone.push_back(a);
          bucketed.push_back(b);
          in_place.push_back(p);
          per_tensor.push_back(t);
          single.push_back(s);
        }
        if (env.rank != 0) return;
        const double b = Median(bucketed), p = Median(in_place), t = Median(per_tensor),
                     s = Median(single);
        std::printf(
            "%s, %s wire, %d ranks, %zu tensors, %.1f MiB, %d buckets (%d launched before Wait), "
            "%d us of compute per tensor, median of %d rounds:\n"
            "  bucketed %8.1f ms   in place %8.1f ms   per tensor %8.1f ms   single %8.1f ms\n"
            "  per tensor / bucketed = %.2fx   bucketed / single = %.2fx   in place / single = "
            "%.2fx\n"
            "  backward alone %8.1f ms\n",
            backend.c_str(), adaptcomm::DTypeName(cfg.wire), cfg.ranks, counts.size(),
            total * 4.0 / (1 << 20), (*bucketer)->bucket_count(), overlapped, cfg.compute_us,
            cfg.rounds, b, p, t, s, t / b, b / s, p / s, Median(compute_alone));
        std::fflush(stdout);
      },
      absl::Minutes(20));
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--ranks" && has_value) {
      cfg.ranks = std::atoi(argv[++i]);
    } else if (a == "--rounds" && has_value) {
      cfg.rounds = std::atoi(argv[++i]);
    } else if (a == "--backends" && has_value) {
      cfg.backends = absl::StrSplit(argv[++i], ',', absl::SkipEmpty());
    } else if (a == "--bucket-bytes" && has_value) {
      cfg.bucket_bytes = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--wire" && has_value) {
      const std::string w = argv[++i];
      cfg.wire = w == "bf16"  ? adaptcomm::DType::kBF16
                 : w == "f16" ? adaptcomm::DType::kF16
                              : adaptcomm::DType::kF32;
    } else if (a == "--compute-us" && has_value) {
      cfg.compute_us = std::atoi(argv[++i]);
    } else if (a == "--direct-bytes" && has_value) {
      cfg.direct_bytes = std::strtoul(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--ranks N] [--rounds N] [--backends shm,gloo] [--bucket-bytes B] "
                   "[--direct-bytes B] [--wire f32|bf16|f16] [--compute-us N]\n",
                   argv[0]);
      return 2;
    }
  }
  for (const std::string& b : cfg.backends) RunBackend(cfg, b);
  return 0;
}

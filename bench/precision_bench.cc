// Mixed-precision benchmarks, each against its baseline in the same run:
//   1. allreduce of fp32 data through a bf16 wire (AllreduceMixed, host barrier) vs the plain fp32
//      allreduce, 2 and 4 ranks, 64 MiB of fp32 per rank by default;
//   2. cast throughput, one thread, per instruction-set path, vs memcpy of the same input; and the
//      multi-threaded public cast.
//
//   precision_bench [--ranks 2,4] [--mib 64] [--iters 15] [--chunk-mib M] [--skip-allreduce]
//                   [--skip-cast] [--backend gloo|shm]   (default gloo)
// (--chunk-mib: MixedOptions::pipeline_chunk_bytes in MiB, default: the library's default.)
//
// Ranks are forked processes (forked before this process starts any thread) that rendezvous
// through the TCP store rank 0 serves on a free loopback port; each rank reports its timings
// through a pipe. Iterations alternate fp32 and bf16 (so machine drift hits both alike), each
// starts after a Barrier, and an iteration's time is the slowest rank's; the median is reported.
// Bandwidths are GB/s = 1e9 bytes/s. For the casts, "traffic" counts bytes read + written, the
// fair comparison with memcpy (which reads and writes the same number of bytes it copies).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "adaptcomm/adaptcomm.h"
#include "adaptcomm/precision.h"
#include "lib/base/cast_kernels.h"
#include "lib/precision/cast_parallel.h"
#include "tests/harness.h"

namespace {

using Clock = std::chrono::steady_clock;
using adaptcomm::DType;

struct Config {
  std::vector<int> ranks = {2, 4};
  size_t mib = 64;
  int iters = 15;
  double chunk_mib = -1;  // MixedOptions::pipeline_chunk_bytes in MiB; < 0: the default
  bool allreduce = true;
  bool cast = true;
  adaptcomm::BackendChoice backend = adaptcomm::BackendChoice::kGloo;
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// ---- 1. allreduce ----

// One rank: alternating fp32 / bf16-wire iterations; writes "fp32 t0 t1 ...\nbf16 t0 ...\n".
int RankMain(int rank, int world, int port, const Config& cfg, int out_fd) {
  adaptcomm::CommunicatorOptions o;
  o.rank = rank;
  o.world_size = world;
  o.name = "precision_bench";
  o.backend = cfg.backend;
  o.fallback = adaptcomm::Fallback::kDeny;  // measure the backend asked for, or fail
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.timeout = absl::Seconds(120);
  o.init_timeout = absl::Seconds(60);
  auto comm_or = adaptcomm::Communicator::Create(o);
  if (!comm_or.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm_or.status().ToString().c_str());
    return 1;
  }
  adaptcomm::Communicator& comm = **comm_or;
  const size_t n = cfg.mib * (size_t{1} << 20) / sizeof(float);
  std::vector<float> pristine(n), data(n);
  // Small integers: every partial sum is exact in bf16, so both paths can be checked exactly.
  for (size_t i = 0; i < n; ++i) pristine[i] = float(i % 7) + float(rank);
  adaptcomm::MixedPrecisionContext ctx(comm);
  ctx.Reserve(n);
  adaptcomm::MixedOptions mo;
  mo.wire = DType::kBF16;
  mo.context = &ctx;
  if (cfg.chunk_mib >= 0) mo.pipeline_chunk_bytes = static_cast<size_t>(cfg.chunk_mib * (1 << 20));
  std::vector<uint16_t> wire_only(n);
  adaptcomm::CastF32ToBF16(pristine.data(), wire_only.data(), n);
  std::vector<double> t32, t16, twire, tcast, tcoll, tback;
  const int warmup = 2;
  for (int it = 0; it < warmup + cfg.iters; ++it) {
    for (int kind = 0; kind < 3; ++kind) {
      std::memcpy(data.data(), pristine.data(), n * sizeof(float));
      if (!comm.Barrier().Wait().ok()) return 2;
      const auto t0 = Clock::now();
      absl::Status s;
      absl::StatusOr<adaptcomm::MixedStats> st;
      if (kind == 0) {
        s = comm.Allreduce(adaptcomm::HostView(data.data(), n)).Wait();
      } else if (kind == 1) {
        st = adaptcomm::AllreduceMixed(comm, adaptcomm::HostView(data.data(), n), mo);
        s = st.status();
      } else {
        // The bf16 collective alone, on an already-cast buffer: what the casts add on top.
        adaptcomm::TensorView v{wire_only.data(), n, DType::kBF16, adaptcomm::Device::Cpu(),
                                nullptr};
        s = comm.Allreduce(v).Wait();
      }
      const double t = Seconds(t0, Clock::now());
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
        return 3;
      }
      if (kind == 2) {
        if (it >= warmup) twire.push_back(t);
        adaptcomm::CastF32ToBF16(pristine.data(), wire_only.data(), n);
        continue;
      }
      if (kind == 1 && it >= warmup) {
        tcast.push_back(absl::ToDoubleSeconds(st->cast_time));
        tcoll.push_back(absl::ToDoubleSeconds(st->collective_time));
        tback.push_back(absl::ToDoubleSeconds(st->cast_back_time));
      }
      for (size_t i = 0; i < n; i += 4099) {
        const float want = float(world * int(i % 7) + world * (world - 1) / 2);
        if (data[i] != want) {
          std::fprintf(stderr, "rank %d: wrong result %g != %g at %zu (%s)\n", rank, data[i], want,
                       i, kind ? "bf16" : "fp32");
          return 4;
        }
      }
      if (it >= warmup) (kind == 0 ? t32 : t16).push_back(t);
    }
  }
  std::string out;
  const std::pair<const char*, std::vector<double>*> series[] = {
      {"fp32", &t32},   {"bf16", &t16},   {"wire", &twire},
      {"cast", &tcast}, {"coll", &tcoll}, {"back", &tback}};
  for (const auto& [name, v] : series) {
    out += name;
    for (double t : *v) out += " " + std::to_string(t);
    out += "\n";
  }
  if (write(out_fd, out.data(), out.size()) != static_cast<ssize_t>(out.size())) return 5;
  return 0;
}

bool RunAllreduce(int world, const Config& cfg) {
  const int port = adaptcomm::testing::PickFreePort();
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int r = 0; r < world; ++r) {
    int p[2];
    if (pipe(p) != 0) return false;
    const pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      const int rc = RankMain(r, world, port, cfg, p[1]);
      close(p[1]);
      std::fflush(stderr);
      _exit(rc);
    }
    close(p[1]);
    pids.push_back(pid);
    fds.push_back(p[0]);
  }
  std::vector<std::vector<double>> fp32(world), bf16(world), wire(world), cast(world), coll(world),
      back(world);
  bool ok = true;
  for (int r = 0; r < world; ++r) {
    std::string text;
    char buf[4096];
    for (ssize_t got; (got = read(fds[r], buf, sizeof(buf))) > 0;) text.append(buf, got);
    close(fds[r]);
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::printf("rank %d failed (status %d)\n", r, status);
      ok = false;
      continue;
    }
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      std::vector<double>& dst = parts[0] == "fp32"   ? fp32[r]
                                 : parts[0] == "bf16" ? bf16[r]
                                 : parts[0] == "wire" ? wire[r]
                                 : parts[0] == "cast" ? cast[r]
                                 : parts[0] == "coll" ? coll[r]
                                                      : back[r];
      for (size_t k = 1; k < parts.size(); ++k) {
        double v = 0;
        if (absl::SimpleAtod(parts[k], &v)) dst.push_back(v);
      }
    }
  }
  if (!ok) return false;
  // An iteration's time is its slowest rank's.
  auto per_iteration = [&](const std::vector<std::vector<double>>& per_rank) {
    std::vector<double> t(per_rank[0].size(), 0.0);
    for (const auto& v : per_rank)
      for (size_t i = 0; i < t.size() && i < v.size(); ++i) t[i] = std::max(t[i], v[i]);
    return t;
  };
  auto slowest = [&](const std::vector<std::vector<double>>& per_rank) {
    return Median(per_iteration(per_rank));
  };
  const double m32 = slowest(fp32), m16 = slowest(bf16);
  // The ratio within each iteration (its fp32 and bf16 ops run back to back): steadier than the
  // ratio of the medians on a machine whose load drifts.
  std::vector<double> paired;
  {
    const std::vector<double> a = per_iteration(fp32), b = per_iteration(bf16);
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) paired.push_back(b[i] / a[i]);
  }
  const double bytes = double(cfg.mib) * (1 << 20);
  const double bus = 2.0 * (world - 1) / world;
  std::printf(
      "allreduce %3zu MiB fp32, %d ranks: fp32 %8.2f ms (busbw %.2f GB/s) | bf16 wire "
      "%8.2f ms (busbw %.2f GB/s of fp32 data) | bf16/fp32 = %.2fx%s\n",
      cfg.mib, world, m32 * 1e3, bytes / m32 * bus / 1e9, m16 * 1e3, bytes / m16 * bus / 1e9,
      m16 / m32,
      world == 2 ? (m16 <= 0.6 * m32 ? "  [target <= 0.6x: met]" : "  [target <= 0.6x: MISSED]")
                 : "  (4 ranks on 2 cores: scheduler-bound, functional)");
  std::printf(
      "    bf16 wire breakdown (rank 0 medians): cast %.2f ms, collectives + fused sum %.2f ms, "
      "cast back %.2f ms; the bf16 collective alone (pre-cast buffer) %.2f ms; median of the "
      "per-iteration bf16/fp32 ratios %.2fx\n",
      Median(cast[0]) * 1e3, Median(coll[0]) * 1e3, Median(back[0]) * 1e3, slowest(wire) * 1e3,
      Median(paired));
  return true;
}

// ---- 2. casts ----

template <typename F>
double TimeMedian(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(Seconds(t0, Clock::now()));
  }
  return Median(t);
}

void RunCasts(const Config& cfg) {
  namespace p = adaptcomm::precision;
  const size_t n = cfg.mib * (size_t{1} << 20) / sizeof(float);
  const double in_bytes = double(n) * 4;
  std::vector<float> f32(n), f32_out(n), copy(n);
  std::vector<uint16_t> half(n);
  for (size_t i = 0; i < n; ++i) f32[i] = std::ldexp(float(int(i % 2001) - 1000), -int(i % 13));
  std::memset(f32_out.data(), 1, n * 4);  // first-touch outside the timings
  std::memset(copy.data(), 1, n * 4);
  std::memset(half.data(), 1, n * 2);
  const int reps = 7;
  const double t_memcpy =
      TimeMedian(reps, [&] { std::memcpy(copy.data(), f32.data(), n * sizeof(float)); });
  const double memcpy_traffic = 2 * in_bytes / t_memcpy;
  std::printf("\nmemcpy %zu MiB, 1 thread: %.2f GB/s copied (%.2f GB/s traffic)\n", cfg.mib,
              in_bytes / t_memcpy / 1e9, memcpy_traffic / 1e9);
  std::printf("%-12s %-10s %10s %12s %14s %16s\n", "path", "cast", "ms", "Gelem/s", "traffic GB/s",
              "vs memcpy traffic");
  double best_narrow_ratio = 0;
  for (p::CastPath path : p::SupportedCastPaths()) {
    struct Row {
      const char* name;
      double traffic_bytes;
      double t;
    };
    std::vector<Row> rows = {
        {"f32->bf16", in_bytes * 1.5,
         TimeMedian(reps, [&] { p::F32ToBF16(path, f32.data(), half.data(), n); })},
        {"f32->f16", in_bytes * 1.5,
         TimeMedian(reps, [&] { p::F32ToF16(path, f32.data(), half.data(), n); })},
        {"bf16->f32", in_bytes * 1.5,
         TimeMedian(reps, [&] { p::BF16ToF32(path, half.data(), f32_out.data(), n); })},
        {"f16->f32", in_bytes * 1.5,
         TimeMedian(reps, [&] { p::F16ToF32(path, half.data(), f32_out.data(), n); })},
    };
    for (const Row& r : rows) {
      const double ratio = r.traffic_bytes / r.t / memcpy_traffic;
      if (path == p::ActiveCastPath() && r.name[0] == 'f' && r.name[1] == '3') {
        best_narrow_ratio = best_narrow_ratio == 0 ? ratio : std::min(best_narrow_ratio, ratio);
      }
      std::printf("%-12s %-10s %10.2f %12.2f %14.2f %15.2fx\n", p::CastPathName(path), r.name,
                  r.t * 1e3, double(n) / r.t / 1e9, r.traffic_bytes / r.t / 1e9, ratio);
    }
  }
  std::printf(
      "active path %s: narrowing casts run at >= %.2fx single-thread memcpy traffic "
      "[target >= 0.5x: %s]\n",
      adaptcomm::CastImplementationName(), best_narrow_ratio,
      best_narrow_ratio >= 0.5 ? "met" : "MISSED");
  // The public functions split buffers >= 4 MiB over the pool.
  const double t_mt =
      TimeMedian(reps, [&] { adaptcomm::CastF32ToBF16(f32.data(), half.data(), n); });
  const double t_mt_back =
      TimeMedian(reps, [&] { adaptcomm::CastBF16ToF32(half.data(), f32_out.data(), n); });
  std::printf(
      "public multi-threaded (%d pool threads): f32->bf16 %.2f ms (%.2f GB/s traffic), "
      "bf16->f32 %.2f ms\n",
      p::CastPoolWorkers(), t_mt * 1e3, in_bytes * 1.5 / t_mt / 1e9, t_mt_back * 1e3);
}

bool ParseArgs(int argc, char** argv, Config& cfg) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--ranks") {
      cfg.ranks.clear();
      for (absl::string_view s : absl::StrSplit(next(), ',', absl::SkipEmpty())) {
        int v = 0;
        if (!absl::SimpleAtoi(s, &v) || v < 1) return false;
        cfg.ranks.push_back(v);
      }
    } else if (a == "--mib") {
      if (!absl::SimpleAtoi(next(), &cfg.mib) || cfg.mib == 0) return false;
    } else if (a == "--iters") {
      if (!absl::SimpleAtoi(next(), &cfg.iters) || cfg.iters < 1) return false;
    } else if (a == "--chunk-mib") {
      if (!absl::SimpleAtod(next(), &cfg.chunk_mib)) return false;
    } else if (a == "--skip-allreduce") {
      cfg.allreduce = false;
    } else if (a == "--skip-cast") {
      cfg.cast = false;
    } else if (a == "--backend") {
      const std::string b = next();
      if (b == "gloo") {
        cfg.backend = adaptcomm::BackendChoice::kGloo;
      } else if (b == "shm") {
        cfg.backend = adaptcomm::BackendChoice::kShm;
      } else {
        return false;
      }
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (!ParseArgs(argc, argv, cfg)) {
    std::fprintf(stderr,
                 "usage: precision_bench [--ranks 2,4] [--mib 64] [--iters 15] [--chunk-mib M] "
                 "[--skip-allreduce] [--skip-cast] [--backend gloo|shm]\n");
    return 2;
  }
  // Timings on a shared machine mean little without its load: print it before and after.
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3)
    std::printf("load average (1/5/15 min): %.2f %.2f %.2f\n", load[0], load[1], load[2]);
  std::printf("cast path: %s\n", adaptcomm::CastImplementationName());
  bool ok = true;
  // Allreduce first: the ranks are forked while this process has no threads yet.
  if (cfg.allreduce) {
    for (int world : cfg.ranks) ok = RunAllreduce(world, cfg) && ok;
  }
  if (cfg.cast) RunCasts(cfg);
  if (getloadavg(load, 3) == 3)
    std::printf("load average (1/5/15 min): %.2f %.2f %.2f\n", load[0], load[1], load[2]);
  return ok ? 0 : 1;
}

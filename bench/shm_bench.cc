// The shm backend against the Gloo backend, both driven directly (no communicator, no executor
// thread): what the transport itself costs per op, in rounds that alternate the two.
//
//   shm_bench [--ranks 2] [--sizes 4096,262144,4194304,67108864] [--rounds 6] [--chunk BYTES]
//             [--flat BYTES] [--slot BYTES] [--spin-us N] [--no-gloo] [--bind-to auto|core|none]
//
// float32 sum allreduce; ranks are forked processes sharing a file store, each on a core of its
// own when there are enough (--bind-to auto, as `adaptcomm launch`; OpenMPI's mpirun binds its
// ranks to cores too). Prints, per size, the median over rounds of the mean op time in a round,
// with nccl-tests' busbw.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "adaptcomm/adaptcomm.h"
#include "lib/base/cpu_binding.h"
#include "lib/gloo/gloo_backend.h"
#include "lib/shm/shm_backend.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int ranks = 2;
  std::vector<size_t> sizes = {4096, 262144, 4u << 20, 64u << 20};
  int rounds = 6;
  adaptcomm::ShmBackendOptions shm;
  bool gloo = true;
  adaptcomm::CpuBindMode bind = adaptcomm::CpuBindMode::kAuto;
};

int Iterations(size_t bytes) { return bytes <= (256u << 10) ? 200 : bytes <= (4u << 20) ? 20 : 4; }

// Mean microseconds per allreduce over `iters` back-to-back ops.
double Round(adaptcomm::Backend& b, std::vector<float>& data, int iters, uint64_t& seq) {
  adaptcomm::OpDesc op;
  op.kind = adaptcomm::OpKind::kAllreduce;
  op.input = op.output = adaptcomm::HostView(data.data(), data.size());
  op.timeout = absl::Seconds(60);
  adaptcomm::OpDesc barrier;
  barrier.kind = adaptcomm::OpKind::kBarrier;
  barrier.timeout = absl::Seconds(60);
  barrier.seq = ++seq;
  if (!b.Run(barrier).ok()) std::_Exit(1);
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    op.seq = ++seq;
    if (absl::Status s = b.Run(op); !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", b.name(), s.ToString().c_str());
      std::_Exit(1);
    }
  }
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void RankMain(const Config& cfg, int rank, const std::string& dir, FILE* report) {
  auto store = adaptcomm::CreateFileStore(dir);
  if (!store.ok()) std::_Exit(1);
  adaptcomm::ShmBackendOptions so = cfg.shm;
  so.rank = rank;
  so.size = cfg.ranks;
  so.store = adaptcomm::CreatePrefixStore("shm", *store);
  auto shm = adaptcomm::CreateShmBackend(so);
  if (!shm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, shm.status().ToString().c_str());
    std::_Exit(1);
  }
  std::unique_ptr<adaptcomm::Backend> gloo;
  if (cfg.gloo) {
    adaptcomm::GlooBackendOptions go;
    go.rank = rank;
    go.size = cfg.ranks;
    go.store = adaptcomm::CreatePrefixStore("gloo", *store);
    go.hostname = "127.0.0.1";
    auto g = adaptcomm::CreateGlooBackend(go);
    if (!g.ok()) std::_Exit(1);
    gloo = std::move(*g);
  }
  uint64_t shm_seq = 0, gloo_seq = 0;
  for (size_t bytes : cfg.sizes) {
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    const int iters = Iterations(bytes);
    std::vector<double> t_shm, t_gloo;
    Round(**shm, data, 2, shm_seq);  // warm-up: first touch
    if (gloo) Round(*gloo, data, 2, gloo_seq);
    for (int r = 0; r < cfg.rounds; ++r) {
      t_shm.push_back(Round(**shm, data, iters, shm_seq));
      if (gloo) t_gloo.push_back(Round(*gloo, data, iters, gloo_seq));
    }
    if (report != nullptr) {
      const double f = 2.0 * (cfg.ranks - 1) / cfg.ranks;
      const double ts = Median(t_shm), tg = gloo ? Median(t_gloo) : 0;
      std::fprintf(report, "%d ranks %10zu B  shm %10.1f us %7.3f GB/s busbw", cfg.ranks, bytes, ts,
                   bytes / ts / 1e3 * f);
      if (gloo) std::fprintf(report, "   gloo %10.1f us %7.3f GB/s", tg, bytes / tg / 1e3 * f);
      std::fprintf(report, "\n");
      std::fflush(report);
    }
  }
}

bool Parse(int argc, char** argv, Config& cfg) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    auto size_arg = [&](size_t& out) { return absl::SimpleAtoi(v, &out) && (++i, true); };
    if (a == "--ranks") {
      if (!absl::SimpleAtoi(v, &cfg.ranks) || cfg.ranks < 1) return false;
      ++i;
    } else if (a == "--sizes") {
      cfg.sizes.clear();
      for (auto s : absl::StrSplit(v, ',')) {
        size_t n;
        if (!absl::SimpleAtoi(s, &n) || n < 4) return false;
        cfg.sizes.push_back(n);
      }
      ++i;
    } else if (a == "--rounds") {
      if (!absl::SimpleAtoi(v, &cfg.rounds) || cfg.rounds < 1) return false;
      ++i;
    } else if (a == "--chunk") {
      if (!size_arg(cfg.shm.chunk_bytes)) return false;
    } else if (a == "--flat") {
      if (!size_arg(cfg.shm.flat_max_bytes)) return false;
    } else if (a == "--slot") {
      if (!size_arg(cfg.shm.slot_bytes)) return false;
    } else if (a == "--spin-us") {
      int us;
      if (!absl::SimpleAtoi(v, &us)) return false;
      cfg.shm.spin = absl::Microseconds(us);
      ++i;
    } else if (a == "--no-gloo") {
      cfg.gloo = false;
    } else if (a == "--bind-to") {
      absl::StatusOr<adaptcomm::CpuBindMode> mode = adaptcomm::ParseCpuBindMode(v);
      if (!mode.ok()) return false;
      cfg.bind = *mode;
      ++i;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (!Parse(argc, argv, cfg)) {
    std::fprintf(stderr,
                 "usage: shm_bench [--ranks N] [--sizes B,B,...] [--rounds N] [--chunk B] "
                 "[--flat B] [--slot B] [--spin-us N] [--no-gloo] [--bind-to auto|core|none]\n");
    return 2;
  }
  const std::vector<std::vector<int>> cores = adaptcomm::AllowedCores();
  std::vector<std::vector<int>> rank_cpus;
  for (int r = 0; r < cfg.ranks; ++r) {
    absl::StatusOr<std::vector<int>> cpus =
        adaptcomm::CpusForLocalRank(cores, cfg.bind, r, cfg.ranks);
    if (!cpus.ok()) {
      std::fprintf(stderr, "shm_bench: --bind-to: %s\n",
                   std::string(cpus.status().message()).c_str());
      return 2;
    }
    rank_cpus.push_back(*std::move(cpus));
  }
  char tmpl[] = "/tmp/shm_bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < cfg.ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (const std::vector<int>& cpus = rank_cpus[static_cast<size_t>(r)]; !cpus.empty()) {
        if (absl::Status s = adaptcomm::BindCallingThread(cpus); !s.ok()) {
          std::fprintf(stderr, "shm_bench: rank %d: %s\n", r, std::string(s.message()).c_str());
          std::_Exit(1);
        }
      }
      RankMain(cfg, r, tmpl, r == 0 ? stdout : nullptr);
      std::fflush(stdout);
      std::_Exit(0);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
  }
  return failed == 0 ? 0 : 1;
}

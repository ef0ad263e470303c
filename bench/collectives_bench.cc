// Collective throughput of adaptcomm against raw Gloo, in the same run on the same machine.
//
//   collectives_bench [--ranks 2,4] [--ops allreduce,allgather,reduce_scatter,broadcast]
//                     [--min-bytes 4096] [--max-bytes 67108864] [--csv FILE] [--quick]
//                     [--retries N]   (attempts per op; 1 = off, the default: raw Gloo has none)
//                     [--backend gloo|shm|auto]   (adaptcomm's backend; default gloo)
//                     [--no-baseline]   (adaptcomm alone: profiling, or its cost per op alone)
//                     [--hosts H]   (fake hosts: network namespaces, root only; default 1)
//
// Ranks are forked processes on loopback. With --hosts H they are spread over H network
// namespaces joined by a bridge (rank r on host r % H), which the library tells apart as hosts:
// `--backend auto` then runs the hierarchical backend (shared memory inside each namespace, Gloo
// between the host leaders) while raw Gloo stays one flat ring over every rank, as a Gloo user
// would run it across those hosts. Every size runs in rounds that alternate adaptcomm and
// raw Gloo (so drift of the machine hits both alike); the median time of each is reported with
// nccl-tests' algbw/busbw. Raw Gloo has no reduce_scatter in its options API, so its baseline for
// reduce_scatter is the allreduce a raw-Gloo user would call instead (said in the output).
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "adaptcomm/adaptcomm.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "lib/gloo/gloo_store_adapter.h"
#include "tests/harness.h"
#include "tests/netns.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  std::vector<int> ranks = {2, 4};
  std::vector<std::string> ops = {"allreduce", "allgather", "reduce_scatter", "broadcast"};
  size_t min_bytes = 4096;
  size_t max_bytes = 64u << 20;
  std::string csv;
  bool quick = false;
  // Coordinated retry (1 = off, as raw Gloo has none); with retry.replay copy it copies each
  // op's input first (docs/resilience.md).
  int retries = 1;
  adaptcomm::BackendChoice backend = adaptcomm::BackendChoice::kGloo;
  bool baseline = true;  // raw Gloo in the same rounds
  int hosts = 1;         // > 1: network namespaces as hosts (root only)
};

// Where a rank runs: its namespace's address (loopback with one host) and rank 0's.
struct Place {
  std::string ip = "127.0.0.1";
  std::string master_ip = "127.0.0.1";
  std::string iface;  // the namespace's interface, empty on loopback
};

double BusFactor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return double(n - 1) / n;
}

int Iterations(size_t bytes, bool quick) {
  int it = bytes <= (256u << 10) ? 200 : bytes <= (4u << 20) ? 40 : 12;
  return quick ? std::max(3, it / 8) : it;
}

struct Buffers {
  std::vector<float> in, out;
};

// One timed op of either implementation, on buffers sized for `bytes` (see nccl-tests: bytes is
// the full buffer for allreduce/broadcast and the gathered/scattered total for the others).
class Runner {
 public:
  // `raw`: null runs no baseline (Raw() returns 0).
  Runner(adaptcomm::Communicator& comm, std::shared_ptr<gloo::Context> raw)
      : comm_(comm), raw_(std::move(raw)) {}

  void Prepare(const std::string& op, size_t bytes) {
    const size_t total = bytes / sizeof(float);
    const size_t block = total / comm_.size();
    if (op == "allreduce" || op == "broadcast") {
      b_.in.assign(total, 1.0f);
      b_.out.assign(total, 0.0f);
    } else if (op == "allgather") {
      b_.in.assign(block, 1.0f);
      b_.out.assign(block * comm_.size(), 0.0f);
    } else {
      b_.in.assign(block * comm_.size(), 1.0f);
      b_.out.assign(block, 0.0f);
    }
  }

  double Ours(const std::string& op) {
    auto t0 = Clock::now();
    absl::Status s;
    auto in = adaptcomm::HostView(b_.in.data(), b_.in.size());
    auto out = adaptcomm::HostView(b_.out.data(), b_.out.size());
    if (op == "allreduce")
      s = comm_.Allreduce(in).Wait();
    else if (op == "broadcast")
      s = comm_.Broadcast(in).Wait();
    else if (op == "allgather")
      s = comm_.Allgather(in, out).Wait();
    else
      s = comm_.ReduceScatter(in, out).Wait();
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (!s.ok()) {
      std::fprintf(stderr, "adaptcomm %s failed: %s\n", op.c_str(), s.ToString().c_str());
      _exit(1);
    }
    return us;
  }

  double Raw(const std::string& op) {
    if (raw_ == nullptr) return 0;
    auto t0 = Clock::now();
    if (op == "allreduce" || op == "reduce_scatter") {
      gloo::AllreduceOptions o(raw_);
      o.setOutput(b_.in.data(), b_.in.size());
      o.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      gloo::allreduce(o);
    } else if (op == "broadcast") {
      gloo::BroadcastOptions o(raw_);
      o.setOutput(b_.in.data(), b_.in.size());
      o.setRoot(0);
      gloo::broadcast(o);
    } else {
      gloo::AllgatherOptions o(raw_);
      o.setInput(b_.in.data(), b_.in.size());
      o.setOutput(b_.out.data(), b_.out.size());
      gloo::allgather(o);
    }
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }

 private:
  adaptcomm::Communicator& comm_;
  std::shared_ptr<gloo::Context> raw_;
  Buffers b_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Raw Gloo on its own context and pairs, rendezvous through the same TCP store.
std::shared_ptr<gloo::rendezvous::Context> ConnectRawGloo(int rank, int world, int port,
                                                          const Place& place) {
  adaptcomm::TcpStoreOptions so;
  so.host = place.master_ip;
  so.port = port;
  auto store = adaptcomm::ConnectTcpStore(so);
  if (!store.ok()) _exit(1);
  adaptcomm::gloo_backend::GlooStoreAdapter adapter(
      adaptcomm::CreatePrefixStore("raw-gloo", *store), absl::Seconds(60));
  gloo::transport::tcp::attr attr;
  attr.hostname = place.ip;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto raw = std::make_shared<gloo::rendezvous::Context>(rank, world);
  raw->connectFullMesh(adapter, device);
  return raw;
}

void RankMain(const Config& cfg, int rank, int world, int port, const Place& place, FILE* report) {
  adaptcomm::CommunicatorOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_addr = place.master_ip;
  if (!place.iface.empty()) o.iface = place.iface;  // loopback: GLOO_SOCKET_IFNAME, else routed
  o.master_port = port;
  o.backend = cfg.backend;
  // Measure the backend asked for, or fail; auto reports what it chose (and why) instead.
  o.fallback = cfg.backend == adaptcomm::BackendChoice::kAuto ? adaptcomm::Fallback::kAllow
                                                              : adaptcomm::Fallback::kDeny;
  o.max_retry_attempts = cfg.retries;
  auto comm = adaptcomm::Communicator::Create(o);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    _exit(1);
  }
  if (report != nullptr) {
    std::fprintf(report, "#%s: %s\n", (*comm)->backend_name(), (*comm)->selection_reason().c_str());
  }
  std::shared_ptr<gloo::rendezvous::Context> raw;
  if (cfg.baseline) raw = ConnectRawGloo(rank, world, port, place);
  Runner runner(**comm, raw);
  for (const std::string& op : cfg.ops) {
    for (size_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes; bytes *= 4) {
      if (bytes / sizeof(float) < size_t(world)) continue;
      runner.Prepare(op, bytes);
      const int iters = Iterations(bytes, cfg.quick);
      std::vector<double> ours, raw_times;
      for (int w = 0; w < 2; ++w) {  // warm-up: first touch of buffers, TCP windows
        runner.Ours(op);
        runner.Raw(op);
      }
      for (int i = 0; i < iters; ++i) {
        // Alternate the order too, so neither always runs right after the other.
        if (i % 2 == 0) {
          ours.push_back(runner.Ours(op));
          raw_times.push_back(runner.Raw(op));
        } else {
          raw_times.push_back(runner.Raw(op));
          ours.push_back(runner.Ours(op));
        }
      }
      if (rank == 0) {
        double t_ours = Median(ours), t_raw = Median(raw_times);
        double algbw = bytes / t_ours / 1e3, raw_algbw = bytes / t_raw / 1e3;  // GB/s
        double f = BusFactor(op, world);
        std::fprintf(report, "%s,%d,%zu,%.1f,%.3f,%.3f,%.1f,%.3f,%.3f\n", op.c_str(), world, bytes,
                     t_ours, algbw, algbw * f, t_raw, raw ? raw_algbw * f : 0,
                     raw ? t_ours / t_raw : 0);
        std::fflush(report);
      }
    }
  }
}

std::string HumanBytes(size_t b) {
  if (b >= (1u << 20)) return absl::StrFormat("%zu MiB", b >> 20);
  return absl::StrFormat("%zu KiB", b >> 10);
}

bool ParseArgs(int argc, char** argv, Config& cfg) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--ranks") {
      cfg.ranks.clear();
      for (auto s : absl::StrSplit(v, ',')) {
        int n;
        if (!absl::SimpleAtoi(s, &n) || n < 1) return false;
        cfg.ranks.push_back(n);
      }
      ++i;
    } else if (a == "--ops") {
      cfg.ops = absl::StrSplit(v, ',');
      ++i;
    } else if (a == "--min-bytes") {
      if (!absl::SimpleAtoi(v, &cfg.min_bytes)) return false;
      ++i;
    } else if (a == "--max-bytes") {
      if (!absl::SimpleAtoi(v, &cfg.max_bytes)) return false;
      ++i;
    } else if (a == "--no-baseline") {
      cfg.baseline = false;
    } else if (a == "--csv") {
      cfg.csv = v;
      ++i;
    } else if (a == "--retries") {
      if (!absl::SimpleAtoi(v, &cfg.retries) || cfg.retries < 1) return false;
      ++i;
    } else if (a == "--backend") {
      const std::string b = v;
      if (b == "gloo") {
        cfg.backend = adaptcomm::BackendChoice::kGloo;
      } else if (b == "shm") {
        cfg.backend = adaptcomm::BackendChoice::kShm;
      } else if (b == "auto") {
        cfg.backend = adaptcomm::BackendChoice::kAuto;
      } else {
        return false;
      }
      ++i;
    } else if (a == "--hosts") {
      if (!absl::SimpleAtoi(v, &cfg.hosts) || cfg.hosts < 1) return false;
      ++i;
    } else if (a == "--quick") {
      cfg.quick = true;
    } else {
      return false;
    }
  }
  return cfg.min_bytes >= 4 && cfg.min_bytes <= cfg.max_bytes;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (!ParseArgs(argc, argv, cfg)) {
    std::fprintf(stderr,
                 "usage: collectives_bench [--ranks 2,4] [--ops allreduce,allgather,"
                 "reduce_scatter,broadcast] [--min-bytes N] [--max-bytes N] [--csv FILE] "
                 "[--quick] [--retries N] [--backend gloo|shm|auto] [--no-baseline] "
                 "[--hosts H]\n");
    return 2;
  }
  std::unique_ptr<adaptcomm::testing::Netns> net;
  if (cfg.hosts > 1) {
    net = std::make_unique<adaptcomm::testing::Netns>(cfg.hosts);
    if (!net->Up()) {
      std::fprintf(stderr,
                   "--hosts %d: cannot build network namespaces (root and iproute2 needed)\n",
                   cfg.hosts);
      return 1;
    }
  }
  char tmpl[] = "/tmp/adaptcomm-bench-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) return 1;
  close(fd);
  for (int world : cfg.ranks) {
    const int port = adaptcomm::testing::PickFreePort();
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
      pid_t pid = fork();
      if (pid == 0) {
        Place place;
        if (net != nullptr) {
          const int ns = open(("/var/run/netns/" + net->Ns(r % cfg.hosts)).c_str(), O_RDONLY);
          if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
            std::fprintf(stderr, "rank %d: cannot enter namespace %s\n", r,
                         net->Ns(r % cfg.hosts).c_str());
            _exit(1);
          }
          place = {net->Ip(r % cfg.hosts), net->Ip(0), "eth0"};
        }
        FILE* report = r == 0 ? std::fopen(tmpl, "a") : nullptr;
        RankMain(cfg, r, world, port, place, report);
        if (report) std::fclose(report);
        _exit(0);
      }
      pids.push_back(pid);
    }
    for (pid_t p : pids) {
      int st;
      waitpid(p, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        std::fprintf(stderr, "a rank of the %d-rank run failed\n", world);
        return 1;
      }
    }
  }
  // Table + CSV from the rows rank 0 wrote.
  FILE* rows = std::fopen(tmpl, "r");
  FILE* csv = cfg.csv.empty() ? nullptr : std::fopen(cfg.csv.c_str(), "w");
  const char* header =
      "op,ranks,bytes,adaptcomm_us,adaptcomm_algbw_GBps,adaptcomm_busbw_GBps,gloo_us,"
      "gloo_busbw_GBps,time_ratio";
  if (csv) std::fprintf(csv, "%s\n", header);
  std::printf("adaptcomm backend: %s", adaptcomm::BackendChoiceName(cfg.backend));
  if (cfg.hosts > 1) std::printf(", ranks over %d network namespaces as hosts", cfg.hosts);
  std::printf("\n");
  std::printf("%-15s %5s %9s %12s %9s %9s %12s %9s %7s\n", "op", "ranks", "size", "adaptcomm_us",
              "algbw", "busbw", "raw_gloo_us", "busbw", "ratio");
  char line[4096];
  while (rows && std::fgets(line, sizeof(line), rows)) {
    if (line[0] == '#') {  // a run's selected backend and why
      std::printf("  %s", line + 1);
      continue;
    }
    if (csv) std::fputs(line, csv);
    char op[64];
    int world;
    size_t bytes;
    double t, alg, bus, traw, busraw, ratio;
    if (std::sscanf(line, "%63[^,],%d,%zu,%lf,%lf,%lf,%lf,%lf,%lf", op, &world, &bytes, &t, &alg,
                    &bus, &traw, &busraw, &ratio) == 9) {
      std::printf("%-15s %5d %9s %12.1f %9.3f %9.3f %12.1f %9.3f %7.3f\n", op, world,
                  HumanBytes(bytes).c_str(), t, alg, bus, traw, busraw, ratio);
    }
  }
  std::printf(
      "(GB/s; busbw per nccl-tests; ratio = adaptcomm time / raw gloo time, medians; "
      "raw gloo's reduce_scatter baseline is its allreduce)\n");
  if (rows) std::fclose(rows);
  if (csv) std::fclose(csv);
  unlink(tmpl);
  return 0;
}

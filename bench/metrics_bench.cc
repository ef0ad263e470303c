// What metrics cost a small shared-memory allreduce, and what a flood of requests to the metrics
// endpoint costs the job: every rank runs two communicators on shm, one with metrics.enabled
// false and one with metrics on and the endpoint served, in alternating rounds; a third kind of
// round runs the metrics communicator while a forked client opens `--flood-rate` connections a
// second to rank 0's endpoint (open loop: whether or not earlier ones were answered), each
// sending one request.
//
//   metrics_bench [--ranks 2] [--bytes 4096] [--ops 2000] [--rounds 15] [--flood-rate 1000]
//                 [--port BASE] [--control 0|1] [--monitor 0|1] [--backend shm|gloo]
//                 [--max-scrapes N] [--bind-to auto|core|none]
//
// --monitor 1 creates both communicators through the store (Communicator::Create, shm forced) so
// that the metrics one also runs fail-slow detection (monitor.enabled, at its default interval).
// --backend gloo does the same with Gloo communicators (loopback TCP).
// --control 1 turns metrics off in the second communicator too: the A/A difference that its
// position alone makes. METRICS_BENCH_OBSERVER_ONLY=1 times the observer's callbacks alone.
//
// float32 sum allreduce through Communicator::Allreduce().Wait(); ranks are forked processes
// sharing a file store, bound like `adaptcomm launch` binds. Prints the median over rounds of each
// round's mean op time, and the ratios.
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/adaptcomm.h"
#include "lib/base/cpu_binding.h"
#include "lib/base/wall_clock.h"
#include "lib/shm/shm_backend.h"
#include "lib/trace/metrics.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int ranks = 2;
  size_t bytes = 4096;
  int ops = 2000;
  int rounds = 15;
  int flood_rate = 1000;
  int port = 0;  // 0: picked from the pid
  // A/A control: the second communicator has metrics off too (what its position alone costs).
  bool control = false;
  // Both communicators rendezvous through the store: the metrics one runs the fail-slow monitor.
  bool monitor = false;
  // gloo: both communicators are Gloo ones made through the store (with the fail-slow monitor).
  bool gloo = false;
  int max_scrapes = 0;  // metrics.max_scrapes_per_second of the "on" profile; 0: its default
  adaptcomm::CpuBindMode bind = adaptcomm::CpuBindMode::kAuto;
};

// Shared with the flooder: whether rank 0 is in a flood round, and the flooder's counts.
struct Shared {
  std::atomic<int> flood{0};
  std::atomic<int> stop{0};
  std::atomic<long> attempts{0};
  std::atomic<long> ok{0};
  std::atomic<long> refused{0};
  std::atomic<long> failed{0};
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One file per rank: the ranks write theirs at the same time.
std::string Profile(const std::string& dir, const char* name, int rank,
                    const std::string& metrics) {
  const std::string path = absl::StrCat(dir, "/", name, ".rank", rank, ".yaml");
  std::ofstream(path) << "schema: 1\ndefaults:\n  metrics:\n"
                      << metrics << "tiers:\n  - name: only\n";
  return path;
}

std::unique_ptr<adaptcomm::Communicator> Make(const Config& cfg, int rank,
                                              const std::shared_ptr<adaptcomm::Store>& store,
                                              const char* name, const std::string& profile) {
  adaptcomm::CommunicatorOptions o;
  o.name = name;
  if (!profile.empty()) o.profile_file = profile;
  absl::StatusOr<std::unique_ptr<adaptcomm::Communicator>> comm;
  if (cfg.monitor || cfg.gloo) {
    o.rank = rank;
    o.world_size = cfg.ranks;
    o.store = store;
    o.backend = cfg.gloo ? adaptcomm::BackendChoice::kGloo : adaptcomm::BackendChoice::kShm;
    o.fallback = adaptcomm::Fallback::kDeny;
    comm = adaptcomm::Communicator::Create(o);
  } else {
    adaptcomm::ShmBackendOptions so;
    so.rank = rank;
    so.size = cfg.ranks;
    so.store = adaptcomm::CreatePrefixStore(name, store);
    auto shm = adaptcomm::CreateShmBackend(so);
    if (!shm.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, shm.status().ToString().c_str());
      std::_Exit(1);
    }
    comm = adaptcomm::Communicator::CreateWithBackend(*std::move(shm), o);
  }
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    std::_Exit(1);
  }
  return *std::move(comm);
}

double Round(adaptcomm::Communicator& c, std::vector<float>& data, int ops) {
  if (!c.Barrier().Wait().ok()) std::_Exit(1);
  const auto start = Clock::now();
  for (int i = 0; i < ops; ++i) {
    if (absl::Status s = c.Allreduce(adaptcomm::HostView(data.data(), data.size())).Wait();
        !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::_Exit(1);
    }
  }
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / ops;
}

void RankMain(const Config& cfg, int rank, const std::string& dir, Shared* shared) {
  auto store = adaptcomm::CreateFileStore(dir);
  if (!store.ok()) std::_Exit(1);
  auto off = Make(cfg, rank, *store, "off", Profile(dir, "off", rank, "    enabled: false\n"));
  auto on = Make(
      cfg, rank, *store, "on",
      Profile(dir, "on", rank,
              cfg.control
                  ? std::string("    enabled: false\n")
                  : absl::StrCat("    enabled: true\n    port: ", cfg.port, "\n",
                                 cfg.max_scrapes > 0 ? absl::StrCat("    max_scrapes_per_second: ",
                                                                    cfg.max_scrapes, "\n")
                                                     : std::string())));
  std::vector<float> data(cfg.bytes / sizeof(float), 1.0f);
  Round(*off, data, 50);
  Round(*on, data, 50);
  std::vector<double> t_off, t_on, t_flood;
  for (int r = 0; r < cfg.rounds; ++r) {
    // The order rotates: the round after a flood must not always be the same kind.
    for (int k = 0; k < 3; ++k) {
      switch ((r + k) % 3) {
        case 0:
          t_off.push_back(Round(*off, data, cfg.ops));
          break;
        case 1:
          t_on.push_back(Round(*on, data, cfg.ops));
          break;
        default:
          if (rank == 0) shared->flood.store(1);
          // Give the flooder a moment to reach its pace before timing.
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          t_flood.push_back(Round(*on, data, cfg.ops));
          if (rank == 0) shared->flood.store(0);
      }
    }
  }
  if (rank != 0) return;
  const double m_off = Median(t_off), m_on = Median(t_on), m_flood = Median(t_flood);
  std::printf(
      "%d ranks %s allreduce %zu B, %d ops x %d rounds: metrics off %.3f us, on %.3f us%s "
      "(on/off %.4f), on + %d req/s flood %.3f us (flood/on %.4f)\n",
      cfg.ranks, cfg.gloo ? "gloo" : "shm", cfg.bytes, cfg.ops, cfg.rounds, m_off, m_on,
      cfg.control ? " (control: off too)" : "", m_on / m_off, cfg.flood_rate, m_flood,
      m_flood / m_on);
  std::fflush(stdout);
}

// One connection attempt of the flood, open until answered or a second old.
struct Attempt {
  int fd;
  Clock::time_point started;
  bool sent = false;
};

// Ends `a`: counts what it got. True when it is over.
bool Advance(Attempt& a, short revents, Shared* shared) {
  if (!a.sent && (revents & POLLOUT) != 0) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      shared->failed.fetch_add(1);
      return true;
    }
    static constexpr char kRequest[] =
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    a.sent = send(a.fd, kRequest, sizeof(kRequest) - 1, MSG_NOSIGNAL) > 0;
    if (!a.sent) {
      shared->failed.fetch_add(1);
      return true;
    }
  }
  if (a.sent && (revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
    char head[16] = {};
    const ssize_t n = recv(a.fd, head, sizeof(head) - 1, 0);
    if (n >= 12 && std::string(head, 12) == "HTTP/1.1 200") {
      shared->ok.fetch_add(1);
    } else if (n > 0) {
      shared->refused.fetch_add(1);
    } else {
      shared->failed.fetch_add(1);
    }
    return true;
  }
  if (Clock::now() - a.started > std::chrono::seconds(1)) {
    shared->failed.fetch_add(1);  // not accepted (the listen queue was full) or not answered
    return true;
  }
  return false;
}

// Open loop: a new connection attempt every 1/rate s whatever became of the earlier ones, as many
// independent clients would send them (a client that waits for each answer is paced by the server).
void Flood(const Config& cfg, Shared* shared) {
  // The scraper stands for clients on other machines: on this one it must not take the ranks'
  // cores itself (its own CPU is not what the job pays for a flood).
  sched_param param{};
  (void)sched_setscheduler(0, SCHED_IDLE, &param);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(cfg.port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const auto period = std::chrono::nanoseconds(1000000000L / std::max(cfg.flood_rate, 1));
  std::vector<Attempt> open;
  auto next = Clock::now();
  while (shared->stop.load() == 0) {
    if (shared->flood.load() == 0) {
      for (Attempt& a : open) {
        shared->failed.fetch_add(1);  // still waiting when the flood round ended
        close(a.fd);
      }
      open.clear();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      next = Clock::now();
      continue;
    }
    while (Clock::now() >= next && open.size() < 4096) {
      next += period;
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      shared->attempts.fetch_add(1);
      if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0 &&
          errno != EINPROGRESS) {
        shared->failed.fetch_add(1);
        close(fd);
        continue;
      }
      open.push_back({fd, Clock::now()});
    }
    std::vector<pollfd> fds;
    for (const Attempt& a : open) {
      fds.push_back({a.fd, static_cast<short>(a.sent ? POLLIN : POLLOUT), 0});
    }
    // Sleeps to the next attempt at nanosecond precision: a millisecond poll would spin at 1000/s.
    const int64_t wait_ns = std::max<int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(next - Clock::now()).count(), 0);
    const timespec wait{static_cast<time_t>(wait_ns / 1000000000),
                        static_cast<long>(wait_ns % 1000000000)};
    (void)ppoll(fds.data(), fds.size(), &wait, nullptr);
    std::vector<Attempt> still;
    for (size_t i = 0; i < open.size(); ++i) {
      if (Advance(open[i], fds[i].revents, shared)) {
        close(open[i].fd);
      } else {
        still.push_back(open[i]);
      }
    }
    open.swap(still);
  }
  for (Attempt& a : open) close(a.fd);
}

// The observer's own cost per op: the three callbacks with the clock reads the executor takes;
// `samples`: with the fail-slow samples kept too (monitor.enabled).
void ObserverOnlyWith(const Config& cfg, bool samples) {
  adaptcomm::trace::CommMetrics m({"micro", 0, cfg.ranks, "shm", samples});
  std::vector<float> data(cfg.bytes / sizeof(float));
  adaptcomm::OpDesc op;
  op.kind = adaptcomm::OpKind::kAllreduce;
  op.input = op.output = adaptcomm::HostView(data.data(), data.size());
  const int n = 2000000;
  // Interleaved passes with and without the callbacks; the difference is theirs.
  std::vector<double> with, without;
  volatile int64_t sink = 0;
  for (int pass = 0; pass < 10; ++pass) {
    const bool callbacks = pass % 2 == 1;
    const auto start = Clock::now();
    for (int i = 1; i <= n; ++i) {
      op.seq = static_cast<uint64_t>(i);
      const absl::Time t = adaptcomm::WallNow();
      if (callbacks) {
        m.OnEnqueue(op, t);
        m.OnStart(op, t);
        m.OnEnd(op, absl::OkStatus(), t + absl::Microseconds(3));
      } else {
        sink = sink + absl::ToUnixNanos(t);
      }
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count() / n;
    (callbacks ? with : without).push_back(ns);
  }
  std::printf(
      "observer callbacks%s: %.1f ns per op (loop with a clock read: %.1f ns without "
      "them)\n",
      samples ? " with fail-slow samples" : "", Median(with) - Median(without), Median(without));
}

void ObserverOnly(const Config& cfg) {
  ObserverOnlyWith(cfg, false);
  ObserverOnlyWith(cfg, true);
}

bool Parse(int argc, char** argv, Config& cfg) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    bool ok = true;
    if (a == "--ranks") {
      ok = absl::SimpleAtoi(v, &cfg.ranks) && cfg.ranks >= 1;
    } else if (a == "--bytes") {
      ok = absl::SimpleAtoi(v, &cfg.bytes) && cfg.bytes >= 4;
    } else if (a == "--ops") {
      ok = absl::SimpleAtoi(v, &cfg.ops) && cfg.ops >= 1;
    } else if (a == "--rounds") {
      ok = absl::SimpleAtoi(v, &cfg.rounds) && cfg.rounds >= 1;
    } else if (a == "--flood-rate") {
      ok = absl::SimpleAtoi(v, &cfg.flood_rate) && cfg.flood_rate >= 1;
    } else if (a == "--port") {
      ok = absl::SimpleAtoi(v, &cfg.port) && cfg.port > 0 && cfg.port < 65000;
    } else if (a == "--control") {
      int c = 0;
      ok = absl::SimpleAtoi(v, &c) && (c == 0 || c == 1);
      cfg.control = c == 1;
    } else if (a == "--monitor") {
      int m = 0;
      ok = absl::SimpleAtoi(v, &m) && (m == 0 || m == 1);
      cfg.monitor = m == 1;
    } else if (a == "--max-scrapes") {
      ok = absl::SimpleAtoi(v, &cfg.max_scrapes) && cfg.max_scrapes >= 1;
    } else if (a == "--backend") {
      const std::string backend = v;
      ok = backend == "shm" || backend == "gloo";
      cfg.gloo = backend == "gloo";
    } else if (a == "--bind-to") {
      absl::StatusOr<adaptcomm::CpuBindMode> mode = adaptcomm::ParseCpuBindMode(v);
      ok = mode.ok();
      if (ok) cfg.bind = *mode;
    } else {
      ok = false;
    }
    if (!ok) return false;
  }
  return argc % 2 == 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (!Parse(argc, argv, cfg)) {
    std::fprintf(stderr,
                 "usage: metrics_bench [--ranks N] [--bytes B] [--ops N] [--rounds N] "
                 "[--flood-rate N] [--port BASE] [--control 0|1] [--monitor 0|1] [--backend "
                 "shm|gloo] [--max-scrapes N] [--bind-to auto|core|none]\n");
    return 2;
  }
  if (getenv("METRICS_BENCH_OBSERVER_ONLY") != nullptr) {
    ObserverOnly(cfg);
    return 0;
  }
  if (cfg.port == 0) cfg.port = 20000 + static_cast<int>(getpid() % 20000);
  const std::vector<std::vector<int>> cores = adaptcomm::AllowedCores();
  char tmpl[] = "/tmp/metrics_bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  void* mem =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 1;
  auto* shared = new (mem) Shared();
  const pid_t flooder = fork();
  if (flooder == 0) {
    Flood(cfg, shared);
    std::_Exit(0);
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < cfg.ranks; ++r) {
    absl::StatusOr<std::vector<int>> cpus =
        adaptcomm::CpusForLocalRank(cores, cfg.bind, r, cfg.ranks);
    const pid_t pid = fork();
    if (pid == 0) {
      if (cpus.ok() && !cpus->empty()) (void)adaptcomm::BindCallingThread(*cpus);
      RankMain(cfg, r, tmpl, shared);
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
  shared->stop.store(1);
  waitpid(flooder, nullptr, 0);
  std::printf(
      "flood: %ld connection attempts, %ld answered 200, %ld answered otherwise, %ld refused, "
      "dropped or unanswered (within 1 s, or by the end of their round)\n",
      shared->attempts.load(), shared->ok.load(), shared->refused.load(), shared->failed.load());
  return failed == 0 ? 0 : 1;
}

// Init time of N ranks as threads of this process: Communicator::Create (Gloo) and the first
// allreduce (init_s; created_s: the last rank out of Create), through the store given, with the
// store calls each rank made, and the sockets and memory the job holds once every rank is through
// (docs/scale.md).
//
//   store_init_bench --ranks N --store tcp                 a TCP store served in this process
//   store_init_bench --ranks N --store redis://127.0.0.1:6379   (or etcd://...)
//   --timeout S: bound of creation and of the allreduce (600 s)
//   store_init_bench --read-keys N --store ...   no ranks: the completing rank's read of N
//       contributions, one MultiGet against N Gets (Store::MultiGet's key-by-key default), median
//       of 7 rounds each, interleaved
//
// Every rank has a client of its own, as ranks that are processes do. The counts are the calls
// the communicator made on its Store (a waiting Get or Wait is one call); the Redis and etcd
// clients poll inside such a call, so the server sees more requests than that (measure them on
// the server: redis-cli INFO stats, total_commands_processed). Sockets: this process's, counted
// in /proc/self/fd while every rank still holds its communicator, less those open once the
// store clients were connected (so the store's own sockets are not counted). Memory: resident
// set growth from before the ranks started, per rank (threads' stacks included).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "adaptcomm/adaptcomm.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

struct Counts {
  std::atomic<int64_t> set{0}, get{0}, add{0}, wait{0}, del{0};
  int64_t Total() const { return set + get + add + wait + del; }
};

class CountingStore final : public Store {
 public:
  CountingStore(std::shared_ptr<Store> base, Counts* counts)
      : base_(std::move(base)), counts_(counts) {}
  absl::Status Set(const std::string& k, const std::string& v) override {
    ++counts_->set;
    return base_->Set(k, v);
  }
  absl::StatusOr<std::string> Get(const std::string& k, absl::Duration t) override {
    ++counts_->get;
    return base_->Get(k, t);
  }
  absl::StatusOr<int64_t> Add(const std::string& k, int64_t d) override {
    ++counts_->add;
    return base_->Add(k, d);
  }
  absl::Status Wait(const std::vector<std::string>& k, absl::Duration t) override {
    ++counts_->wait;
    return base_->Wait(k, t);
  }
  absl::StatusOr<bool> Delete(const std::string& k) override {
    ++counts_->del;
    return base_->Delete(k);
  }
  // One call, as the store sees it (Redis: one MGET).
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& k,
                                                    absl::Duration t) override {
    ++counts_->get;
    return base_->MultiGet(k, t);
  }

 private:
  std::shared_ptr<Store> base_;
  Counts* counts_;
};

int64_t ResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  int64_t kib = -1;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, "VmRSS:")) continue;
    std::string digits;
    for (const char c : line) {
      if (c >= '0' && c <= '9') digits += c;
    }
    if (!absl::SimpleAtoi(digits, &kib)) kib = -1;
  }
  return kib;
}

absl::StatusOr<std::shared_ptr<Store>> ConnectClient(const std::string& store_arg,
                                                     const TcpStoreOptions& tcp,
                                                     const std::string& token) {
  if (store_arg == "tcp") return ConnectTcpStore(tcp);
  ExternalStoreOptions e;
  e.url = store_arg;
  e.prefix = absl::StrCat("adaptcomm/job/", token);
  return ConnectExternalStore(e);
}

// N keys of 64-byte values (an address and a little more, as a rank's contribution), read back by
// one client both ways.
int ReadKeys(Store& store, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) {
    keys.push_back(absl::StrCat("read/", i));
    if (absl::Status s = store.Set(keys.back(), std::string(64, 'a' + i % 26)); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::vector<double> batched, one_by_one;
  for (int round = 0; round < 7; ++round) {
    for (const bool batch : {round % 2 == 0, round % 2 != 0}) {
      const absl::Time start = absl::Now();
      absl::StatusOr<std::vector<std::string>> v =
          batch ? store.MultiGet(keys, absl::Seconds(60))
                : store.Store::MultiGet(keys, absl::Seconds(60));
      const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (!v.ok() || v->size() != keys.size() ||
          (*v)[n - 1] != std::string(64, 'a' + (n - 1) % 26)) {
        std::fprintf(stderr, "read failed: %s\n", v.status().ToString().c_str());
        return 1;
      }
      (batch ? batched : one_by_one).push_back(ms);
    }
  }
  std::sort(batched.begin(), batched.end());
  std::sort(one_by_one.begin(), one_by_one.end());
  std::printf("keys=%d multiget_ms=%.2f gets_ms=%.2f gets/multiget=%.1f\n", n, batched[3],
              one_by_one[3], one_by_one[3] / batched[3]);
  return 0;
}

int Main(int argc, char** argv) {
  int ranks = 0;
  int read_keys = 0;
  int timeout_s = 600;
  std::string store_arg;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks" && absl::SimpleAtoi(argv[i + 1], &ranks)) continue;
    if (flag == "--timeout" && absl::SimpleAtoi(argv[i + 1], &timeout_s)) continue;
    if (flag == "--read-keys" && absl::SimpleAtoi(argv[i + 1], &read_keys)) continue;
    if (flag == "--store") {
      store_arg = argv[i + 1];
      continue;
    }
    ranks = 0;
    break;
  }
  if ((ranks < 1 && read_keys < 1) || store_arg.empty()) {
    std::fprintf(stderr,
                 "usage: store_init_bench --ranks N --store tcp|redis://...|etcd://... "
                 "[--timeout SECONDS]\n"
                 "       store_init_bench --read-keys N --store tcp|redis://...|etcd://...\n");
    return 2;
  }
  const std::string token = absl::StrCat("bench-", absl::ToUnixNanos(absl::Now()));
  std::unique_ptr<TcpStoreServer> server;
  TcpStoreOptions tcp;
  tcp.token = token;
  if (store_arg == "tcp") {
    auto s = StartTcpStoreServer(tcp);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
      return 1;
    }
    server = *std::move(s);
    tcp.port = server->port();
  }
  if (read_keys > 0) {
    absl::StatusOr<std::shared_ptr<Store>> client = ConnectClient(store_arg, tcp, token);
    if (!client.ok()) {
      std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
      return 1;
    }
    return ReadKeys(**client, read_keys);
  }
  std::vector<Counts> counts(ranks);
  std::vector<absl::Status> status(ranks);
  std::vector<absl::Duration> created(ranks), done(ranks);
  std::vector<std::thread> threads;
  const int64_t rss_before = ResidentKiB();
  // Every rank holds its store client at the barrier, and its communicator once through, while
  // main counts sockets.
  auto* clients_up = new absl::Barrier(ranks + 1);
  std::atomic<int> through{0};
  absl::Notification counted;
  const absl::Time start = absl::Now();
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      // Returns the communicator (null on failure), which the rank holds until main has counted.
      auto run = [&]() -> std::unique_ptr<Communicator> {
        absl::StatusOr<std::shared_ptr<Store>> client = ConnectClient(store_arg, tcp, token);
        if (clients_up->Block()) delete clients_up;
        if (!client.ok()) {
          status[r] = client.status();
          return nullptr;
        }
        CommunicatorOptions o;
        o.rank = r;
        o.world_size = ranks;
        o.name = "init";
        o.backend = BackendChoice::kGloo;
        o.master_addr = "127.0.0.1";
        o.init_timeout = absl::Seconds(timeout_s);
        o.timeout = absl::Seconds(timeout_s);
        o.store = std::make_shared<CountingStore>(*std::move(client), &counts[r]);
        auto comm = Communicator::Create(o);
        if (!comm.ok()) {
          status[r] = comm.status();
          return nullptr;
        }
        created[r] = absl::Now() - start;
        std::vector<float> buf(1024, 1.0f);
        status[r] = (*comm)->Allreduce(HostView(buf.data(), buf.size())).Wait();
        if (status[r].ok() && buf[0] != static_cast<float>(ranks)) {
          status[r] = absl::InternalError(absl::StrCat("sum ", buf[0], ", not ", ranks));
        }
        done[r] = absl::Now() - start;
        return *std::move(comm);
      };
      std::unique_ptr<Communicator> held = run();
      ++through;
      counted.WaitForNotificationWithTimeout(absl::Seconds(600));
    });
  }
  if (clients_up->Block()) delete clients_up;
  const int sockets_of_clients = testing::OpenSockets();
  while (through.load() < ranks) absl::SleepFor(absl::Milliseconds(5));
  const int sockets = testing::OpenSockets() - sockets_of_clients;
  const int64_t rss = ResidentKiB() - rss_before;
  counted.Notify();
  for (auto& t : threads) t.join();
  absl::Duration slowest = absl::ZeroDuration(), slowest_created = absl::ZeroDuration();
  Counts total;
  for (int r = 0; r < ranks; ++r) {
    if (!status[r].ok()) {
      std::fprintf(stderr, "rank %d: %s\n", r, status[r].ToString().c_str());
      return 1;
    }
    slowest = std::max(slowest, done[r]);
    slowest_created = std::max(slowest_created, created[r]);
    total.set += counts[r].set;
    total.get += counts[r].get;
    total.add += counts[r].add;
    total.wait += counts[r].wait;
    total.del += counts[r].del;
  }
  const std::string kind = store_arg == "tcp" ? "tcp" : store_arg.substr(0, store_arg.find(':'));
  std::printf(
      "ranks=%d store=%s init_s=%.3f created_s=%.3f sockets_per_rank=%.1f rss_kib_per_rank=%.0f "
      "store_calls_per_rank=%.1f (set %.1f get %.1f add %.1f wait %.1f delete %.1f)\n",
      ranks, kind.c_str(), absl::ToDoubleSeconds(slowest), absl::ToDoubleSeconds(slowest_created),
      static_cast<double>(sockets) / ranks, static_cast<double>(rss) / ranks,
      static_cast<double>(total.Total()) / ranks, static_cast<double>(total.set) / ranks,
      static_cast<double>(total.get) / ranks, static_cast<double>(total.add) / ranks,
      static_cast<double>(total.wait) / ranks, static_cast<double>(total.del) / ranks);
  return 0;
}

}  // namespace
}  // namespace adaptcomm

int main(int argc, char** argv) { return adaptcomm::Main(argc, argv); }

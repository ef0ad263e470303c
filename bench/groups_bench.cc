// Groups of ops: a ring shift of 64 send/recv pairs in one group against one pair of the same total
// size (in a group too, as an ordered send then receive, and as an asynchronous send and receive
// that every rank posts before waiting), on 2 ranks.
//
//   groups_bench [--backend shm|gloo] [--sizes 65536,1048576,16777216] [--rounds 7] [--pairs 64]
//
// Ranks are forked processes on loopback (the test harness's RunRanks). Every size runs in rounds
// that alternate the three ways (drift of the machine hits all alike); each round times a batch of
// back-to-back exchanges, and the median over rounds of the mean per exchange is printed. An
// exchange moves `size` bytes each way: rank r sends to r+1 and receives from r-1.
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
#include "tests/harness.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  adaptcomm::BackendChoice backend = adaptcomm::BackendChoice::kShm;
  std::vector<size_t> sizes = {64u << 10, 1u << 20, 16u << 20};
  int rounds = 7;
  int pairs = 64;
};

int Iterations(size_t bytes) { return bytes <= (1u << 20) ? 100 : 10; }

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

enum class How { kGroup, kOrdered, kAsync };

// One exchange of `bytes` each way split into `pieces` messages: grouped; or one message each way,
// ordered (even ranks sending first) or asynchronous (every rank sends first, then waits).
void Exchange(adaptcomm::Communicator& comm, std::vector<float>& out, std::vector<float>& in,
              int pieces, How how) {
  const int r = comm.rank(), n = comm.size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t count = out.size() / static_cast<size_t>(pieces);
  std::vector<adaptcomm::Work> works;
  works.reserve(2 * static_cast<size_t>(pieces));
  if (how == How::kAsync) {
    const adaptcomm::P2POptions async{.async = true};
    adaptcomm::Work s = comm.Send(adaptcomm::HostView(out.data(), out.size()), next, async);
    adaptcomm::Work rv = comm.Recv(adaptcomm::HostView(in.data(), in.size()), prev, async);
    Check(s.Wait(), "async send");
    Check(rv.Wait(), "async recv");
    return;
  }
  if (how == How::kOrdered) {
    auto send = [&] {
      Check(comm.Send(adaptcomm::HostView(out.data(), out.size()), next).Wait(), "send");
    };
    auto recv = [&] {
      Check(comm.Recv(adaptcomm::HostView(in.data(), in.size()), prev).Wait(), "recv");
    };
    if (r % 2 == 0) {
      send();
      recv();
    } else {
      recv();
      send();
    }
    return;
  }
  Check(comm.GroupStart(), "GroupStart");
  for (int p = 0; p < pieces; ++p) {
    const uint32_t tag = static_cast<uint32_t>(p);
    works.push_back(
        comm.Send(adaptcomm::HostView(out.data() + p * count, count), next, {.tag = tag}));
    works.push_back(
        comm.Recv(adaptcomm::HostView(in.data() + p * count, count), prev, {.tag = tag}));
  }
  Check(comm.GroupEnd(), "GroupEnd");
  for (adaptcomm::Work& w : works) Check(w.Wait(), "group op");
}

void Run(const Config& c) {
  adaptcomm::testing::RunRanks(
      adaptcomm::testing::RankMode::kProcesses, 2,
      [&](const adaptcomm::testing::RankEnv& env) {
        adaptcomm::CommunicatorOptions o = env.options;
        o.backend = c.backend;
        o.max_retry_attempts = 1;
        auto comm = adaptcomm::Communicator::Create(o);
        Check(comm.status(), "create");
        adaptcomm::Communicator& cm = **comm;
        if (env.rank == 0) {
          std::printf("backend %s, 2 ranks, %d pairs; us per exchange (median of %d rounds)\n",
                      cm.backend_name(), c.pairs, c.rounds);
          std::printf("%12s %14s %14s %14s %14s %10s\n", "bytes", "group 64 pairs", "group 1 pair",
                      "ordered pair", "async pair", "ratio");
        }
        for (size_t bytes : c.sizes) {
          std::vector<float> out(bytes / sizeof(float), 1.0f), in(out.size());
          const int iters = Iterations(bytes);
          struct Way {
            int pieces;
            How how;
            std::vector<double> us;
          };
          std::vector<Way> ways = {{c.pairs, How::kGroup, {}},
                                   {1, How::kGroup, {}},
                                   {1, How::kOrdered, {}},
                                   {1, How::kAsync, {}}};
          for (Way& w : ways) Exchange(cm, out, in, w.pieces, w.how);  // warm-up (makes the links)
          for (int round = 0; round < c.rounds; ++round) {
            for (Way& w : ways) {
              Check(cm.Barrier().Wait(), "barrier");
              const auto start = Clock::now();
              for (int i = 0; i < iters; ++i) Exchange(cm, out, in, w.pieces, w.how);
              const double us =
                  std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
              w.us.push_back(us);
            }
          }
          if (env.rank == 0) {
            const double many = Median(ways[0].us), one = Median(ways[1].us);
            std::printf("%12zu %14.1f %14.1f %14.1f %14.1f %10.2f\n", bytes, many, one,
                        Median(ways[2].us), Median(ways[3].us), many / one);
            std::fflush(stdout);
          }
        }
      },
      absl::Minutes(10));
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--backend") {
      c.backend = std::string(v) == "gloo" ? adaptcomm::BackendChoice::kGloo
                                           : adaptcomm::BackendChoice::kShm;
      ++i;
    } else if (a == "--sizes") {
      c.sizes.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        size_t x = 0;
        if (absl::SimpleAtoi(s, &x)) c.sizes.push_back(x);
      }
      ++i;
    } else if (a == "--rounds") {
      if (!absl::SimpleAtoi(v, &c.rounds)) return 2;
      ++i;
    } else if (a == "--pairs") {
      if (!absl::SimpleAtoi(v, &c.pairs)) return 2;
      ++i;
    } else {
      std::fprintf(stderr,
                   "usage: groups_bench [--backend shm|gloo] [--sizes B,B,...] [--rounds N] "
                   "[--pairs N]\n");
      return 2;
    }
  }
  Run(c);
  return 0;
}

// Where rank 0's store listens: a job whose master address is local serves its store on loopback
// only, so no other host can reach (or flood) it (#11 item 5). Who may claim a rank (#14).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adaptcomm/adaptcomm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

// An IPv4 address of this host that is not loopback; empty if it has none.
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    if (std::string(text).rfind("127.", 0) != 0) found = text;
  }
  freeifaddrs(list);
  return found;
}

// Whether a TCP connection to address:port is accepted.
bool Accepts(const std::string& address, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

TEST(Rendezvous, LocalJobServesItsStoreOnLoopbackOnly) {
  const std::string external = NonLoopbackAddress();
  if (external.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 address";
  CommunicatorOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.master_addr = "127.0.0.1";
  o.master_port = testing::PickFreePort();
  o.backend = BackendChoice::kGloo;
  auto comm = Communicator::Create(o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_TRUE(Accepts("127.0.0.1", *o.master_port));
  EXPECT_FALSE(Accepts(external, *o.master_port))
      << "the store of a job on 127.0.0.1 is reachable through " << external;
}

// Two processes started as rank 1 (#14, bad input): the second is refused, naming the rank and
// both processes, and the first goes on in the world it formed with rank 0, every result checked.
// A second rank 0 is refused too: the port of the store is taken.
TEST(Rendezvous, SecondProcessClaimingARankIsRefusedNamingBothProcesses) {
  char dir_template[] = "/tmp/adaptcomm_claims_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  auto read_pid = [](const std::string& path) {
    long pid = 0;
    std::ifstream(path) >> pid;
    return pid;
  };
  char host_name[256] = "unknown";
  gethostname(host_name, sizeof(host_name) - 1);
  const std::string host = host_name;
  std::vector<int> status = testing::RunRankProcesses(
      3,
      [&](const testing::RankEnv& env) {
        CommunicatorOptions o = env.options;
        o.world_size = 2;
        if (env.rank == 2) {
          // Started as rank 1 once the first rank 1 holds the rank.
          for (int i = 0; i < 3000 && read_pid(dir + "/holder.pid") == 0; ++i) {
            absl::SleepFor(absl::Milliseconds(10));
          }
          o.rank = 1;
          auto comm = Communicator::Create(o);
          ASSERT_FALSE(comm.ok());
          EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
          EXPECT_THAT(std::string(comm.status().message()),
                      ::testing::HasSubstr(absl::StrCat(
                          "rank 1 of communicator 'test' is already held by ", host, ":",
                          read_pid(dir + "/holder.pid"), "; this process (", host, ":", getpid(),
                          ") is refused: two processes were started as rank 1")));
          o.rank = 0;
          comm = Communicator::Create(o);
          ASSERT_FALSE(comm.ok());
          EXPECT_THAT(std::string(comm.status().message()),
                      ::testing::HasSubstr("rank 0 cannot serve the store on port"));
          EXPECT_THAT(std::string(comm.status().message()),
                      ::testing::HasSubstr(absl::StrCat("this process (", host, ":", getpid(),
                                                        ") is refused: another process serves "
                                                        "that port")));
          std::ofstream(dir + "/refused") << getpid();
          return;
        }
        auto comm = Communicator::Create(o);
        ASSERT_TRUE(comm.ok()) << comm.status();
        if (env.rank == 1) std::ofstream(dir + "/holder.pid") << getpid();
        // Until the duplicate was refused (rank 0 decides, so both stop at the same step), then
        // once more: the world is still ranks 0 and 1, each counted once.
        for (int step = 0;; ++step) {
          ASSERT_LT(step, 100000);
          int64_t refused = read_pid(dir + "/refused");
          ASSERT_TRUE((*comm)->Broadcast(HostView(&refused, 1)).Wait().ok());
          std::vector<float> v(1000, static_cast<float>(env.rank + 1));
          ASSERT_TRUE((*comm)->Allreduce(HostView(v.data(), v.size())).Wait().ok());
          for (float x : v) ASSERT_EQ(x, 3.0f);
          ASSERT_EQ((*comm)->size(), 2);
          ASSERT_EQ((*comm)->rank(), env.rank);
          if (refused != 0) break;
          absl::SleepFor(absl::Milliseconds(5));
        }
      },
      absl::Seconds(60));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "process " << r;
  }
}

// ADAPTCOMM_STORE_EXTERNAL=1 (set by `adaptcomm launch --elastic`, which serves the store): rank
// 0 connects to the store at MASTER_ADDR:MASTER_PORT as every rank does, instead of serving it.
// With nobody serving it, rank 0 fails within its init timeout naming the address and the
// variable; a value other than 0 or 1 is refused naming it.
TEST(Rendezvous, ExternalStoreMakesRankZeroAClientAndItsAbsenceIsNamed) {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = StartTcpStoreServer({});
  ASSERT_TRUE(server.ok()) << server.status();
  setenv("ADAPTCOMM_STORE_EXTERNAL", "1", 1);
  CommunicatorOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.name = "external";
  o.master_addr = "127.0.0.1";
  o.master_port = (*server)->port();
  o.backend = BackendChoice::kGloo;
  o.init_timeout = absl::Seconds(2);
  auto comm = Communicator::Create(o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  // Rank 0's claim on its rank is in the store served here: it served none of its own.
  TcpStoreOptions client_options;
  client_options.port = (*server)->port();
  absl::StatusOr<std::shared_ptr<Store>> client = ConnectTcpStore(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  char host[256] = "unknown";
  gethostname(host, sizeof(host) - 1);
  absl::StatusOr<std::string> holder =
      (*client)->Get("adaptcomm/claims/external/0/by", absl::ZeroDuration());
  ASSERT_TRUE(holder.ok()) << holder.status();
  EXPECT_EQ(*holder, absl::StrCat(host, ":", getpid()));
  comm->reset();

  o.master_port = testing::PickFreePort();  // nobody serves it
  const absl::Time start = absl::Now();
  comm = Communicator::Create(o);
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsUnavailable(comm.status())) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()),
              ::testing::HasSubstr(
                  absl::StrCat("cannot reach the TCP store at 127.0.0.1:", *o.master_port)));
  EXPECT_THAT(std::string(comm.status().message()),
              ::testing::HasSubstr("ADAPTCOMM_STORE_EXTERNAL=1 says that the process that started "
                                   "the ranks (e.g. `adaptcomm launch --elastic`) serves the "
                                   "store, so rank 0 does not"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  setenv("ADAPTCOMM_STORE_EXTERNAL", "yes", 1);
  comm = Communicator::Create(o);
  unsetenv("ADAPTCOMM_STORE_EXTERNAL");
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(comm.status())) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()),
              ::testing::HasSubstr("ADAPTCOMM_STORE_EXTERNAL='yes': must be 1"));
}

}  // namespace
}  // namespace adaptcomm

// Where rank 0's store listens: a job whose master address is local serves its store on loopback
// only, so no other host can reach (or flood) it (#11 item 5).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "adaptcomm/adaptcomm.h"
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
  EXPECT_TRUE(Accepts("127.0.0.1", o.master_port));
  EXPECT_FALSE(Accepts(external, o.master_port))
      << "the store of a job on 127.0.0.1 is reachable through " << external;
}

}  // namespace
}  // namespace adaptcomm

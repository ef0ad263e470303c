// Network namespaces as fake hosts for tests that run as root: namespace i holds eth0 with
// 10.77.<subnet>.<i+1>/24 (and lo up), its veth peer on the root side enslaved to one bridge.
// Names stay under 15 characters and carry the test's pid and an instance number, so concurrent
// tests and successive instances do not collide.
// (tests/netns_fault_test.cc still has its own copy of this class; it can switch to this one.)
#ifndef ADAPTCOMM_TESTS_NETNS_H_
#define ADAPTCOMM_TESTS_NETNS_H_

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace adaptcomm::testing {

// Runs `cmd` through the shell, quietly; its exit code, or -1.
inline int Sh(const std::string& cmd) {
  const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

class Netns {
 public:
  explicit Netns(int count)
      : count_(count),
        tag_(absl::StrCat(getpid() % 10000, "i", NextInstance())),
        subnet_(std::to_string(getpid() % 200 + 20)) {}
  ~Netns() {
    for (int i = 0; i < count_; ++i) Sh(absl::StrCat("ip netns del ", Ns(i)));
    Sh(absl::StrCat("ip link del ", Bridge()));
  }
  Netns(const Netns&) = delete;
  Netns& operator=(const Netns&) = delete;

  // False when this machine cannot build them (then the test skips).
  bool Up() {
    if (Sh(absl::StrCat("ip link add ", Bridge(), " type bridge")) != 0) return false;
    if (Sh(absl::StrCat("ip link set ", Bridge(), " up")) != 0) return false;
    for (int i = 0; i < count_; ++i) {
      if (Sh(absl::StrCat("ip netns add ", Ns(i))) != 0) return false;
      if (Sh(absl::StrCat("ip link add ", Veth(i), " type veth peer name eth0 netns ", Ns(i))) != 0)
        return false;
      Sh(absl::StrCat("ip link set ", Veth(i), " master ", Bridge()));
      Sh(absl::StrCat("ip link set ", Veth(i), " up"));
      Sh(absl::StrCat("ip netns exec ", Ns(i), " ip addr add ", Ip(i), "/24 dev eth0"));
      Sh(absl::StrCat("ip netns exec ", Ns(i), " ip link set eth0 up"));
      Sh(absl::StrCat("ip netns exec ", Ns(i), " ip link set lo up"));
    }
    return true;
  }
  // The kernel tears a deleted namespace's veth down asynchronously: a second instance in the
  // same process (a parameterized test) gets names of its own.
  static int NextInstance() {
    static std::atomic<int> next{0};
    return next++;
  }
  std::string Ns(int i) const { return absl::StrCat("ah", tag_, "n", i); }
  std::string Veth(int i) const { return absl::StrCat("ah", tag_, "v", i); }
  std::string Bridge() const { return absl::StrCat("ah", tag_, "br"); }
  std::string Ip(int i) const { return absl::StrCat("10.78.", subnet_, ".", i + 1); }

 private:
  int count_;
  std::string tag_, subnet_;
};

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_NETNS_H_

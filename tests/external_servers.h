// Real Redis and etcd servers for tests: each one a process of the test's own, on a free loopback
// port, with its files in a temporary directory. The destructor kills it and removes the
// directory; if the test process dies first, the kernel kills the server (PR_SET_PDEATHSIG), so no
// server outlives a failed or crashed test. Where the binary is not installed, or this build has
// no client for it, SkipReason() says so and which package provides what is missing.
#ifndef ADAPTCOMM_TESTS_EXTERNAL_SERVERS_H_
#define ADAPTCOMM_TESTS_EXTERNAL_SERVERS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "adaptcomm/store.h"
#include "tests/harness.h"

namespace adaptcomm::testing {

// The full path of `name` on $PATH (or in /usr/sbin, /usr/bin), or "".
inline std::string FindBinary(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::vector<std::string> dirs = absl::StrSplit(path != nullptr ? path : "", ':');
  dirs.push_back("/usr/bin");
  dirs.push_back("/usr/sbin");
  for (const std::string& dir : dirs) {
    const std::string full = absl::StrCat(dir, "/", name);
    if (!dir.empty() && ::access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

// Whether something accepts connections on 127.0.0.1:port.
inline bool Listening(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// Sends `request` to 127.0.0.1:port and returns what came back until the server closed the
// connection or `complete(reply)` said the reply is whole; "" when the connection failed. Each
// receive is bounded by `receive_seconds`.
inline std::string LoopbackExchange(int port, const std::string& request, int receive_seconds,
                                    const std::function<bool(const std::string&)>& complete) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{receive_seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size())) {
    char buf[4096];
    while (!complete(reply)) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      reply.append(buf, n);
    }
  }
  ::close(fd);
  return reply;
}

// POSTs `body` to http://127.0.0.1:port`path` and returns the whole reply (status line, headers,
// body), or "" when the connection failed. Bounded by a 10 s receive timeout.
inline std::string HttpPost(int port, const std::string& path, const std::string& body) {
  const std::string request = absl::StrCat(
      "POST ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n",
      "Content-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
  return LoopbackExchange(port, request, 10, [](const std::string&) { return false; });
}

class ServerProcess {
 public:
  enum class Kind { kRedis, kEtcd };
  // `password`: Redis requirepass (etcd: the caller enables auth itself, see EnableEtcdAuth in
  // tests/external_store_test.cc). `extra`: more command-line arguments for the server.
  explicit ServerProcess(Kind kind, const std::string& password = "",
                         const std::vector<std::string>& extra = {})
      : kind_(kind) {
    if (!ExternalStoreBuiltIn(Name())) {
      skip_ = absl::StrCat("this build has no ", Name(), " client (",
                           kind == Kind::kRedis ? "libhiredis-dev" : "libcurl4-openssl-dev",
                           " was not found; see docs/stores.md)");
      return;
    }
    const std::string binary = FindBinary(kind == Kind::kRedis ? "redis-server" : "etcd");
    if (binary.empty()) {
      skip_ = kind == Kind::kRedis
                  ? "redis-server is not installed (apt-get install redis-server, or "
                    "scripts/install-deps.sh test)"
                  : "etcd is not installed (apt-get install etcd-server, or "
                    "scripts/install-deps.sh test)";
      return;
    }
    const char* tmp = std::getenv("TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/adaptcomm_", Name(), "_", ::getpid(), "_",
                        counter_++);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    port_ = PickFreePort();
    std::vector<std::string> args = {binary};
    if (kind == Kind::kRedis) {
      args.insert(args.end(), {"--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", dir_, "--daemonize", "no",
                               "--logfile", dir_ + "/log", "--maxclients", "10000"});
      if (!password.empty()) args.insert(args.end(), {"--requirepass", password});
    } else {
      const int peer = PickFreePort();
      const std::string client = absl::StrCat("http://127.0.0.1:", port_);
      const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer);
      args.insert(args.end(), {"--name",
                               "t",
                               "--data-dir",
                               dir_ + "/data",
                               "--listen-client-urls",
                               client,
                               "--advertise-client-urls",
                               client,
                               "--listen-peer-urls",
                               peer_url,
                               "--initial-advertise-peer-urls",
                               peer_url,
                               "--initial-cluster",
                               "t=" + peer_url,
                               "--logger",
                               "zap",
                               "--log-outputs",
                               dir_ + "/log",
                               "--log-level",
                               "error"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);  // the parent died before prctl
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const absl::Time until = absl::Now() + absl::Seconds(20);
    while (!Listening(port_) && absl::Now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (pid_ < 0 || !Listening(port_)) error_ = absl::StrCat(Name(), " did not start; see ", dir_);
  }

  ~ServerProcess() {
    Stop();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Kills the server now (SIGKILL) and reaps it.
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  const std::string& SkipReason() const { return skip_; }
  const std::string& error() const { return error_; }  // empty when it runs
  int port() const { return port_; }
  // "redis://127.0.0.1:port" with `credentials` ("user:password@", ":password@") inserted.
  std::string Url(const std::string& credentials = "") const {
    return absl::StrCat(Name(), "://", credentials, "127.0.0.1:", port_);
  }

 private:
  std::string Name() const { return kind_ == Kind::kRedis ? "redis" : "etcd"; }

  static inline int counter_ = 0;
  Kind kind_;
  std::string skip_, error_, dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_EXTERNAL_SERVERS_H_

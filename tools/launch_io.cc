#include "tools/launch_io.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace adaptcomm::tools {
namespace {

// A rank that writes a longer line without a newline gets it split: memory stays bounded.
constexpr size_t kMaxLineBytes = 1 << 20;

}  // namespace

void Message(const std::string& text) {
  std::string line = absl::StrCat("adaptcomm launch: ", text, "\n");
  std::fflush(stdout);
  // stderr is unbuffered; one write keeps the line whole next to the ranks' lines.
  (void)!write(STDERR_FILENO, line.data(), line.size());
}

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        // Our own stdout may be a non-blocking fd inherited from the caller: wait, bounded.
        pollfd p{fd, POLLOUT, 0};
        if (poll(&p, 1, 1000) <= 0) return;
        continue;
      }
      return;  // EPIPE and friends: the reader is gone; the ranks' exit codes still matter.
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void LineForwarder::Feed(const char* data, size_t size) {
  buffer_.append(data, size);
  size_t start = 0;
  while (true) {
    size_t nl = buffer_.find('\n', start);
    if (nl == std::string::npos) break;
    Emit(buffer_.data() + start, nl - start + 1, false);
    start = nl + 1;
  }
  buffer_.erase(0, start);
  if (buffer_.size() >= kMaxLineBytes) {
    Emit(buffer_.data(), buffer_.size(), true);
    buffer_.clear();
  }
}

void LineForwarder::Finish() {
  if (!buffer_.empty()) Emit(buffer_.data(), buffer_.size(), !prefix_.empty());
  buffer_.clear();
}

void LineForwarder::Emit(const char* data, size_t size, bool add_newline) {
  line_.assign(prefix_);
  line_.append(data, size);
  if (add_newline) line_.push_back('\n');
  WriteAll(out_fd_, line_.data(), line_.size());
}

std::string SignalName(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", signo);
}

int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::optional<std::string> RandomToken() {
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = read(fd, bytes + got, sizeof(bytes) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  if (got != sizeof(bytes)) return std::nullopt;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 0xf]);
  }
  return token;
}

std::vector<std::string> BuildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    bool replaced = std::any_of(overrides.begin(), overrides.end(),
                                [&](const auto& kv) { return kv.first == name; });
    if (!replaced) env.push_back(std::move(entry));
  }
  for (const auto& [name, value] : overrides) env.push_back(absl::StrCat(name, "=", value));
  return env;
}

int ExecFailureExitCode(int err) { return err == ENOENT ? 127 : 126; }

std::string DescribeExecFailure(const std::string& program, int err) {
  // execve reports a directory as EACCES; name what is actually wrong, as shells do.
  struct stat st {};
  if (err == EACCES && program.find('/') != std::string::npos && stat(program.c_str(), &st) == 0 &&
      S_ISDIR(st.st_mode)) {
    err = EISDIR;
  }
  return absl::StrCat("cannot execute '", program, "': ", strerror(err));
}

}  // namespace adaptcomm::tools

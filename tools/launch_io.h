// The process and I/O plumbing of `adaptcomm launch`: its own messages, rank output re-emitted
// line by line, and what a rank is started with (a free port, a store token, the environment,
// the shell's words for a program that cannot be executed).
#ifndef ADAPTCOMM_TOOLS_LAUNCH_IO_H_
#define ADAPTCOMM_TOOLS_LAUNCH_IO_H_

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace adaptcomm::tools {

// "adaptcomm launch: <text>" on stderr, in one write.
void Message(const std::string& text);

// Writes all of `data` to `fd`, retrying EINTR and (bounded) EAGAIN; gives up silently when the
// reader is gone (the ranks' exit codes still matter).
void WriteAll(int fd, const char* data, size_t size);

// Re-emits one rank stream line by line, each line in a single write so lines of different ranks
// never mix. A line longer than 1 MiB without a newline is split: memory stays bounded.
class LineForwarder {
 public:
  LineForwarder(int out_fd, std::string prefix) : out_fd_(out_fd), prefix_(std::move(prefix)) {}
  void Feed(const char* data, size_t size);
  // The stream ended: a partial last line still gets out, newline-terminated when prefixed.
  void Finish();

 private:
  void Emit(const char* data, size_t size, bool add_newline);

  int out_fd_;
  std::string prefix_;
  std::string buffer_;
  std::string line_;
};

// "SIGTERM", or "signal N" for one without a name.
std::string SignalName(int signo);

// A free TCP port on loopback, or -1. Another process may take it before rank 0 binds it;
// torchrun has the same window, and the store reports the bind failure clearly when it happens.
int PickFreePort();

// 32 hex digits from /dev/urandom (the store token), or nullopt.
std::optional<std::string> RandomToken();

// The launcher's environment with the given variables replaced, as "NAME=value" strings.
std::vector<std::string> BuildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides);

// Exit code of a program that could not be executed, as shells give it (127 not found, else 126).
int ExecFailureExitCode(int err);
// "cannot execute 'PROGRAM': <reason>", naming a directory as one (execve says EACCES).
std::string DescribeExecFailure(const std::string& program, int err);

}  // namespace adaptcomm::tools

#endif  // ADAPTCOMM_TOOLS_LAUNCH_IO_H_

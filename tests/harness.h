// Runs N ranks of a test body as threads of this process or as forked processes.
//
//   RunRanks(RankMode::kThreads, 4, [](const RankEnv& env) {
//     auto comm = Communicator::Create(env.options);
//     ...EXPECT_...
//   });
//
// Threads share an in-process HashStore; processes rendezvous through a TCP store that rank 0
// serves on a free loopback port. A process rank reports failure through its exit code (any
// gtest failure in the child => exit 1); the parent kills every rank that outlives `bound`.
#ifndef ADAPTCOMM_TESTS_HARNESS_H_
#define ADAPTCOMM_TESTS_HARNESS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "adaptcomm/communicator.h"

namespace adaptcomm::testing {

enum class RankMode { kThreads, kProcesses };
std::string RankModeName(RankMode mode);

struct RankEnv {
  int rank = 0;
  int world_size = 0;
  CommunicatorOptions options;  // rank, world size and rendezvous filled in
};

// Runs body(env) on every rank and waits at most `bound` for all of them. EXPECTs in the body
// count as failures of the calling test (threads directly, processes via the exit code).
void RunRanks(RankMode mode, int world_size, const std::function<void(const RankEnv&)>& body,
              absl::Duration bound = absl::Seconds(120));

// Runs body(env) in `world_size` forked processes and returns each one's wait status (as from
// waitpid), without judging them: for tests where some ranks are meant to die. Ranks still alive
// after `bound` are killed with SIGKILL.
std::vector<int> RunRankProcesses(int world_size, const std::function<void(const RankEnv&)>& body,
                                  absl::Duration bound);

// The build directory: $ADAPTCOMM_BINARY_DIR, else the parent of this test binary's folder.
std::string BuildDir();

// A loopback TCP port that was free a moment ago.
int PickFreePort();

// Runs fn(rank) on `n` threads of this process and joins them (fn bounds its own waits).
void OnThreads(int n, const std::function<void(int)>& fn);

// The sockets this process has open (entries of /proc/self/fd that are sockets); -1 if that
// directory cannot be read.
int OpenSockets();

// The whole file, byte for byte ("" if it cannot be read).
std::string ReadTextFile(const std::string& path);
// The numbers of a whitespace-separated text file (weights a trainer wrote), in order.
std::vector<double> ReadNumbers(const std::string& path);
// Runs `command` through /bin/sh; its exit code, or -1 if it did not exit normally.
int RunShell(const std::string& command);

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_HARNESS_H_

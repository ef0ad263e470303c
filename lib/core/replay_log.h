// ReplayLog: copies of the inputs of the last few operations, so that a coordinated retry can
// re-run them bit for bit after the backend was rebuilt.
//
// Why copies: an in-place op (allreduce, broadcast, reduce) overwrites its input, and the caller
// may reuse any buffer as soon as its Work completed. Cost: one memcpy of each op's input while
// retries are on (host memory only; ops on device memory are not replayable and fail instead).
// Buffers are kept and reused, so steady state allocates nothing.
#ifndef ADAPTCOMM_LIB_CORE_REPLAY_LOG_H_
#define ADAPTCOMM_LIB_CORE_REPLAY_LOG_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "adaptcomm/backend.h"

namespace adaptcomm::internal {

class ReplayLog {
 public:
  // Keeps the last `depth` ops. Collectives let no rank run more than one op ahead of another,
  // so a small depth covers every restart point a vote can produce.
  explicit ReplayLog(size_t depth = 4) : entries_(depth) {}

  // Copies op's input (before it runs). Returns false if the op cannot be replayed.
  bool Record(const OpDesc& op);
  // Whether ops [from, to] are all recorded.
  bool Covers(uint64_t from, uint64_t to) const;
  // Restores the recorded input of `seq` into the op's own buffers (in-place ops, before a re-run
  // of the op that failed).
  void RestoreInput(uint64_t seq);
  // The op `seq` rewritten to read the recorded input and write into scratch: for re-running an op
  // that already completed here, whose buffers belong to the caller again.
  OpDesc DetachedCopy(uint64_t seq);

 private:
  struct Entry {
    uint64_t seq = 0;
    bool replayable = false;
    OpDesc op;
    std::vector<unsigned char> input;
    std::vector<unsigned char> output_scratch;
  };
  Entry* Find(uint64_t seq);
  const Entry* Find(uint64_t seq) const;
  std::vector<Entry> entries_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_REPLAY_LOG_H_

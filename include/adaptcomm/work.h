// Work: the handle of one asynchronous collective.
//
// Ownership: a Work shares the operation's state with the communicator that runs it; dropping the
// handle does not cancel the operation (it still runs, in order, like every other op).
// Progress: an operation runs whether or not anyone waits for it. On a backend that runs on any
// thread (shared memory), Wait() without a bound may run the caller's own host op on the calling
// thread, and while a caller waits right after issuing, its ops may be left for it to run: one
// nobody waits for starts on the communicator's thread within a millisecond (at once after a
// bounded Wait, a state() or completed() query, or another op issued first).
// Thread safety: all methods may be called from any thread, concurrently.
// Handles are move-only: a copy would let two owners disagree about who waits.
#ifndef ADAPTCOMM_WORK_H_
#define ADAPTCOMM_WORK_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "adaptcomm/export.h"

namespace adaptcomm {

enum class WorkState : uint8_t {
  kPending,   // queued behind earlier operations of the communicator
  kRunning,   // executing in the backend; its timeout clock runs from here
  kDone,      // finished; the output buffers hold the result
  kFailed,    // finished with an error (status() says which)
  kTimedOut,  // ran past its timeout; status() is DeadlineExceeded naming op, seq and timeout
};
ADAPTCOMM_EXPORT const char* WorkStateName(WorkState state);
inline bool IsTerminal(WorkState s) { return s != WorkState::kPending && s != WorkState::kRunning; }

namespace internal {
class WorkImpl;
}

class ADAPTCOMM_EXPORT [[nodiscard]] Work {
 public:
  Work() = default;  // an empty handle; Wait() returns FailedPrecondition
  explicit Work(std::shared_ptr<internal::WorkImpl> impl);
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  // Host views, and device views of a backend that is not stream-ordered (Gloo staging, ...):
  // blocks until the operation ends; bounded by the operation's own timeout (plus the abort
  // bound), never forever. Returns the operation's status.
  // CUDA views on a stream-ordered backend (NCCL): returns once the op is queued on the device and
  // the view's stream has been made to wait for it, without waiting for the device (the c10d
  // model): work the caller queues on that stream afterwards sees the result. A failure the device
  // reports later fails Synchronize() and the communicator's later ops. The caller keeps the
  // buffers alive until the stream has passed the op (or Synchronize() returned).
  [[nodiscard]] absl::Status Wait();
  // As Wait(), blocking at most `timeout`. If the operation is still pending or running (or, for
  // a stream-ordered device op, not yet queued) then, returns DeadlineExceeded saying so; the
  // operation itself continues and can be waited on again.
  [[nodiscard]] absl::Status Wait(absl::Duration timeout);
  // Blocks the host until the operation has finished, on the device too, at most `timeout`:
  // DeadlineExceeded saying so if it has not. After the communicator was aborted: the abort's
  // status, at once. For host views the same as Wait(timeout).
  [[nodiscard]] absl::Status Synchronize(absl::Duration timeout = absl::InfiniteDuration());

  WorkState state() const;
  // OK unless the state is kFailed or kTimedOut.
  absl::Status status() const;
  bool completed() const { return IsTerminal(state()); }
  // The communicator's sequence number of this operation (1-based, counted per communicator).
  uint64_t seq() const;
  bool valid() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<internal::WorkImpl> impl_;
};

}  // namespace adaptcomm

#endif  // ADAPTCOMM_WORK_H_

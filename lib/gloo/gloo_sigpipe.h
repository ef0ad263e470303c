// Gloo writes to its sockets with writev(2), not send(MSG_NOSIGNAL): a write to a peer that has
// gone away raises SIGPIPE, whose default action kills the whole trainer instead of letting the
// op fail with "Connection closed by peer". SIGPIPE from a write goes to the writing thread, and
// Gloo writes from two kinds of threads: the caller of an op (in place, the fast path) and the
// device's event-loop thread (which inherits the signal mask of the thread that creates the
// device). Blocking SIGPIPE in exactly those threads keeps the process-wide disposition (which
// belongs to the application) untouched; the write then fails with EPIPE.
#ifndef ADAPTCOMM_LIB_GLOO_GLOO_SIGPIPE_H_
#define ADAPTCOMM_LIB_GLOO_GLOO_SIGPIPE_H_

#include <signal.h>

namespace adaptcomm::gloo_backend {

// Blocks SIGPIPE in the calling thread for good (once per thread; later calls are free).
void BlockSigpipeInThisThread();

// Blocks SIGPIPE for the scope (for threads started inside it), then restores the caller's mask.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock();
  ~ScopedSigpipeBlock();
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t previous_;
};

}  // namespace adaptcomm::gloo_backend

#endif  // ADAPTCOMM_LIB_GLOO_GLOO_SIGPIPE_H_

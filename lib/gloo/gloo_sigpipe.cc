#include "lib/gloo/gloo_sigpipe.h"

#include <pthread.h>

#include <ctime>

namespace adaptcomm::gloo_backend {

void BlockSigpipeInThisThread() {
  thread_local bool blocked = false;
  if (blocked) return;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  blocked = true;
}

ScopedSigpipeBlock::ScopedSigpipeBlock() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &previous_);
}

ScopedSigpipeBlock::~ScopedSigpipeBlock() {
  // A SIGPIPE raised inside the scope is pending now; unblocking would deliver it.
  sigset_t pending;
  sigemptyset(&pending);
  if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    const timespec zero{0, 0};
    sigtimedwait(&set, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

}  // namespace adaptcomm::gloo_backend

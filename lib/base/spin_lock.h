// SpinLock: a lock for critical sections of a few instructions (a free list's push or pop) on
// paths that run once per op, where absl::Mutex's out-of-line lock and unlock (and, in Debian's
// build, its debug bookkeeping) cost more than the work they guard. A waiter spins, then yields:
// a holder preempted inside is waited out without burning the core.
#ifndef ADAPTCOMM_LIB_BASE_SPIN_LOCK_H_
#define ADAPTCOMM_LIB_BASE_SPIN_LOCK_H_

#include <atomic>

#include "absl/base/thread_annotations.h"

namespace adaptcomm {

class ABSL_LOCKABLE SpinLock {
 public:
  SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    if (!held_.exchange(true, std::memory_order_acquire)) return;
    LockSlow();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() { held_.store(false, std::memory_order_release); }

 private:
  void LockSlow();

  std::atomic<bool> held_{false};
};

class ABSL_SCOPED_LOCKABLE SpinLockHold {
 public:
  explicit SpinLockHold(SpinLock* lock) ABSL_EXCLUSIVE_LOCK_FUNCTION(lock) : lock_(lock) {
    lock_->Lock();
  }
  ~SpinLockHold() ABSL_UNLOCK_FUNCTION() { lock_->Unlock(); }
  SpinLockHold(const SpinLockHold&) = delete;
  SpinLockHold& operator=(const SpinLockHold&) = delete;

 private:
  SpinLock* const lock_;
};

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_SPIN_LOCK_H_

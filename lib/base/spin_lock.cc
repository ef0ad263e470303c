#include "lib/base/spin_lock.h"

#include <thread>

namespace adaptcomm {

void SpinLock::LockSlow() {
  for (int spins = 0; held_.exchange(true, std::memory_order_acquire);) {
    while (held_.load(std::memory_order_relaxed)) {
      if (++spins > 64) std::this_thread::yield();
    }
  }
}

}  // namespace adaptcomm

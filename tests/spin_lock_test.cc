#include "lib/base/spin_lock.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace adaptcomm {
namespace {

// Three threads on (at most) two cores: holders get preempted inside, and waiters must yield to
// them rather than spin out their time slices; every increment under the lock is counted.
TEST(SpinLock, EveryHolderIsAloneInside) {
  SpinLock lock;
  long counter = 0;  // guarded by lock
  int inside = 0;    // likewise: never more than one
  int most_inside = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        SpinLockHold hold(&lock);
        ++inside;
        if (inside > most_inside) most_inside = inside;
        ++counter;
        --inside;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter, 300000);
  EXPECT_EQ(most_inside, 1);
}

}  // namespace
}  // namespace adaptcomm

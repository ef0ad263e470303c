// Parts of the CUDA seam that need no CUDA: the polling pause.
#include "lib/cuda/cuda_api.h"

#include <algorithm>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace adaptcomm::cuda {

void PollPause(int iteration) {
  if (iteration < 64) {
    std::this_thread::yield();
  } else {
    const int shift = std::min(iteration - 64, 6);
    absl::SleepFor(absl::Microseconds(10 << shift));  // 10 us .. 640 us
  }
}

}  // namespace adaptcomm::cuda

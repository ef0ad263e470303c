// Bounded waits on Gloo's unbound buffers, shared by the algorithms this backend writes itself.
#ifndef ADAPTCOMM_LIB_GLOO_GLOO_WAIT_H_
#define ADAPTCOMM_LIB_GLOO_GLOO_WAIT_H_

#include <chrono>

#include "gloo/common/error.h"

namespace adaptcomm::gloo_backend {

// Waits on one unbound-buffer operation within what is left of the op's deadline. Gloo throws
// IoException ("Timed out waiting ...") on timeout; false means the wait was aborted.
template <typename WaitFn>
void WaitUntil(std::chrono::steady_clock::time_point deadline, WaitFn&& wait) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() < 1) left = std::chrono::milliseconds(1);
  if (!wait(left)) throw ::gloo::IoException("unbound buffer wait was aborted");
}

}  // namespace adaptcomm::gloo_backend

#endif  // ADAPTCOMM_LIB_GLOO_GLOO_WAIT_H_

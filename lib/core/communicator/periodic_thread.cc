#include "lib/core/communicator/periodic_thread.h"

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace adaptcomm::internal {

struct PeriodicThread::State {
  absl::Duration interval;
  std::function<void(bool)> look;
  bool last_look = false;
  absl::Mutex mu;
  absl::CondVar cv;
  bool stop ABSL_GUARDED_BY(mu) = false;
  bool done ABSL_GUARDED_BY(mu) = false;
};

PeriodicThread::PeriodicThread(absl::Duration interval, std::function<void(bool last)> look,
                               bool last_look)
    : state_(std::make_shared<State>()) {
  state_->interval = interval;
  state_->look = std::move(look);
  state_->last_look = last_look;
  thread_ = std::thread(&PeriodicThread::Run, state_);
}

PeriodicThread::~PeriodicThread() {
  bool done = false;
  {
    absl::MutexLock lock(&state_->mu);
    state_->stop = true;
    state_->cv.SignalAll();
    const absl::Time until = absl::Now() + kStopBound;
    while (!state_->done && absl::Now() < until) state_->cv.WaitWithDeadline(&state_->mu, until);
    done = state_->done;
  }
  if (done) {
    thread_.join();
  } else {
    thread_.detach();  // its State (and the look) stay alive until it ends
  }
}

void PeriodicThread::Run(std::shared_ptr<State> state) {
  for (bool stopping = false; !stopping;) {
    {
      absl::MutexLock lock(&state->mu);
      const absl::Time until = absl::Now() + state->interval;
      while (!state->stop && absl::Now() < until) state->cv.WaitWithDeadline(&state->mu, until);
      stopping = state->stop;
    }
    if (!stopping || state->last_look) state->look(stopping);
  }
  absl::MutexLock lock(&state->mu);
  state->done = true;
  state->cv.SignalAll();
}

}  // namespace adaptcomm::internal

// PeriodicThread: a communicator's helper thread that looks at something every interval (the
// state record's publisher, the fail-slow monitor), and whose owner must never hang on it.
//
// The destructor returns within a bound whatever a look is doing: a look stuck in a store call
// (a flooded store, a cut link) is left to finish on its own, with the look function (and what
// it captured) kept alive by the thread.
#ifndef ADAPTCOMM_LIB_CORE_COMMUNICATOR_PERIODIC_THREAD_H_
#define ADAPTCOMM_LIB_CORE_COMMUNICATOR_PERIODIC_THREAD_H_

#include <functional>
#include <memory>
#include <thread>

#include "absl/time/time.h"

namespace adaptcomm::internal {

class PeriodicThread {
 public:
  // Calls look(false) every `interval`, from a thread of its own, until destroyed; with
  // `last_look`, the destructor has it call look(true) once more.
  PeriodicThread(absl::Duration interval, std::function<void(bool last)> look, bool last_look);
  // Stops the looks; waits at most `kStopBound` for the one in progress (or the last look).
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  static constexpr absl::Duration kStopBound = absl::Seconds(1);

 private:
  struct State;
  static void Run(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_COMMUNICATOR_PERIODIC_THREAD_H_

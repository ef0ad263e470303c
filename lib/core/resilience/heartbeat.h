// HeartbeatMonitor: guards the watchdogs themselves, and dumps flight records on demand.
//
// Each communicator's watchdog beats at least once a second. One process-wide monitor thread
// checks the beats: a watchdog silent past its heartbeat timeout (profile timeouts.heartbeat) is
// itself stuck, so nothing bounds that communicator any more: the monitor calls its on_stall
// (dump, flush logs, exit with kExitCommunicationFailure). SIGUSR2 (installed only if the program
// has no handler of its own) asks every registered communicator to dump its flight record.
#ifndef ADAPTCOMM_LIB_CORE_RESILIENCE_HEARTBEAT_H_
#define ADAPTCOMM_LIB_CORE_RESILIENCE_HEARTBEAT_H_

#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace adaptcomm::internal {

class HeartbeatMonitor {
 public:
  struct Watch {
    std::string name;
    absl::Duration timeout;
    std::function<void(const std::string& why)> on_stall;  // called once
    std::function<void(const std::string& why)> on_dump;   // on SIGUSR2
  };

  static HeartbeatMonitor& Instance();
  // Returns an id for Beat/Unregister. The monitor thread runs while any watch is registered.
  int Register(Watch watch);
  void Beat(int id);
  void Unregister(int id);

  // How often the monitor looks (tests shorten it).
  static constexpr absl::Duration kPoll = absl::Milliseconds(100);

 private:
  struct Entry {
    Watch watch;
    absl::Time last_beat;
    bool stalled = false;
  };
  void Run();

  absl::Mutex mu_;
  std::map<int, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a monitor thread is alive
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_RESILIENCE_HEARTBEAT_H_

#include "lib/core/resilience/heartbeat.h"

#include <signal.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/log.h"

namespace adaptcomm::internal {
namespace {

std::atomic<bool> g_dump_requested{false};

void OnDumpSignal(int) { g_dump_requested.store(true); }

// Only if the program left SIGUSR2 alone: never take over a handler the trainer installed.
void InstallDumpSignalOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGUSR2, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
    struct sigaction action {};
    action.sa_handler = OnDumpSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &action, nullptr);
  });
}

}  // namespace

HeartbeatMonitor& HeartbeatMonitor::Instance() {
  static auto* monitor = new HeartbeatMonitor();  // never destroyed: used until exit
  return *monitor;
}

int HeartbeatMonitor::Register(Watch watch) {
  InstallDumpSignalOnce();
  absl::MutexLock lock(&mu_);
  const int id = next_id_++;
  entries_[id] = Entry{std::move(watch), absl::Now(), false};
  if (!running_) {
    running_ = true;
    // Detached: it ends by itself once the registry is empty (the monitor is never destroyed).
    std::thread([this] { Run(); }).detach();
  }
  return id;
}

void HeartbeatMonitor::Beat(int id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second.last_beat = absl::Now();
}

void HeartbeatMonitor::Unregister(int id) {
  absl::MutexLock lock(&mu_);
  entries_.erase(id);
  // The thread notices the empty registry and ends.
}

void HeartbeatMonitor::Run() {
  while (true) {
    std::vector<std::function<void()>> calls;
    {
      absl::MutexLock lock(&mu_);
      if (entries_.empty()) {
        running_ = false;
        return;
      }
      const absl::Time now = absl::Now();
      const bool dump = g_dump_requested.exchange(false);
      for (auto& [id, e] : entries_) {
        if (dump && e.watch.on_dump) {
          calls.push_back([f = e.watch.on_dump] { f("dump requested (SIGUSR2)"); });
        }
        if (!e.stalled && now - e.last_beat > e.watch.timeout) {
          e.stalled = true;
          std::string why =
              absl::StrCat("the watchdog of ", e.watch.name, " has been silent for ",
                           absl::FormatDuration(now - e.last_beat), " (heartbeat timeout ",
                           absl::FormatDuration(e.watch.timeout), ")");
          calls.push_back([f = e.watch.on_stall, why] { f(why); });
        }
      }
    }
    for (auto& call : calls) call();
    absl::SleepFor(kPoll);
  }
}

}  // namespace adaptcomm::internal

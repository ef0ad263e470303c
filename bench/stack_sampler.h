// A wall-clock stack sampler for one thread, for bench/gpu_check on machines without perf: a POSIX
// timer aimed at the calling thread raises SIGPROF every period (running or blocked alike, so time
// spent waiting for a lock shows as the wait's stack), the handler keeps the return addresses
// (backtrace(), warmed up first so that it does not load the unwinder inside the handler), and
// Write() saves them with /proc/self/maps for symbolizing elsewhere (addr2line on an unstripped
// copy of the binary). One sampler per process.
#ifndef ADAPTCOMM_BENCH_STACK_SAMPLER_H_
#define ADAPTCOMM_BENCH_STACK_SAMPLER_H_

#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>

namespace adaptcomm::bench {

class StackSampler {
 public:
  static constexpr int kMaxSamples = 40000;
  static constexpr int kDepth = 24;

  // Samples the calling thread every `period_us` until Stop().
  static bool Start(long period_us) {
    void* warm[4];
    (void)backtrace(warm, 4);
    struct sigaction sa = {};
    sa.sa_sigaction = [](int, siginfo_t*, void*) {
      const int n = count_.load(std::memory_order_relaxed);
      if (n >= kMaxSamples) return;
      const int saved = errno;
      depth_[n] = backtrace(samples_[n], kDepth);
      count_.store(n + 1, std::memory_order_relaxed);
      errno = saved;
    };
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGPROF, &sa, nullptr) != 0) return false;
    sigevent ev = {};
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGPROF;
    ev._sigev_un._tid = static_cast<pid_t>(syscall(SYS_gettid));
    if (timer_create(CLOCK_MONOTONIC, &ev, &timer_) != 0) return false;
    itimerspec spec = {};
    spec.it_interval.tv_nsec = period_us * 1000;
    spec.it_value.tv_nsec = period_us * 1000;
    return timer_settime(timer_, 0, &spec, nullptr) == 0;
  }

  static void Stop() {
    itimerspec off = {};
    (void)timer_settime(timer_, 0, &off, nullptr);
    (void)timer_delete(timer_);
    signal(SIGPROF, SIG_IGN);
  }

  // "depth addr addr ..." per sample (hex, innermost first), then "maps" and /proc/self/maps.
  static bool Write(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return false;
    const int n = count_.load();
    for (int i = 0; i < n; ++i) {
      std::fprintf(f, "%d", depth_[i]);
      for (int d = 0; d < depth_[i]; ++d) std::fprintf(f, " %p", samples_[i][d]);
      std::fputc('\n', f);
    }
    std::fprintf(f, "maps\n");
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) std::fprintf(f, "%s\n", line.c_str());
    std::fclose(f);
    return true;
  }
  static int samples() { return count_.load(); }

 private:
  static inline timer_t timer_;
  static inline std::atomic<int> count_{0};
  static inline int depth_[kMaxSamples];
  static inline void* samples_[kMaxSamples][kDepth];
};

}  // namespace adaptcomm::bench

#endif  // ADAPTCOMM_BENCH_STACK_SAMPLER_H_

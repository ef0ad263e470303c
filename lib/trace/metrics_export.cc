#include "lib/trace/metrics_export.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "httplib.h"
#include "lib/base/log.h"
#include "lib/trace/metrics.h"

namespace adaptcomm::trace {
namespace {

// Scrapes must not take CPU from the ranks' threads, which share the rank's cores (a bound rank's
// threads all run on its own cores). SCHED_BATCH never preempts a running rank thread when a
// request wakes the server, and nice 19 leaves it a small share of a busy core; SCHED_IDLE would
// cost less still but starves the endpoint on a host whose cores are all busy (scrapes time out).
void LowerThreadPriority() {
  thread_local bool lowered = false;
  if (lowered) return;
  lowered = true;
  sched_param param{};
  param.sched_priority = 0;
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
}

absl::Status WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

// The listener hands each accepted connection to two workers, then accepts the next one no
// sooner than 1/per_second later. Pacing the accepts rather than answering the excess (429) is
// what keeps a flood cheap: an unaccepted connection costs this process nothing, and once the
// listen queue is full the kernel drops further SYNs (the clients' TCP retries them).
class PacedTaskQueue final : public httplib::TaskQueue {
 public:
  explicit PacedTaskQueue(int per_second)
      : interval_(absl::Seconds(1) / std::max(per_second, 1)), workers_(2) {}

  void enqueue(std::function<void()> fn) override {
    workers_.enqueue(std::move(fn));
    // At most 1 s (per_second >= 1): Server::stop() ends the listener once it is over.
    absl::SleepFor(interval_);
  }
  void shutdown() override { workers_.shutdown(); }

 private:
  const absl::Duration interval_;
  httplib::ThreadPool workers_;
};

class Exporter {
 public:
  static Exporter& Instance() {
    static auto* exporter = new Exporter();
    return *exporter;
  }

  void Acquire(const MetricsExportOptions& o) {
    absl::MutexLock lock(&mu_);
    if (users_++ > 0) return;
    options_ = o;
    stopping_ = false;
    if (o.port >= 0) StartServerLocked();
    if (!o.textfile.empty()) {
      textfile_thread_ = std::thread([this] { TextfileLoop(); });
    }
  }

  void Release() {
    std::unique_ptr<httplib::Server> server;
    std::thread listener, writer;
    {
      absl::MutexLock lock(&mu_);
      if (--users_ > 0) return;
      stopping_ = true;
      stop_cv_.SignalAll();
      server = std::move(server_);
      listener = std::move(listener_);
      writer = std::move(textfile_thread_);
      port_ = 0;
    }
    if (server != nullptr) server->stop();
    if (listener.joinable()) listener.join();
    if (writer.joinable()) writer.join();
  }

  int port() {
    absl::MutexLock lock(&mu_);
    return port_;
  }

 private:
  void StartServerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto server = std::make_unique<httplib::Server>();
    const int per_second = options_.max_scrapes_per_second;
    server->new_task_queue = [per_second] { return new PacedTaskQueue(per_second); };
    server->set_keep_alive_max_count(1);  // every request is an accepted connection: paced
    server->set_read_timeout(2);
    server->set_write_timeout(2);
    server->Get("/metrics", [](const httplib::Request& req, httplib::Response& res) {
      LowerThreadPriority();
      const bool om = absl::StrContains(req.get_header_value("Accept"), "openmetrics-text");
      res.set_content(RenderMetrics(om),
                      om ? "application/openmetrics-text; version=1.0.0; charset=utf-8"
                         : "text/plain; version=0.0.4; charset=utf-8");
    });
    int port = options_.port;
    bool bound = false;
    if (port == 0) {
      port = server->bind_to_any_port(options_.address);
      bound = port > 0;
    } else if (port <= 65535) {
      bound = server->bind_to_port(options_.address, port);
    }
    if (!bound) {
      // Once per process: later communicators share this outcome.
      ADAPTCOMM_LOG(kWarning, "metrics: cannot listen on ", options_.address, ":", options_.port,
                    port > 65535 ? " (out of range)" : " (taken?)", ": ", std::strerror(errno),
                    "; this rank runs without a metrics endpoint");
      return;
    }
    port_ = port;
    ADAPTCOMM_LOG(kInfo, "metrics: serving http://", options_.address, ":", port, "/metrics");
    httplib::Server* s = server.get();
    server_ = std::move(server);
    listener_ = std::thread([s] {
      LowerThreadPriority();
      s->listen_after_bind();
    });
  }

  void TextfileLoop() {
    LowerThreadPriority();
    std::string path;
    absl::Duration interval;
    {
      absl::MutexLock lock(&mu_);
      path = options_.textfile;
      interval = options_.textfile_interval;
    }
    bool warned = false;
    for (bool last = false; !last;) {
      {
        absl::MutexLock lock(&mu_);
        const absl::Time until = absl::Now() + interval;
        while (!stopping_ && absl::Now() < until) stop_cv_.WaitWithDeadline(&mu_, until);
        last = stopping_;
      }
      if (absl::Status s = WriteAtomically(path, RenderMetrics(false)); !s.ok() && !warned) {
        warned = true;
        ADAPTCOMM_LOG(kWarning, "metrics textfile: ", s.message());
      }
    }
  }

  absl::Mutex mu_;
  absl::CondVar stop_cv_;
  int users_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  MetricsExportOptions options_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<httplib::Server> server_ ABSL_GUARDED_BY(mu_);
  std::thread listener_ ABSL_GUARDED_BY(mu_);
  std::thread textfile_thread_ ABSL_GUARDED_BY(mu_);
  int port_ ABSL_GUARDED_BY(mu_) = 0;

  friend class ExportHandle;
};

class ExportHandle final : public MetricsExportHandle {
 public:
  ~ExportHandle() override { Exporter::Instance().Release(); }
};

}  // namespace

std::unique_ptr<MetricsExportHandle> StartMetricsExport(const MetricsExportOptions& options) {
  if (options.port < 0 && options.textfile.empty()) return nullptr;
  Exporter::Instance().Acquire(options);
  return std::make_unique<ExportHandle>();
}

int MetricsPort() { return Exporter::Instance().port(); }

std::string MetricsTextfilePath(const std::string& pattern, int rank, int world_size) {
  if (const size_t at = pattern.find("{rank}"); at != std::string::npos) {
    return absl::StrCat(pattern.substr(0, at), rank, pattern.substr(at + 6));
  }
  if (world_size <= 1) return pattern;
  if (absl::EndsWith(pattern, ".prom")) {
    return absl::StrCat(pattern.substr(0, pattern.size() - 5), ".rank", rank, ".prom");
  }
  return absl::StrCat(pattern, ".rank", rank);
}

}  // namespace adaptcomm::trace

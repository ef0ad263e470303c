// Metrics export: the process's metrics (lib/trace/metrics.h) served over HTTP at /metrics
// (Prometheus text, or OpenMetrics when the scraper asks for it) and written periodically to a
// textfile for node-exporter's textfile collector. One server and one writer per process, started
// by the first communicator that asks and stopped when the last handle goes.
//
// Exporting never fails the job: a port that is taken or out of range is logged once and the
// process runs without the server. The server runs two worker threads at the lowest CPU priority
// and accepts at most max_scrapes_per_second connections a second, one request each: past that
// pace connections wait in the kernel's listen queue, and the kernel drops attempts past that
// queue before this process spends anything on them, so that a flood of requests cannot take the
// ranks' CPU.
#ifndef ADAPTCOMM_LIB_TRACE_METRICS_EXPORT_H_
#define ADAPTCOMM_LIB_TRACE_METRICS_EXPORT_H_

#include <memory>
#include <string>

#include "absl/time/time.h"

namespace adaptcomm::trace {

struct MetricsExportOptions {
  // The port to listen on: -1 none, 0 any free port, else this one (the caller adds the local rank
  // to the profile's base).
  int port = -1;
  std::string address = "0.0.0.0";
  // Written every textfile_interval (and at the end) when not empty; "{rank}" becomes `rank`.
  std::string textfile;
  absl::Duration textfile_interval = absl::Seconds(15);
  int max_scrapes_per_second = 10;
  int rank = 0;
};

// Keeps the export running while alive.
class MetricsExportHandle {
 public:
  virtual ~MetricsExportHandle() = default;
};

// Null when `options` asks for nothing. The first caller's options hold for the process; later
// callers share what it started.
std::unique_ptr<MetricsExportHandle> StartMetricsExport(const MetricsExportOptions& options);

// The port the process serves metrics on; 0 when none.
int MetricsPort();

// The textfile's path for `rank`: "{rank}" replaced, else ".rank<R>" before a ".prom" ending when
// `world_size` > 1 (ranks of one host would overwrite each other's file).
std::string MetricsTextfilePath(const std::string& pattern, int rank, int world_size);

}  // namespace adaptcomm::trace

#endif  // ADAPTCOMM_LIB_TRACE_METRICS_EXPORT_H_

#include "lib/core/communicator/observability.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "adaptcomm/communicator.h"
#include "lib/base/log.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::internal {

std::unique_ptr<trace::MetricsExportHandle> StartMetricsExportFor(const MetricsSettings& metrics,
                                                                  int rank, int world_size) {
  trace::MetricsExportOptions o;
  o.rank = rank;
  o.address = metrics.address;
  o.max_scrapes_per_second = metrics.max_scrapes_per_second;
  o.textfile_interval = metrics.textfile_interval;
  if (!metrics.textfile.empty()) {
    o.textfile = trace::MetricsTextfilePath(metrics.textfile, rank, world_size);
  }
  if (metrics.port > 0) {
    absl::StatusOr<LaunchInfo> launch = DetectLaunchEnvironment();
    const int local = launch.ok() && launch->local_rank >= 0 ? launch->local_rank : rank;
    o.port = metrics.port + local;
    if (o.port > 65535) {
      ADAPTCOMM_LOG(kWarning, "metrics: port ", metrics.port, " (", metrics.port_source,
                    ") + local rank ", local, " is past 65535; this rank runs without a metrics ",
                    "endpoint");
      o.port = -1;
    }
  } else {
    o.port = metrics.port;
  }
  return trace::StartMetricsExport(o);
}

std::string StatusKey(const std::string& comm, const std::string& leaf) {
  return absl::StrCat("adaptcomm/status/", comm, "/", leaf);
}

const std::string& ThisHost() {
  static const std::string* const host = [] {
    char name[256] = "unknown";
    gethostname(name, sizeof(name) - 1);
    return new std::string(name);
  }();
  return *host;
}

namespace {

int64_t Millis(absl::Time t) { return t == absl::UnixEpoch() ? 0 : absl::ToUnixMillis(t); }

// The record without its time: what decides whether it changed.
nlohmann::json RecordBody(const StatusSources& s, absl::Duration interval,
                          const std::string& health_override) {
  const trace::FlightRecorder::Progress p = s.recorder->progress();
  nlohmann::json j;
  j["rank"] = s.rank();
  j["world"] = s.world_size();
  j["pid"] = static_cast<int64_t>(getpid());
  j["host"] = ThisHost();
  j["interval_ms"] = absl::ToInt64Milliseconds(interval);
  if (!health_override.empty()) {
    j["health"] = health_override;
  } else {
    const absl::Status h = s.health();
    j["health"] = h.ok() ? std::string("ok") : h.ToString();
  }
  j["last_enqueued"] = p.last_enqueued;
  j["last_started"] = p.last_started;
  j["last_completed"] = p.last_completed;
  if (p.current != 0) {
    j["op"] = {{"kind", OpKindName(p.kind)},
               {"seq", p.current},
               {"bytes", p.bytes},
               {"entered_ms", Millis(p.entered)},
               {"started_ms", Millis(p.started)}};
  } else {
    j["op"] = nullptr;
  }
  j["slowness"] = s.metrics != nullptr ? s.metrics->slowness_score() : 0.0;
  j["metrics_port"] = trace::MetricsPort();
  return j;
}

}  // namespace

std::string StatusRecordJson(const StatusSources& sources, absl::Duration interval,
                             const std::string& health_override) {
  nlohmann::json j = RecordBody(sources, interval, health_override);
  j["t_ms"] = absl::ToUnixMillis(absl::Now());
  return j.dump();
}

namespace {

// The publisher thread's own: what it reads and what it last wrote.
struct Publisher {
  std::shared_ptr<Store> store;
  StatusSources sources;
  absl::Duration interval;
  std::string last;
  int last_world = -1;
  bool warned = false;

  void Look(bool leaving) {
    const StatusSources& s = sources;
    nlohmann::json body = RecordBody(s, interval, leaving ? "left" : "");
    const int rank = body["rank"].get<int>();
    const int world = body["world"].get<int>();
    const int64_t now = absl::ToUnixMillis(absl::Now());
    std::string text = body.dump();
    absl::Status written;
    if (text != last) {
      body["t_ms"] = now;
      written.Update(store->Set(StatusKey(s.comm, absl::StrCat("rank", rank)), body.dump()));
      last = std::move(text);
    }
    if (rank == 0 && world != last_world) {
      written.Update(store->Set(StatusKey(s.comm, "world"), absl::StrCat(world)));
      last_world = world;
    }
    written.Update(store->Set(StatusKey(s.comm, absl::StrCat("alive", rank)), absl::StrCat(now)));
    if (!written.ok() && !warned) {
      warned = true;  // the store going away ends the job elsewhere; say it once here
      ADAPTCOMM_LOG(kDebug, "status record not published: ", written.ToString());
    }
  }
};

}  // namespace

StatusPublisher::StatusPublisher(std::shared_ptr<Store> store, StatusSources sources,
                                 absl::Duration interval) {
  auto p = std::make_shared<Publisher>();
  p->store = std::move(store);
  p->sources = std::move(sources);
  p->interval = interval;
  thread_ = std::make_unique<PeriodicThread>(
      interval, [p](bool last) { p->Look(last); }, /*last_look=*/true);
}

}  // namespace adaptcomm::internal

#include "lib/trace/flight_recorder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::trace {
namespace {

int64_t Micros(absl::Time t) { return t == absl::UnixEpoch() ? 0 : absl::ToUnixMicros(t); }

absl::Status MakeDirs(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial = dir.substr(0, i);
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::UnavailableError(
            absl::StrCat("cannot create directory ", partial, ": ", std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string DefaultFlightRecorderDir() {
  if (const char* env = std::getenv("ADAPTCOMM_FLIGHT_RECORDER_DIR"); env && *env) return env;
  const char* tmp = std::getenv("TMPDIR");
  return absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/adaptcomm-flight");
}

FlightRecorder::FlightRecorder(FlightRecorderOptions options)
    : options_(std::move(options)),
      ring_(options_.capacity == 0 ? 1 : options_.capacity),
      backends_{options_.backend} {}

FlightRecorder::Entry* FlightRecorder::Find(uint64_t seq) {
  Entry& e = ring_[seq % ring_.size()];
  return e.seq == seq ? &e : nullptr;
}

void FlightRecorder::SetGeneration(int generation, const std::string& backend) {
  SpinLockHold hold(&mu_);
  generation_ = generation;
  const auto known = std::find(backends_.begin(), backends_.end(), backend);
  backend_ = static_cast<uint32_t>(known - backends_.begin());
  if (known == backends_.end()) backends_.push_back(backend);
}

FlightRecorder::Entry& FlightRecorder::RecordEnqueueLocked(const OpDesc& op, absl::Time when) {
  Entry& e = ring_[op.seq % ring_.size()];
  const TensorView& data =
      op.kind == OpKind::kRecv || op.kind == OpKind::kReduceScatter || op.kind == OpKind::kAllgather
          ? (op.kind == OpKind::kRecv ? op.output : op.input)
          : op.input;
  e.seq = op.seq;
  e.kind = op.kind;
  e.dtype = data.dtype;
  e.count = data.count;
  e.root = op.kind == OpKind::kBroadcast || op.kind == OpKind::kReduce ? op.root : -1;
  e.peer = op.peer;
  e.backend = backend_;
  e.generation = generation_;
  e.state = "queued";
  e.enqueue = when;
  e.start = absl::UnixEpoch();
  e.end = absl::UnixEpoch();
  e.error.clear();
  last_enqueued_ = std::max(last_enqueued_, op.seq);
  return e;
}

void FlightRecorder::RecordStartLocked(Entry* e, uint64_t seq, absl::Time when) {
  if (e != nullptr) {
    e->state = "running";
    e->start = when;
    e->backend = backend_;
    e->generation = generation_;
  }
  last_started_ = std::max(last_started_, seq);
}

void FlightRecorder::OnEnqueue(const OpDesc& op, absl::Time when) {
  SpinLockHold hold(&mu_);
  RecordEnqueueLocked(op, when);
}

void FlightRecorder::OnStart(const OpDesc& op, absl::Time when) {
  SpinLockHold hold(&mu_);
  RecordStartLocked(Find(op.seq), op.seq, when);
}

void FlightRecorder::OnEnqueueAndStart(const OpDesc& op, absl::Time when) {
  SpinLockHold hold(&mu_);
  RecordStartLocked(&RecordEnqueueLocked(op, when), op.seq, when);
}

void FlightRecorder::OnEnd(const OpDesc& op, const absl::Status& status, absl::Time when) {
  std::string error = status.ok() ? std::string() : status.ToString();  // not under the spin lock
  SpinLockHold hold(&mu_);
  if (Entry* e = Find(op.seq)) {
    e->state = status.ok() ? "done" : absl::IsDeadlineExceeded(status) ? "timed_out" : "failed";
    e->end = when;
    if (!status.ok()) e->error = std::move(error);
  }
  if (status.ok()) last_completed_ = std::max(last_completed_, op.seq);
}

FlightRecorder::Progress FlightRecorder::progress() const {
  Progress p;
  SpinLockHold hold(&mu_);
  p.last_enqueued = last_enqueued_;
  p.last_started = last_started_;
  p.last_completed = last_completed_;
  // Ops end in order but for failures: the oldest still queued or running is near the last one
  // completed. Bounded by the ring.
  const uint64_t first = last_completed_ + 1;
  for (uint64_t seq = first; seq <= last_enqueued_ && seq - first < ring_.size(); ++seq) {
    const Entry& e = ring_[seq % ring_.size()];
    if (e.seq != seq ||
        (std::string_view(e.state) != "queued" && std::string_view(e.state) != "running")) {
      continue;
    }
    p.current = seq;
    p.kind = e.kind;
    p.bytes = e.count * DTypeSize(e.dtype);
    p.entered = e.enqueue;
    p.started = e.start;
    break;
  }
  return p;
}

std::string FlightRecorder::DumpJson(const std::string& reason) const {
  // A copy under the lock, formatted without it: issuing threads spin on it meanwhile.
  std::vector<Entry> entries_kept;
  std::vector<std::string> backends;
  uint32_t backend = 0;
  int generation = 0;
  uint64_t last_enqueued = 0, last_started = 0, last_completed = 0;
  {
    SpinLockHold hold(&mu_);
    const uint64_t first = last_enqueued_ >= ring_.size() ? last_enqueued_ - ring_.size() + 1 : 1;
    entries_kept.reserve(static_cast<size_t>(std::min<uint64_t>(last_enqueued_, ring_.size())));
    for (uint64_t seq = first; seq <= last_enqueued_; ++seq) {
      const Entry& e = ring_[seq % ring_.size()];
      if (e.seq == seq) entries_kept.push_back(e);
    }
    backends = backends_;
    backend = backend_;
    generation = generation_;
    last_enqueued = last_enqueued_;
    last_started = last_started_;
    last_completed = last_completed_;
  }
  nlohmann::json doc;
  doc["rank"] = options_.rank;
  doc["world_size"] = options_.world_size;
  doc["communicator"] = options_.communicator;
  doc["job"] = options_.job;
  doc["backend"] = backends[backend];
  doc["generation"] = generation;
  doc["reason"] = reason;
  doc["dumped_at_us"] = absl::ToUnixMicros(absl::Now());
  doc["last_enqueued_seq"] = last_enqueued;
  doc["last_started_seq"] = last_started;
  doc["last_completed_seq"] = last_completed;
  nlohmann::json entries = nlohmann::json::array();
  for (const Entry& e : entries_kept) {
    entries.push_back({{"seq", e.seq},
                       {"op", OpKindName(e.kind)},
                       {"dtype", DTypeName(e.dtype)},
                       {"count", e.count},
                       {"root", e.root},
                       {"peer", e.peer},
                       {"backend", backends[e.backend]},
                       {"generation", e.generation},
                       {"state", e.state},
                       {"enqueue_us", Micros(e.enqueue)},
                       {"start_us", Micros(e.start)},
                       {"end_us", Micros(e.end)},
                       {"error", e.error}});
  }
  doc["entries"] = std::move(entries);
  nlohmann::json events = nlohmann::json::array();
  {
    absl::MutexLock lock(&events_mu_);
    for (const Event& e : events_) events.push_back({{"t_us", Micros(e.at)}, {"text", e.text}});
  }
  doc["events"] = std::move(events);
  return doc.dump(1);
}

void FlightRecorder::AddEvent(const std::string& text) {
  absl::MutexLock lock(&events_mu_);
  if (events_.size() == kEvents) events_.erase(events_.begin());
  events_.push_back({absl::Now(), text});
}

std::vector<std::string> FlightRecorder::events() const {
  absl::MutexLock lock(&events_mu_);
  std::vector<std::string> out;
  for (const Event& e : events_) out.push_back(e.text);
  return out;
}

absl::StatusOr<std::string> FlightRecorder::Dump(const std::string& reason) const {
  if (absl::Status s = MakeDirs(options_.dump_dir); !s.ok()) return s;
  const std::string path = absl::StrCat(options_.dump_dir, "/flight.rank", options_.rank, ".json");
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  absl::MutexLock lock(&dump_mu_);
  const std::string text = DumpJson(reason);
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return path;
}

}  // namespace adaptcomm::trace

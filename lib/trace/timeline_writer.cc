#include "lib/trace/timeline_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/log.h"
#include "lib/trace/clock_sync.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::trace {
namespace {

constexpr size_t kPendingSlots = 4096;  // ops in flight whose times are remembered
constexpr size_t kMinBytes = 4096;

absl::Status MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      const std::string partial = dir.substr(0, i);
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::UnavailableError(
            absl::StrCat("cannot create directory ", partial, ": ", std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

// Which buffer describes the op's payload (the flight recorder's rule).
const TensorView& Payload(const OpDesc& op) {
  return op.kind == OpKind::kRecv ? op.output : op.input;
}

bool IsPointToPoint(OpKind kind) { return kind == OpKind::kSend || kind == OpKind::kRecv; }

}  // namespace

absl::StatusOr<std::shared_ptr<TimelineWriter>> TimelineWriter::Open(TimelineOptions options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeline: rank ", options.rank, " out of range for world size ", options.world_size));
  }
  if (options.sample_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeline: sample_every must be at least 1, got ", options.sample_every));
  }
  if (options.max_bytes < kMinBytes) {
    return absl::InvalidArgumentError(absl::StrCat("timeline: max_bytes must be at least ",
                                                   kMinBytes, ", got ", options.max_bytes));
  }
  if (options.flush_every_events == 0) options.flush_every_events = 1;
  if (options.flush_interval <= absl::ZeroDuration()) options.flush_interval = absl::Seconds(1);
  if (options.dir.empty()) options.dir = ".";
  if (absl::Status made = MakeDirs(options.dir); !made.ok()) return made;
  std::string path = absl::StrCat(options.dir, "/trace.rank", options.rank, ".json");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("timeline: cannot open ", path, ": ", std::strerror(errno)));
  }
  std::shared_ptr<TimelineWriter> w(new TimelineWriter(std::move(options), std::move(path), fd));
  {
    absl::MutexLock io(&w->io_mu_);
    const TimelineOptions& o = w->options_;
    // The header's metadata event also carries what RecoverTimeline needs after a crash.
    const std::string header = absl::StrFormat(
        "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank "
        "%d\",\"rank\":%d,\"world_size\":%d,\"clock_offset_us\":%.3f,\"sample_every\":%d,"
        "\"communicator\":\"%s\",\"backend\":\"%s\"}}",
        o.rank, o.rank, o.rank, o.world_size, o.clock_offset_us, o.sample_every,
        JsonEscape(o.communicator), JsonEscape(o.backend));
    if (absl::Status s = w->WriteAll(header); !s.ok()) return s;
  }
  w->thread_ = std::thread([raw = w.get()] { raw->ThreadLoop(); });
  return w;
}

TimelineWriter::TimelineWriter(TimelineOptions options, std::string path, int fd)
    : options_(std::move(options)), path_(std::move(path)), pending_(kPendingSlots), fd_(fd) {
  buffer_.reserve(options_.flush_every_events);
}

TimelineWriter::~TimelineWriter() { Close().IgnoreError(); }

void TimelineWriter::OnEnqueue(const OpDesc& op, absl::Time when) {
  const int64_t ns = absl::ToUnixNanos(when);
  absl::MutexLock lock(&mu_);
  Pending& p = pending_[op.seq % pending_.size()];
  p.seq = op.seq;
  p.enqueue_ns = ns;
  p.start_ns = 0;
}

void TimelineWriter::OnStart(const OpDesc& op, absl::Time when) {
  const int64_t ns = absl::ToUnixNanos(when);
  absl::MutexLock lock(&mu_);
  Pending& p = pending_[op.seq % pending_.size()];
  if (p.seq != op.seq) {  // enqueued before this writer was attached, or overwritten
    p.seq = op.seq;
    p.enqueue_ns = ns;
  }
  p.start_ns = ns;
}

void TimelineWriter::OnEnd(const OpDesc& op, const absl::Status& status, absl::Time when) {
  const int64_t end_ns = absl::ToUnixNanos(when);
  // By seq, not by a local counter: every rank keeps the same ops, which the heatmap compares.
  const bool sampled =
      op.seq == 0 || (op.seq - 1) % static_cast<uint64_t>(options_.sample_every) == 0;
  absl::MutexLock lock(&mu_);
  if (closing_) return;
  ++ops_seen_;
  if (!status.ok()) ++failed_ops_;
  if (!sampled && status.ok()) return;
  if (truncated_.load(std::memory_order_relaxed) ||
      buffer_.size() >= options_.max_buffered_events) {
    ++dropped_buffer_;
    return;
  }
  const Pending& p = pending_[op.seq % pending_.size()];
  const bool known = p.seq == op.seq;
  const TensorView& data = Payload(op);
  Record r{op.seq,
           op.kind,
           data.dtype,
           data.count,
           op.kind == OpKind::kBroadcast || op.kind == OpKind::kReduce ? op.root : -1,
           IsPointToPoint(op.kind) ? op.peer : -1,
           known ? p.enqueue_ns : end_ns,
           known && p.start_ns != 0 ? p.start_ns : end_ns,
           end_ns,
           status.ok() ? std::string() : status.ToString()};
  buffer_.push_back(std::move(r));
}

void TimelineWriter::ThreadLoop() {
  while (true) {
    bool closing = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closing_ || buffer_.size() >= options_.flush_every_events;
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), options_.flush_interval);
      closing = closing_;
    }
    {
      absl::MutexLock io(&io_mu_);
      FlushLocked().IgnoreError();  // kept in io_error_, returned by Flush()/Close()
    }
    if (closing) return;
  }
}

absl::Status TimelineWriter::Flush() {
  absl::MutexLock io(&io_mu_);
  return FlushLocked();
}

absl::Status TimelineWriter::FlushLocked() {
  {
    absl::MutexLock lock(&mu_);
    // Swapping hands the op threads the spare vector's capacity: no reallocation on their side.
    batch_.swap(buffer_);
  }
  absl::Status s = WriteRecords(batch_);
  batch_.clear();
  return s;
}

absl::Status TimelineWriter::WriteRecords(const std::vector<Record>& records) {
  if (records.empty() || closed_) return io_error_;
  // Room kept for the footer, whose numbers and names have bounded length.
  const uint64_t reserve =
      512 + JsonEscape(options_.communicator).size() + JsonEscape(options_.backend).size();
  const uint64_t limit = options_.max_bytes > reserve ? options_.max_bytes - reserve : 0;
  std::string chunk;
  chunk.reserve(records.size() * 256);
  uint64_t added = 0;
  for (const Record& r : records) {
    if (truncated_.load(std::memory_order_relaxed)) {
      ++dropped_cap_;
      continue;
    }
    const TensorView view{nullptr, r.count, r.dtype, Device::Cpu(), nullptr};
    std::string ev = absl::StrFormat(
        ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%d,\"dur\":%.3f,\"pid\":%d,"
        "\"tid\":0,\"args\":{\"seq\":%d,\"dtype\":\"%s\",\"count\":%d,\"bytes\":%d,"
        "\"enqueue_ts\":%d",
        OpKindName(r.kind), IsPointToPoint(r.kind) ? "p2p" : "collective", r.start_ns / 1000,
        static_cast<double>(r.end_ns - r.start_ns) / 1e3, options_.rank, r.seq, DTypeName(r.dtype),
        r.count, view.bytes(), r.enqueue_ns / 1000);
    if (r.root >= 0) absl::StrAppend(&ev, ",\"root\":", r.root);
    if (r.peer >= 0) absl::StrAppend(&ev, ",\"peer\":", r.peer);
    if (r.error.empty()) {
      ev += ",\"status\":\"ok\"}}";
    } else {
      // "terrible" is a colour name of the trace viewers: failed ops stand out in red.
      absl::StrAppend(&ev, ",\"status\":\"failed\",\"error\":\"", JsonEscape(r.error),
                      "\"},\"cname\":\"terrible\"}");
    }
    if (bytes_ + chunk.size() + ev.size() > limit) {
      truncated_.store(true, std::memory_order_relaxed);
      ++dropped_cap_;
      continue;
    }
    chunk += ev;
    ++added;
  }
  absl::Status s = WriteAll(chunk);
  if (s.ok()) events_written_ += added;
  return s;
}

absl::Status TimelineWriter::WriteAll(const std::string& text) {
  if (!io_error_.ok()) return io_error_;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      io_error_ = absl::UnavailableError(
          absl::StrCat("timeline: write to ", path_, " failed: ", std::strerror(errno)));
      // Stop collecting: nothing more can reach the file.
      truncated_.store(true, std::memory_order_relaxed);
      return io_error_;
    }
    done += static_cast<size_t>(n);
  }
  bytes_ += text.size();
  return absl::OkStatus();
}

std::string TimelineWriter::Footer() const {
  uint64_t ops_seen = 0, failed = 0, dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    ops_seen = ops_seen_;
    failed = failed_ops_;
    dropped = dropped_buffer_;
  }
  return absl::StrFormat(
      "\n],\"otherData\":{\"rank\":%d,\"world_size\":%d,\"clock_offset_us\":%.3f,"
      "\"communicator\":\"%s\",\"backend\":\"%s\",\"sample_every\":%d,\"max_bytes\":%d,"
      "\"truncated\":%s,\"ops_seen\":%d,\"events_written\":%d,\"failed_ops\":%d,\"dropped\":%d,"
      "\"closed_at_us\":%d,\"complete\":true}}\n",
      options_.rank, options_.world_size, options_.clock_offset_us,
      JsonEscape(options_.communicator), JsonEscape(options_.backend), options_.sample_every,
      options_.max_bytes, truncated_.load() ? "true" : "false", ops_seen, events_written_, failed,
      dropped + dropped_cap_, absl::ToUnixMicros(absl::Now()));
}

absl::Status TimelineWriter::Close() {
  absl::MutexLock close_lock(&close_mu_);
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock io(&io_mu_);
  if (closed_) return io_error_;
  absl::Status s = FlushLocked();
  // The footer goes out even after a write error, in case the disk recovered (it is small).
  const std::string footer = Footer();
  io_error_ = absl::OkStatus();
  absl::Status f = WriteAll(footer);
  if (s.ok()) s = f;
  if (::close(fd_) != 0 && s.ok()) {
    s = absl::UnavailableError(
        absl::StrCat("timeline: close of ", path_, ": ", std::strerror(errno)));
  }
  fd_ = -1;
  closed_ = true;
  io_error_ = s;
  return s;
}

TimelineWriter::Stats TimelineWriter::stats() const {
  Stats st;
  absl::MutexLock io(&io_mu_);
  st.events_written = events_written_;
  st.bytes = bytes_;
  st.dropped = dropped_cap_;
  absl::MutexLock lock(&mu_);
  st.ops_seen = ops_seen_;
  st.failed_ops = failed_ops_;
  st.dropped += dropped_buffer_;
  st.truncated = truncated_.load();
  return st;
}

absl::StatusOr<std::shared_ptr<TimelineWriter>> OpenTimeline(const TimelineOptions& options) {
  return TimelineWriter::Open(options);
}

absl::StatusOr<std::shared_ptr<TimelineWriter>> StartTimeline(Store* store, TimelineOptions options,
                                                              absl::Duration clock_sync_timeout) {
  if (store != nullptr && options.world_size > 1) {
    ClockSyncOptions sync;
    sync.key_prefix = "timeline/clock_sync";
    absl::StatusOr<ClockOffsetEstimate> est =
        EstimateClockOffset(*store, options.rank, options.world_size, clock_sync_timeout, sync);
    if (est.ok()) {
      options.clock_offset_us = est->offset_us;
      ADAPTCOMM_LOG(kDebug, "timeline: clock offset ", est->offset_us, " us (round trip ",
                    est->rtt_us, " us)");
    } else {
      ADAPTCOMM_LOG(kWarning, "timeline: clock offset not estimated (", est.status().ToString(),
                    "); merged traces assume synchronized clocks");
    }
  }
  absl::StatusOr<std::shared_ptr<TimelineWriter>> w = OpenTimeline(options);
  if (w.ok()) ADAPTCOMM_LOG(kInfo, "timeline trace -> ", (*w)->path());
  return w;
}

absl::Status RecoverTimeline(const std::string& path) {
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  if (!nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false).is_discarded()) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is already a complete trace"));
  }
  const size_t meta_begin = text.find("[\n");
  if (meta_begin == std::string::npos) {
    return absl::DataLossError(absl::StrCat(path, ": no timeline header"));
  }
  const size_t meta_end = text.find(",\n", meta_begin + 2);
  const nlohmann::json meta = nlohmann::json::parse(
      text.substr(meta_begin + 2,
                  meta_end == std::string::npos ? std::string::npos : meta_end - meta_begin - 2),
      nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.contains("args") || !meta["args"].contains("rank")) {
    return absl::DataLossError(absl::StrCat(path, ": timeline header unreadable"));
  }
  const nlohmann::json& a = meta["args"];
  const std::string footer = absl::StrFormat(
      "\n],\"otherData\":{\"rank\":%d,\"world_size\":%d,\"clock_offset_us\":%.3f,"
      "\"sample_every\":%d,\"truncated\":true,\"recovered\":true,\"complete\":false}}\n",
      a.value("rank", 0), a.value("world_size", 1), a.value("clock_offset_us", 0.0),
      a.value("sample_every", 1));
  // Only the last event can be cut short: events are appended whole and in order.
  std::string fixed = text + footer;
  if (nlohmann::json::parse(fixed, nullptr, false).is_discarded()) {
    const size_t last = text.rfind(",\n{");
    if (last == std::string::npos || last < meta_begin) {
      return absl::DataLossError(absl::StrCat(path, ": cannot find a complete event"));
    }
    fixed = text.substr(0, last) + footer;
    if (nlohmann::json::parse(fixed, nullptr, false).is_discarded()) {
      return absl::DataLossError(absl::StrCat(path, ": damaged before its last event"));
    }
  }
  const std::string tmp = path + ".recover.tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << fixed;
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot replace ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace adaptcomm::trace

// TimelineWriter: this rank's operations as Chrome trace events (Perfetto and chrome://tracing
// open the file), for `adaptcomm trace merge` / `adaptcomm trace heatmap`.
//
// File DIR/trace.rank<R>.json:
//   {"displayTimeUnit":"ms","traceEvents":[
//   {"name":"process_name","ph":"M","pid":R,"tid":0,"args":{"name":"rank R","rank":R,...}},
//   {"name":"allreduce","cat":"collective","ph":"X","ts":<us since epoch, local clock>,
//    "dur":<us>,"pid":R,"tid":0,"args":{"seq":N,"dtype":"f32","count":C,"bytes":B,
//    "enqueue_ts":<us>,"status":"ok"}},
//   ...
//   ],"otherData":{"rank":R,"world_size":W,"clock_offset_us":X,"truncated":false,...}}
// Events are appended as they are flushed, so a crashed rank leaves a file that lacks only the
// closing "]" and otherData (Perfetto reads it; RecoverTimeline() closes it for merging).
//
// Bounded: at most `max_bytes` on disk (then it stops and otherData says truncated), and with
// sample_every = N only ops whose seq is 1 modulo N are kept - the same ops on every rank, since
// the heatmap compares ranks op by op. Failed ops are always kept.
//
// Cost on the op's thread: a mutex and a small record appended to a vector; formatting and file
// writes happen on the writer's own thread (every flush_every_events or flush_interval).
#ifndef ADAPTCOMM_LIB_TRACE_TIMELINE_WRITER_H_
#define ADAPTCOMM_LIB_TRACE_TIMELINE_WRITER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/store.h"
#include "lib/trace/op_observer.h"

namespace adaptcomm::trace {

struct TimelineOptions {
  int rank = 0;
  int world_size = 1;
  std::string dir = ".";         // created if missing
  double clock_offset_us = 0;    // this rank's clock minus rank 0's (EstimateClockOffset)
  std::string communicator;      // recorded in otherData
  std::string backend;           // recorded in otherData
  size_t max_bytes = 64u << 20;  // file size cap (at least 4096)
  int sample_every = 1;          // keep ops with seq % N == 1 (N = 1: all)
  size_t flush_every_events = 1024;
  absl::Duration flush_interval = absl::Seconds(1);
  // Events waiting for the writer thread beyond this are dropped (counted), so a stalled disk
  // cannot grow memory without bound.
  size_t max_buffered_events = 1u << 20;
};

class TimelineWriter final : public OpObserver {
 public:
  // Opens (truncates) DIR/trace.rank<R>.json, writes the header and starts the writer thread.
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<TimelineWriter>> Open(
      TimelineOptions options);
  ~TimelineWriter() override;  // Close()
  TimelineWriter(const TimelineWriter&) = delete;
  TimelineWriter& operator=(const TimelineWriter&) = delete;

  void OnEnqueue(const OpDesc& op, absl::Time when) override;
  void OnStart(const OpDesc& op, absl::Time when) override;
  void OnEnd(const OpDesc& op, const absl::Status& status, absl::Time when) override;

  // Writes every buffered event now (on the calling thread).
  [[nodiscard]] absl::Status Flush();
  // Final flush, closing "]" and otherData; stops the thread. Idempotent; later events are
  // ignored (a worker abandoned in a hung backend may still report).
  [[nodiscard]] absl::Status Close();

  struct Stats {
    uint64_t ops_seen = 0;        // OnEnd calls
    uint64_t events_written = 0;  // op events in the file
    uint64_t failed_ops = 0;
    uint64_t dropped = 0;  // kept by sampling but lost to the byte cap or a full buffer
    uint64_t bytes = 0;    // file size so far
    bool truncated = false;
  };
  Stats stats() const;
  const std::string& path() const { return path_; }
  const TimelineOptions& options() const { return options_; }

 private:
  struct Pending {  // an op between enqueue and end
    uint64_t seq = 0;
    int64_t enqueue_ns = 0;
    int64_t start_ns = 0;
  };
  struct Record {  // an ended op to write
    uint64_t seq;
    OpKind kind;
    DType dtype;
    uint64_t count;
    int root, peer;
    int64_t enqueue_ns, start_ns, end_ns;
    std::string error;  // empty: ok
  };

  TimelineWriter(TimelineOptions options, std::string path, int fd);
  void ThreadLoop();
  // Formats and writes `records`. REQUIRES: io_mu_ held.
  absl::Status WriteRecords(const std::vector<Record>& records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  absl::Status WriteAll(const std::string& text) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  absl::Status FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  std::string Footer() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  const TimelineOptions options_;
  const std::string path_;

  mutable absl::Mutex mu_;  // the op threads' side: cheap, never held across I/O
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);  // ring indexed by seq
  std::vector<Record> buffer_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t ops_seen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ops_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_buffer_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> truncated_{false};  // read on every op without the lock

  absl::Mutex close_mu_;  // serializes Close()
  // The file's side. Lock order: io_mu_ before mu_ (a flush takes the buffer under both).
  mutable absl::Mutex io_mu_;
  int fd_ ABSL_GUARDED_BY(io_mu_) = -1;
  bool closed_ ABSL_GUARDED_BY(io_mu_) = false;
  uint64_t bytes_ ABSL_GUARDED_BY(io_mu_) = 0;
  uint64_t events_written_ ABSL_GUARDED_BY(io_mu_) = 0;
  uint64_t dropped_cap_ ABSL_GUARDED_BY(io_mu_) = 0;
  absl::Status io_error_ ABSL_GUARDED_BY(io_mu_);
  std::vector<Record> batch_ ABSL_GUARDED_BY(io_mu_);  // being written; swapped with buffer_

  std::thread thread_;
};

// Opens a timeline with `options` (the factory the communicator calls).
[[nodiscard]] absl::StatusOr<std::shared_ptr<TimelineWriter>> OpenTimeline(
    const TimelineOptions& options);

// What a communicator does when tracing is requested: estimates the clock offset through `store`
// (collective; on failure logs a warning and uses 0, the merge is then only as good as the hosts'
// NTP) and opens the writer. `store` may be null (offset 0).
[[nodiscard]] absl::StatusOr<std::shared_ptr<TimelineWriter>> StartTimeline(
    Store* store, TimelineOptions options, absl::Duration clock_sync_timeout);

// Closes the file of a rank that died before Close(): drops a partial last event, appends "]"
// and otherData (rank, world_size and clock offset from the header, truncated and recovered
// true). FailedPrecondition if the file is already complete.
[[nodiscard]] absl::Status RecoverTimeline(const std::string& path);

}  // namespace adaptcomm::trace

#endif  // ADAPTCOMM_LIB_TRACE_TIMELINE_WRITER_H_

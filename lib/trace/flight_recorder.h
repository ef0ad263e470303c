// FlightRecorder: a ring buffer of the last N operations of one rank (seq, op, dtype, count,
// root/peer, backend, generation, state, enqueue/start/end times), dumped as JSON when a
// collective times out or fails fatally, or on demand, so that `adaptcomm trace culprit DIR` can
// tell which rank is behind.
//
// Dump file: DIR/flight.rank<R>.json  (format in DumpJson()).
#ifndef ADAPTCOMM_LIB_TRACE_FLIGHT_RECORDER_H_
#define ADAPTCOMM_LIB_TRACE_FLIGHT_RECORDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/spin_lock.h"
#include "lib/trace/op_observer.h"

namespace adaptcomm::trace {

struct FlightRecorderOptions {
  int rank = 0;
  int world_size = 1;
  std::string communicator;  // name
  std::string job;           // same on every rank of one communicator; tells runs apart
  std::string backend;       // "gloo", "nccl", ...
  size_t capacity = 2048;    // entries kept
  std::string dump_dir;      // where Dump() writes
};

class FlightRecorder final : public OpObserver {
 public:
  explicit FlightRecorder(FlightRecorderOptions options);

  void OnEnqueue(const OpDesc& op, absl::Time when) override;
  void OnStart(const OpDesc& op, absl::Time when) override;
  void OnEnqueueAndStart(const OpDesc& op, absl::Time when) override;
  void OnEnd(const OpDesc& op, const absl::Status& status, absl::Time when) override;

  // The backend generation (bumped when a retry or degrade rebuilds the backend).
  void SetGeneration(int generation, const std::string& backend);

  // The JSON document: {"rank","world_size","communicator","job","backend","generation","reason",
  // "dumped_at_us","last_enqueued_seq","last_started_seq","last_completed_seq",
  // "entries":[{"seq","op","dtype","count","root","peer","backend","generation","state",
  // "enqueue_us","start_us","end_us","error"}...],"events":[{"t_us","text"}...]} with entries in
  // seq order; times are microseconds since the Unix epoch (0 = not yet).
  std::string DumpJson(const std::string& reason) const;
  // Writes DumpJson(reason) to dump_dir/flight.rank<R>.json (atomically, via a temporary file);
  // returns the path. Dumps of one recorder are written one at a time (several threads dump on a
  // failure: the failure coordinator, the heartbeat watch, the caller).
  absl::StatusOr<std::string> Dump(const std::string& reason) const;
  const std::string& dump_dir() const { return options_.dump_dir; }

  // An event that is not an op (a slow rank named or cleared by the fail-slow detector), kept
  // with its time; the last kEvents are dumped. Not for the op path: it takes a mutex.
  static constexpr size_t kEvents = 32;
  void AddEvent(const std::string& text);
  // The events kept, oldest first.
  std::vector<std::string> events() const;

  // Where this rank is, for its state record: the last op it entered, started and completed,
  // and the oldest op it entered that has not ended (0: none) with its kind, bytes and the times
  // it was entered and started (UnixEpoch: not yet).
  struct Progress {
    uint64_t last_enqueued = 0;
    uint64_t last_started = 0;
    uint64_t last_completed = 0;
    uint64_t current = 0;
    OpKind kind = OpKind::kBarrier;
    uint64_t bytes = 0;
    absl::Time entered = absl::UnixEpoch();
    absl::Time started = absl::UnixEpoch();
  };
  Progress progress() const;

 private:
  struct Entry {
    uint64_t seq = 0;
    OpKind kind = OpKind::kBarrier;
    DType dtype = DType::kF32;
    size_t count = 0;
    int root = -1;
    int peer = -1;
    uint32_t backend = 0;  // its name: backends_[backend]
    int generation = 0;
    const char* state = "queued";
    absl::Time enqueue = absl::UnixEpoch(), start = absl::UnixEpoch(), end = absl::UnixEpoch();
    std::string error;
  };
  Entry* Find(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OnEnqueue / OnStart under mu_. The ring's entries are reused field by field: their strings
  // keep their buffers, so recording an op allocates nothing.
  Entry& RecordEnqueueLocked(const OpDesc& op, absl::Time when) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordStartLocked(Entry* e, uint64_t seq, absl::Time when)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FlightRecorderOptions options_;
  // Held through a whole Dump: two at once would write the same temporary file.
  mutable absl::Mutex dump_mu_;
  // Every op takes it once or twice, for a few stores: a SpinLock costs less there than an
  // absl::Mutex. DumpJson copies what it reports under it and formats without it.
  mutable SpinLock mu_;
  std::vector<Entry> ring_ ABSL_GUARDED_BY(mu_);
  // Every backend name the ring's entries refer to, each once: an entry records an index (a string
  // copy per op would cost more than the rest of its entry). As many as the kinds of backend the
  // communicator ran on, however often a rebuild changed it.
  std::vector<std::string> backends_ ABSL_GUARDED_BY(mu_);
  uint32_t backend_ ABSL_GUARDED_BY(mu_) = 0;  // the current one's index
  int generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_started_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_completed_ ABSL_GUARDED_BY(mu_) = 0;
  struct Event {
    absl::Time at;
    std::string text;
  };
  mutable absl::Mutex events_mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(events_mu_);  // oldest first
};

// The dump directory when neither options nor profile name one:
// $ADAPTCOMM_FLIGHT_RECORDER_DIR, else $TMPDIR (or /tmp) + "/adaptcomm-flight".
std::string DefaultFlightRecorderDir();

}  // namespace adaptcomm::trace

#endif  // ADAPTCOMM_LIB_TRACE_FLIGHT_RECORDER_H_

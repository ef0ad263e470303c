// The shared segment of the shm backend: one memfd created by rank 0, mapped by every rank of the
// host, closed by its creator as soon as every rank has confirmed its mapping. A memfd has no name
// under /dev/shm, and once the creator closed it the pages live only as long as some rank maps
// them: a crash at any point leaks nothing.
//
// Creation, through the store (keys under the given, already prefixed store):
//   rank 0 : memfd_create, size, allocate (fallocate: no space fails here, not as SIGBUS later),
//            map, write the header, publish "seg" = "ok <version> <pid> <fd> <bytes>" (or
//            "no:<why>").
//   others : open /proc/<pid>/fd/<fd> (any process of the same user may), map, check the header.
//   all    : write their pid in the header, publish "mapped/<rank>" = "ok" or "no:<why>", read
//            every rank's; any "no" fails creation on every rank alike (the caller falls back on
//            every rank). Rank 0 then closes the memfd.
//
// Layout (offsets 64-byte aligned, data 4 KiB aligned):
//   Header | RankInfo[world] | Counter post[world], done[world] | Channel[world * world] |
//   slot[world] (2 halves each) | p2p buffer[world * world] (2 halves each)
#ifndef ADAPTCOMM_LIB_SHM_SHM_SEGMENT_H_
#define ADAPTCOMM_LIB_SHM_SHM_SEGMENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"

namespace adaptcomm::shm {

// Bump whenever anything in this header's structs or the layout order changes.
inline constexpr uint32_t kLayoutVersion = 1;

// One word a rank publishes and peers wait on (futex), on its own cache line.
struct alignas(64) Counter {
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> waiters;  // ranks blocked in FUTEX_WAIT on `value`
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct alignas(64) Header {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t world;
  uint64_t total_bytes;
  uint64_t slot_bytes;
  uint64_t p2p_bytes;
  // 0, or 1 + the rank that broke the group (its code and reason are in its RankInfo).
  alignas(64) std::atomic<uint32_t> broken_by;
};

struct alignas(64) RankInfo {
  std::atomic<int32_t> pid;
  uint64_t start_time;  // field 22 of /proc/<pid>/stat: tells a reused pid apart
  std::atomic<int32_t> broken_code;
  char broken_reason[240];
};

// The sender -> receiver channel of send/recv: `sent` counts chunks written (by the sender),
// `consumed` chunks read (by the receiver); chunk k lives in half k % 2 with its descriptor.
struct alignas(64) ChunkDesc {
  uint32_t tag;
  uint64_t total_bytes;
  uint64_t chunk_bytes;
};
struct alignas(64) Channel {
  Counter sent;
  Counter consumed;
  ChunkDesc desc[2];
};

struct SegmentOptions {
  int rank = 0;
  int world = 1;
  std::shared_ptr<Store> store;
  absl::Duration timeout = absl::Seconds(300);
  size_t slot_bytes = 0;                     // per rank, both halves
  size_t p2p_bytes = 0;                      // per ordered pair, both halves
  size_t max_bytes = 0;                      // refuse segments larger than this
  uint32_t layout_version = kLayoutVersion;  // tests: a skewed rank
};

class Segment {
 public:
  // Errors: ResourceExhausted (size past the limit or no memory for it; names both),
  // FailedPrecondition (a rank with another layout version, named), DeadlineExceeded (a rank never
  // reported), Unavailable (anything else, e.g. a peer could not open the memfd).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Segment>> Create(const SegmentOptions& o);
  // Bytes of the whole segment for these options.
  static size_t BytesFor(int world, size_t slot_bytes, size_t p2p_bytes);

  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int world() const { return world_; }
  size_t bytes() const { return bytes_; }
  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  RankInfo& info(int r) const { return infos_[r]; }
  Counter& post(int r) const { return counters_[r]; }
  Counter& done(int r) const { return counters_[world_ + r]; }
  Channel& channel(int src, int dst) const { return channels_[src * world_ + dst]; }
  // Half `h` (0 or 1) of rank r's slot; slot_half_bytes() each.
  unsigned char* slot(int r, int h) const {
    return slots_ + (static_cast<size_t>(r) * 2 + h) * slot_half_;
  }
  size_t slot_half_bytes() const { return slot_half_; }
  unsigned char* p2p(int src, int dst, int h) const {
    return p2p_ + ((static_cast<size_t>(src) * world_ + dst) * 2 + h) * p2p_half_;
  }
  size_t p2p_half_bytes() const { return p2p_half_; }
  // Every futex word of the segment, for waking all waiters (abort).
  void WakeAll() const;

 private:
  Segment() = default;

  unsigned char* base_ = nullptr;
  size_t bytes_ = 0;
  int world_ = 0;
  RankInfo* infos_ = nullptr;
  Counter* counters_ = nullptr;
  Channel* channels_ = nullptr;
  unsigned char* slots_ = nullptr;
  size_t slot_half_ = 0;
  unsigned char* p2p_ = nullptr;
  size_t p2p_half_ = 0;
};

// Liveness of a process as /proc tells it.
enum class ProcessState { kRunning, kStopped, kGone };
ProcessState ProbeProcess(pid_t pid, uint64_t start_time);
// Field 22 of /proc/<pid>/stat (0 if unreadable).
uint64_t ProcessStartTime(pid_t pid);

// FUTEX_WAIT on a shared (not process-private) word: returns after a wake, a value change or
// `timeout`; spurious returns are fine (callers re-check).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace adaptcomm::shm

#endif  // ADAPTCOMM_LIB_SHM_SHM_SEGMENT_H_

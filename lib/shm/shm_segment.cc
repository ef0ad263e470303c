#include "lib/shm/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace adaptcomm::shm {
namespace {

constexpr uint64_t kMagic = 0x61646170'73686d31ull;  // "adapshm1"
constexpr char kNo[] = "no:";

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct Offsets {
  size_t infos, counters, channels, slots, p2p, total;
};

Offsets Layout(int world, size_t slot_bytes, size_t p2p_bytes) {
  const size_t w = static_cast<size_t>(world);
  Offsets o{};
  o.infos = AlignUp(sizeof(Header), 64);
  o.counters = AlignUp(o.infos + w * sizeof(RankInfo), 64);
  o.channels = AlignUp(o.counters + 2 * w * sizeof(Counter), 64);
  o.slots = AlignUp(o.channels + w * w * sizeof(Channel), 4096);
  o.p2p = o.slots + w * AlignUp(slot_bytes, 8192);
  o.total = o.p2p + w * w * AlignUp(p2p_bytes, 8192);
  return o;
}

std::string Errno(int e) { return std::strerror(e); }

std::string FormatBytes(size_t b) {
  if (b >= (1u << 20) && b % (1u << 20) == 0) return absl::StrCat(b >> 20, " MiB");
  if (b >= (1u << 20)) {
    char mib[32];
    std::snprintf(mib, sizeof(mib), "%.1f", static_cast<double>(b) / (1u << 20));
    return absl::StrCat(mib, " MiB (", b, " bytes)");
  }
  return absl::StrCat(b, " bytes");
}

// The code of a peer's failure, from its published reason: every rank fails alike.
absl::StatusCode CodeOf(const std::string& why) {
  if (absl::StrContains(why, "layout version")) return absl::StatusCode::kFailedPrecondition;
  if (absl::StrContains(why, "limit")) return absl::StatusCode::kResourceExhausted;
  return absl::StatusCode::kUnavailable;
}

}  // namespace

size_t Segment::BytesFor(int world, size_t slot_bytes, size_t p2p_bytes) {
  return Layout(world, slot_bytes, p2p_bytes).total;
}

Segment::~Segment() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

void Segment::WakeAll() const {
  for (int r = 0; r < 2 * world_; ++r) FutexWakeAll(&counters_[r].value);
  for (int c = 0; c < world_ * world_; ++c) {
    FutexWakeAll(&channels_[c].sent.value);
    FutexWakeAll(&channels_[c].consumed.value);
  }
}

namespace {

// Maps the segment `f` (of `total` bytes) into `*base`.
absl::Status MapSegment(int f, size_t total, const std::string& who, unsigned char** base) {
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, f, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat(who, ": mmap of ", FormatBytes(total), " failed: ", Errno(e)));
  }
  *base = static_cast<unsigned char*>(p);
  return absl::OkStatus();
}

// Rank 0: creates, sizes, allocates and maps the segment, writes its header and publishes it (or
// why it could not) under "seg". Returns this rank's outcome; `*fd` stays open for the others to
// open through /proc until every rank has mapped it.
absl::Status CreateOnRankZero(const SegmentOptions& o, const Offsets& layout,
                              const std::string& who, int* fd, unsigned char** base) {
  absl::Status mine;
  if (layout.total > o.max_bytes) {
    mine = absl::ResourceExhaustedError(absl::StrCat(
        who, ": a segment for ", o.world, " ranks needs ", FormatBytes(layout.total),
        ", over the limit of ", FormatBytes(o.max_bytes), " (shm slot ", FormatBytes(o.slot_bytes),
        " per rank, ", FormatBytes(o.p2p_bytes), " per send/recv pair)"));
  }
  if (mine.ok()) {
    *fd = static_cast<int>(syscall(SYS_memfd_create, "adaptcomm-shm", 0u));
    if (*fd < 0) {
      const int e = errno;
      mine = absl::UnavailableError(absl::StrCat(who, ": memfd_create failed: ", Errno(e)));
    }
  }
  if (mine.ok() && ftruncate(*fd, static_cast<off_t>(layout.total)) != 0) {
    const int e = errno;
    mine = absl::ResourceExhaustedError(absl::StrCat(
        who, ": sizing the segment to ", FormatBytes(layout.total), " failed: ", Errno(e)));
  }
  // Allocates every page now: no space fails here, naming the size, instead of SIGBUS later.
  if (mine.ok()) {
    if (int e = posix_fallocate(*fd, 0, static_cast<off_t>(layout.total)); e != 0) {
      mine = absl::ResourceExhaustedError(
          absl::StrCat(who, ": cannot allocate ", FormatBytes(layout.total),
                       " of shared memory (limit ", FormatBytes(o.max_bytes), "): ", Errno(e)));
    }
  }
  if (mine.ok()) mine = MapSegment(*fd, layout.total, who, base);
  if (mine.ok()) {
    auto* h = new (*base) Header();
    h->magic = kMagic;
    h->layout_version = o.layout_version;
    h->world = static_cast<uint32_t>(o.world);
    h->total_bytes = layout.total;
    h->slot_bytes = o.slot_bytes;
    h->p2p_bytes = o.p2p_bytes;
  }
  const std::string value =
      mine.ok() ? absl::StrCat("ok ", o.layout_version, " ", getpid(), " ", *fd, " ", layout.total)
                : absl::StrCat(kNo, mine.message());
  if (absl::Status s = o.store->Set("seg", value); !s.ok() && mine.ok()) mine = s;
  return mine;
}

// Every other rank: opens rank 0's segment through /proc (from its "seg" record), maps it and
// checks its header against this rank's layout.
absl::Status OpenFromRankZero(const SegmentOptions& o, const Offsets& layout,
                              const std::string& who, absl::Duration wait, unsigned char** base) {
  absl::StatusOr<std::string> seg = o.store->Get("seg", wait);
  if (!seg.ok()) {
    return absl::Status(
        seg.status().code(),
        absl::StrCat(who, ": rank 0 never published the segment: ", seg.status().message()));
  }
  if (absl::StartsWith(*seg, kNo)) {
    const std::string why = seg->substr(sizeof(kNo) - 1);
    return absl::Status(CodeOf(why), absl::StrCat(who, ": rank 0 could not create it: ", why));
  }
  std::vector<std::string> f = absl::StrSplit(*seg, ' ');
  uint32_t version = 0;
  int pid = 0, cfd = 0;
  uint64_t total = 0;
  if (f.size() != 5 || !absl::SimpleAtoi(f[1], &version) || !absl::SimpleAtoi(f[2], &pid) ||
      !absl::SimpleAtoi(f[3], &cfd) || !absl::SimpleAtoi(f[4], &total)) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": unreadable segment record from rank 0: '", *seg, "'"));
  }
  if (version != o.layout_version) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": rank 0 created shm layout version ",
                                                      version, ", rank ", o.rank, " has version ",
                                                      o.layout_version, " (mixed library builds)"));
  }
  if (total != layout.total) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": rank 0 sized the segment ", FormatBytes(total), ", rank ", o.rank,
                     " expects ", FormatBytes(layout.total), " (different shm options)"));
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", cfd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    return absl::UnavailableError(
        absl::StrCat(who, ": cannot open rank 0's segment ", path, ": ", Errno(e)));
  }
  absl::Status mapped = MapSegment(fd, layout.total, who, base);
  close(fd);
  if (!mapped.ok()) return mapped;
  const Header& h = *reinterpret_cast<const Header*>(*base);
  if (h.magic != kMagic || h.layout_version != o.layout_version ||
      h.world != static_cast<uint32_t>(o.world) || h.total_bytes != layout.total) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": the segment header does not match this rank's layout (version ", h.layout_version,
        " vs ", o.layout_version, ", world ", h.world, " vs ", o.world, ")"));
  }
  return absl::OkStatus();
}

// Publishes this rank's verdict (`mine`) and waits for every rank's: any "no" fails everyone
// alike. `fd` (rank 0's, or -1) is closed once every rank has mapped the segment (or given up):
// nothing to unlink.
absl::Status AgreeMapped(const SegmentOptions& o, const std::string& who, const absl::Status& mine,
                         absl::Time deadline, int fd) {
  Store& store = *o.store;
  const std::string verdict = mine.ok() ? std::string("ok") : absl::StrCat(kNo, mine.message());
  absl::Status agreed = store.Set(absl::StrCat("mapped/", o.rank), verdict);
  std::vector<std::string> keys;
  for (int r = 0; r < o.world; ++r) keys.push_back(absl::StrCat("mapped/", r));
  if (agreed.ok())
    agreed = store.Wait(keys, std::max(deadline - absl::Now(), absl::ZeroDuration()));
  if (fd >= 0) close(fd);
  if (!mine.ok()) return mine;
  if (!agreed.ok()) {
    return absl::Status(
        agreed.code(),
        absl::StrCat(who, ": not every rank mapped the segment: ", agreed.message()));
  }
  for (int r = 0; r < o.world; ++r) {
    absl::StatusOr<std::string> v = store.Get(keys[r], absl::Seconds(1));
    if (!v.ok()) return v.status();
    if (*v != "ok") {
      const std::string why = v->substr(std::min(v->size(), sizeof(kNo) - 1));
      return absl::Status(CodeOf(why), absl::StrCat(who, ": rank ", r, " failed: ", why));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Segment>> Segment::Create(const SegmentOptions& o) {
  const Offsets layout = Layout(o.world, o.slot_bytes, o.p2p_bytes);
  const std::string who = absl::StrCat("shm segment (rank ", o.rank, " of ", o.world, ")");
  const absl::Time deadline = absl::Now() + o.timeout;
  int fd = -1;
  unsigned char* base = nullptr;
  // This rank's outcome.
  const absl::Status mine =
      o.rank == 0 ? CreateOnRankZero(o, layout, who, &fd, &base)
                  : OpenFromRankZero(o, layout, who,
                                     std::max(deadline - absl::Now(), absl::ZeroDuration()), &base);
  auto segment = std::unique_ptr<Segment>(new Segment());
  if (mine.ok()) {
    Segment& s = *segment;
    s.base_ = base;
    s.bytes_ = layout.total;
    s.world_ = o.world;
    s.infos_ = reinterpret_cast<RankInfo*>(base + layout.infos);
    s.counters_ = reinterpret_cast<Counter*>(base + layout.counters);
    s.channels_ = reinterpret_cast<Channel*>(base + layout.channels);
    s.slots_ = base + layout.slots;
    s.slot_half_ = AlignUp(o.slot_bytes, 8192) / 2;
    s.p2p_ = base + layout.p2p;
    s.p2p_half_ = AlignUp(o.p2p_bytes, 8192) / 2;
    RankInfo& me = s.info(o.rank);
    me.start_time = ProcessStartTime(getpid());
    me.pid.store(static_cast<int32_t>(getpid()), std::memory_order_release);
  } else if (base != nullptr) {
    munmap(base, layout.total);
  }
  if (absl::Status agreed = AgreeMapped(o, who, mine, deadline, fd); !agreed.ok()) return agreed;
  return segment;
}

uint64_t ProcessStartTime(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  // After "pid (comm)": state is field 3, start time field 22.
  std::vector<std::string> f = absl::StrSplit(text.substr(paren + 2), ' ');
  uint64_t start = 0;
  if (f.size() > 19 && absl::SimpleAtoi(f[19], &start)) return start;
  return 0;
}

ProcessState ProbeProcess(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return ProcessState::kRunning;  // not yet published: nothing to say
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  if (!in) return ProcessState::kGone;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return ProcessState::kGone;
  const char state = text[paren + 2];
  // A killed child stays a zombie until its parent reaps it: it is gone all the same.
  if (state == 'Z' || state == 'X' || state == 'x') return ProcessState::kGone;
  std::vector<std::string> f = absl::StrSplit(text.substr(paren + 2), ' ');
  uint64_t start = 0;
  if (start_time != 0 && f.size() > 19 && absl::SimpleAtoi(f[19], &start) && start != start_time) {
    return ProcessState::kGone;  // the pid was reused
  }
  if (state == 'T' || state == 't') return ProcessState::kStopped;
  return ProcessState::kRunning;
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  const absl::Duration t = std::max(timeout, absl::ZeroDuration());
  timespec ts = absl::ToTimespec(t);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace adaptcomm::shm

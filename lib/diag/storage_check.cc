#include "lib/diag/storage_check.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace adaptcomm::diag {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// Rates below min/10 fail, below min warn.
CheckStatus RateStatus(double mbps, double min_mbps) {
  if (mbps < min_mbps / 10) return CheckStatus::kFail;
  if (mbps < min_mbps) return CheckStatus::kWarn;
  return CheckStatus::kPass;
}

void Add(std::vector<CheckResult>& out, std::string check, CheckStatus st, std::string detail,
         std::string fix = "") {
  out.push_back({std::move(check), st, std::move(detail), std::move(fix)});
}

// Write in 4 MiB blocks of non-zero data (zeros may be compressed or deduplicated).
constexpr size_t kBlock = 4 << 20;

// Writes o.checkpoint_bytes to `fd` and syncs it; whether that worked (the result is in `out`).
bool CheckWrite(const DiagnoseOptions& o, int fd, std::vector<char>& block, uint64_t& written,
                std::vector<CheckResult>& out) {
  const std::string dir = o.checkpoint_dir.value_or("");
  int write_errno = 0;
  const auto t0 = Clock::now();
  while (written < o.checkpoint_bytes) {
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(kBlock, o.checkpoint_bytes - written));
    const ssize_t n = write(fd, block.data(), want);
    if (n < 0) {
      if (errno == EINTR) continue;
      write_errno = errno;
      break;
    }
    written += static_cast<uint64_t>(n);
  }
  const auto t1 = Clock::now();
  int sync_errno = 0;
  if (write_errno == 0 && fsync(fd) != 0) sync_errno = errno;
  const auto t2 = Clock::now();
  if (write_errno != 0 || sync_errno != 0) {
    const int e = write_errno != 0 ? write_errno : sync_errno;
    Add(out, "storage.write", CheckStatus::kFail,
        absl::StrCat(write_errno ? "write" : "fsync", " failed after ", Mib(written), " of ",
                     Mib(o.checkpoint_bytes), " in ", dir, ": ", std::strerror(e),
                     e == ENOSPC ? " - the directory cannot hold a checkpoint of this size" : ""),
        e == ENOSPC ? "free space or point --checkpoint-dir at a larger volume (a tmpfs or a "
                      "full disk loses the checkpoint when the job fails)"
                    : "check the file system's health and mount options");
    return false;
  }
  const double write_mbps = written / 1e6 / std::max(Seconds(t0, t2), 1e-9);
  Add(out, "storage.write", RateStatus(write_mbps, o.min_write_mbps),
      absl::StrFormat("%s written + fsync at %.0f MB/s (threshold %.0f MB/s; fsync %.1f ms)",
                      Mib(written), write_mbps, o.min_write_mbps, Seconds(t1, t2) * 1e3),
      write_mbps < o.min_write_mbps ? "checkpoints will stall training: use faster storage or "
                                      "asynchronous checkpointing"
                                    : "");
  return true;
}

// Reads the `written` bytes back, with this file's cached pages dropped so the disk (not RAM) is
// measured.
void CheckRead(const DiagnoseOptions& o, int fd, std::vector<char>& block, uint64_t written,
               std::vector<CheckResult>& out) {
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  uint64_t read_bytes = 0;
  const auto r0 = Clock::now();
  lseek(fd, 0, SEEK_SET);
  for (;;) {
    const ssize_t n = read(fd, block.data(), kBlock);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    read_bytes += static_cast<uint64_t>(n);
  }
  const double read_mbps = read_bytes / 1e6 / std::max(Seconds(r0, Clock::now()), 1e-9);
  if (read_bytes != written) {
    Add(out, "storage.read", CheckStatus::kFail,
        absl::StrCat("read back ", read_bytes, " of ", written, " bytes"),
        "check the file system's health");
  } else {
    Add(out, "storage.read", RateStatus(read_mbps, o.min_read_mbps),
        absl::StrFormat("%s read at %.0f MB/s (threshold %.0f MB/s)", Mib(read_bytes), read_mbps,
                        o.min_read_mbps),
        read_mbps < o.min_read_mbps ? "resuming from a checkpoint will be slow: use faster storage"
                                    : "");
  }
}

// Small synchronous writes: what a metadata-heavy checkpoint (many shards) pays per file.
void CheckSmallSyncs(const DiagnoseOptions& o, int fd, std::vector<char>& block,
                     std::vector<CheckResult>& out) {
  double worst_ms = 0, total_ms = 0;
  constexpr int kRounds = 8;
  for (int i = 0; i < kRounds; ++i) {
    const auto s0 = Clock::now();
    if (pwrite(fd, block.data(), 4096, static_cast<off_t>(i) * 4096) != 4096 || fsync(fd) != 0) {
      Add(out, "storage.fsync", CheckStatus::kFail,
          absl::StrCat("fsync failed: ", std::strerror(errno)), "check the file system's health");
      return;
    }
    const double ms = Seconds(s0, Clock::now()) * 1e3;
    worst_ms = std::max(worst_ms, ms);
    total_ms += ms;
  }
  CheckStatus fs = CheckStatus::kPass;
  if (worst_ms > o.max_fsync_ms * 10) {
    fs = CheckStatus::kFail;
  } else if (worst_ms > o.max_fsync_ms) {
    fs = CheckStatus::kWarn;
  }
  Add(out, "storage.fsync", fs,
      absl::StrFormat("4 KiB write+fsync: mean %.2f ms, worst %.2f ms (threshold %.0f ms)",
                      total_ms / kRounds, worst_ms, o.max_fsync_ms),
      fs == CheckStatus::kPass ? ""
                               : "slow fsync stalls every checkpoint shard: check the "
                                 "storage backend (NFS options, a busy disk)");
}

}  // namespace

std::vector<CheckResult> CheckStorage(const DiagnoseOptions& o) {
  std::vector<CheckResult> out;
  const std::string dir = o.checkpoint_dir.value_or("");
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) {
    Add(out, "storage.access", CheckStatus::kFail, absl::StrCat(dir, ": ", std::strerror(errno)),
        "create the checkpoint directory (shared storage mounted?) before training");
    return out;
  }
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  std::string path = absl::StrCat(dir, "/.adaptcomm_diagnose.", getpid());
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    Add(out, "storage.access", CheckStatus::kFail,
        absl::StrCat("cannot create a file in ", dir, ": ", std::strerror(errno)),
        "make the directory writable by the training user");
    return out;
  }
  Add(out, "storage.access", CheckStatus::kPass,
      absl::StrCat(dir, " writable, ", Mib(free_bytes), " free"));

  std::vector<char> block(kBlock);
  for (size_t i = 0; i < kBlock; ++i) block[i] = static_cast<char>(i * 131 + 7);
  uint64_t written = 0;
  if (CheckWrite(o, fd, block, written, out)) {
    CheckRead(o, fd, block, written, out);
    CheckSmallSyncs(o, fd, block, out);
  }
  close(fd);
  unlink(path.c_str());
  return out;
}

}  // namespace adaptcomm::diag

// A store in a directory (a shared file system for multi-host jobs): one file per key.
//
// Readers never see a half-written value: every write goes to a temporary file that is renamed
// over the key's file. Writers (SET, ADD, DELETE) serialise on flock() of one lock file, which
// makes ADD's read-modify-write atomic across threads and processes. GET/WAIT poll.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "adaptcomm/store.h"

namespace adaptcomm {
namespace {

constexpr absl::Duration kFirstPoll = absl::Milliseconds(1);
constexpr absl::Duration kMaxPoll = absl::Milliseconds(10);
// Escaped names longer than this become a hash (file names are limited to 255 bytes).
constexpr size_t kMaxPlainName = 180;

std::string Errno(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

uint64_t Fnv1a(const std::string& s, uint64_t basis) {
  uint64_t h = basis;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// Key files start with "k-"; temporaries and the lock file start with '.', so no key collides.
std::string FileNameForKey(const std::string& key) {
  std::string name = "k-";
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.') {
      name.push_back(static_cast<char>(c));
    } else {
      name += absl::StrFormat("%%%02X", c);
    }
  }
  if (name.size() <= kMaxPlainName) return name;
  // Two independent 64-bit hashes: a collision is not a practical concern.
  return absl::StrFormat("h-%s-%016x%016x", name.substr(2, 64), Fnv1a(key, 14695981039346656037ULL),
                         Fnv1a(key, 0x84222325cbf29ce4ULL));
}

absl::Status MkdirP(const std::string& dir) {
  std::string path;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      path = dir.substr(0, i);
      if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::UnavailableError(Errno(absl::StrCat("file store: cannot create ", path)));
      }
    }
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("file store: '", dir, "' is not a directory"));
  }
  return absl::OkStatus();
}

// Reads a whole file: the value, NotFound if absent, Unavailable on other errors.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(path);
    return absl::UnavailableError(Errno(absl::StrCat("file store: cannot open ", path)));
  }
  std::string out;
  char buf[64 * 1024];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      absl::Status s =
          absl::UnavailableError(Errno(absl::StrCat("file store: cannot read ", path)));
      ::close(fd);
      return s;
    }
  }
  ::close(fd);
  return out;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Holds flock(LOCK_EX) on the store's lock file. Each holder opens its own descriptor, so the
// lock excludes threads of one process as well as other processes.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      status_ = absl::UnavailableError(Errno(absl::StrCat("file store: cannot open ", path)));
      return;
    }
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      status_ = absl::UnavailableError(Errno(absl::StrCat("file store: cannot lock ", path)));
      return;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int fd_ = -1;
  absl::Status status_;
};

class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    FileLock lock(LockPath());
    if (!lock.status().ok()) return lock.status();
    return WriteAtomically(KeyPath(key), value);
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    std::string path = KeyPath(key);
    absl::StatusOr<std::string> value;
    bool done = PollUntil(timeout, [&] {
      value = ReadFile(path);
      return !absl::IsNotFound(value.status());
    });
    if (done) return value;
    if (timeout <= absl::ZeroDuration()) {
      return absl::NotFoundError(absl::StrCat("store key '", key, "' is not set"));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("store key '", key, "' not set within ", absl::FormatDuration(timeout)));
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    FileLock lock(LockPath());
    if (!lock.status().ok()) return lock.status();
    std::string path = KeyPath(key);
    auto old = ReadFile(path);
    int64_t value = 0;
    if (old.ok()) {
      if (!old->empty() && !absl::SimpleAtoi(*old, &value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("store key '", key, "' holds a non-integer value; cannot add to it"));
      }
    } else if (!absl::IsNotFound(old.status())) {
      return old.status();
    }
    if (__builtin_add_overflow(value, delta, &value)) {
      return absl::OutOfRangeError(
          absl::StrCat("adding ", delta, " to store key '", key, "' overflows"));
    }
    if (absl::Status s = WriteAtomically(path, std::to_string(value)); !s.ok()) return s;
    return value;
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    std::vector<std::string> paths;
    for (const auto& k : keys) paths.push_back(KeyPath(k));
    bool done = PollUntil(timeout, [&] {
      return std::all_of(paths.begin(), paths.end(),
                         [](const std::string& p) { return Exists(p); });
    });
    if (done) return absl::OkStatus();
    std::vector<std::string> missing;
    for (size_t i = 0; i < keys.size(); ++i)
      if (!Exists(paths[i])) missing.push_back(keys[i]);
    return absl::DeadlineExceededError(absl::StrCat("store keys not set within ",
                                                    absl::FormatDuration(timeout), ": ",
                                                    absl::StrJoin(missing, ", ")));
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    FileLock lock(LockPath());
    if (!lock.status().ok()) return lock.status();
    std::string path = KeyPath(key);
    if (::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    return absl::UnavailableError(Errno(absl::StrCat("file store: cannot delete ", path)));
  }

 private:
  std::string KeyPath(const std::string& key) const {
    return absl::StrCat(dir_, "/", FileNameForKey(key));
  }
  std::string LockPath() const { return absl::StrCat(dir_, "/.lock"); }

  // Checks `ready` until it holds or `timeout` passes (at least once), backing off 1 -> 10 ms.
  static bool PollUntil(absl::Duration timeout, const std::function<bool()>& ready) {
    absl::Time deadline = absl::Now() + timeout;
    absl::Duration sleep = kFirstPoll;
    while (true) {
      if (ready()) return true;
      absl::Time now = absl::Now();
      if (now >= deadline) return false;
      absl::SleepFor(std::min(sleep, deadline - now));
      sleep = std::min(sleep * 2, kMaxPoll);
    }
  }

  absl::Status WriteAtomically(const std::string& path, const std::string& value) {
    static std::atomic<uint64_t> counter{0};
    std::string tmp = absl::StrCat(dir_, "/.tmp-", ::getpid(), "-",
                                   std::hash<std::thread::id>()(std::this_thread::get_id()), "-",
                                   counter.fetch_add(1));
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      return absl::UnavailableError(Errno(absl::StrCat("file store: cannot create ", tmp)));
    size_t done = 0;
    while (done < value.size()) {
      ssize_t n = ::write(fd, value.data() + done, value.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        absl::Status s =
            absl::UnavailableError(Errno(absl::StrCat("file store: cannot write ", tmp)));
        ::close(fd);
        ::unlink(tmp.c_str());
        return s;
      }
      done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
      absl::Status s =
          absl::UnavailableError(Errno(absl::StrCat("file store: cannot publish ", path)));
      ::unlink(tmp.c_str());
      return s;
    }
    return absl::OkStatus();
  }

  const std::string dir_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Store>> CreateFileStore(const std::string& directory) {
  if (directory.empty()) return absl::InvalidArgumentError("file store: empty directory path");
  if (absl::Status s = MkdirP(directory); !s.ok()) return s;
  return std::shared_ptr<Store>(std::make_shared<FileStore>(directory));
}

}  // namespace adaptcomm

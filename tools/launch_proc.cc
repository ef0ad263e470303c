#include "tools/launch_proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace adaptcomm::tools {

std::optional<FileStamp> StampOf(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileStamp{st.st_ino,
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

std::string ReadSmallFile(const std::string& path) {
  std::string text;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buffer[8192];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || text.size() > (1 << 16)) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

// Whether the process has a handler for `signo` (/proc/PID/status, SigCgt). A signal without a
// handler would kill it instead.
bool CatchesSignal(pid_t pid, int signo) {
  const std::string status = ReadSmallFile(absl::StrCat("/proc/", pid, "/status"));
  const size_t at = status.find("\nSigCgt:");
  if (at == std::string::npos) return false;
  const uint64_t caught = std::strtoull(status.c_str() + at + 8, nullptr, 16);
  return ((caught >> (signo - 1)) & 1) != 0;
}

// The processes that belong to one of `ranks` (rank pid = its process group, or the pid itself
// for a leader that moved) and catch `signo`, by rank pid. One pass over /proc.
std::map<pid_t, std::vector<pid_t>> RankProcessesCatching(const std::set<pid_t>& ranks, int signo) {
  std::map<pid_t, std::vector<pid_t>> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (const dirent* entry = readdir(proc)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid) || pid <= 0) continue;
    const std::string stat = ReadSmallFile(absl::StrCat("/proc/", pid, "/stat"));
    // "PID (COMMAND) STATE PPID PGRP ...": the command may hold spaces and parentheses.
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(absl::string_view(stat).substr(paren + 2), ' ');
    pid_t group = 0;
    if (fields.size() < 3 || !absl::SimpleAtoi(fields[2], &group)) continue;
    const pid_t owner = ranks.contains(group) ? group : ranks.contains(pid) ? pid : 0;
    if (owner != 0 && CatchesSignal(pid, signo)) found[owner].push_back(pid);
  }
  closedir(proc);
  return found;
}

// The flight records (flight.rank<R>.json) in `dir` written at or after `since`, by rank.
std::vector<int> FlightRecordRanks(const std::string& dir, time_t since) {
  std::vector<int> ranks;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ranks;
  while (const dirent* entry = readdir(d)) {
    absl::string_view name = entry->d_name;
    int rank = -1;
    if (!absl::ConsumePrefix(&name, "flight.rank") || !absl::ConsumeSuffix(&name, ".json") ||
        !absl::SimpleAtoi(name, &rank)) {
      continue;
    }
    struct stat st {};
    if (stat(absl::StrCat(dir, "/", entry->d_name).c_str(), &st) == 0 && st.st_mtime >= since) {
      ranks.push_back(rank);
    }
  }
  closedir(d);
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

// A fresh directory for this job's flight records: ${TMPDIR:-/tmp}/adaptcomm-flight-<time>-XXXXXX.
std::optional<std::string> MakeJobFlightDir() {
  const char* tmp = getenv("TMPDIR");
  const time_t now = time(nullptr);
  tm parts{};
  localtime_r(&now, &parts);
  char stamp[32];
  strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &parts);
  std::string path = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                  "/adaptcomm-flight-", stamp, "-XXXXXX");
  if (mkdtemp(path.data()) == nullptr) return std::nullopt;
  return path;
}

}  // namespace adaptcomm::tools

// What `adaptcomm launch` reads of the system while it ends a job: which rank processes catch a
// signal (/proc), which flight records appeared, and the per-job flight-record directory.
#ifndef ADAPTCOMM_TOOLS_LAUNCH_PROC_H_
#define ADAPTCOMM_TOOLS_LAUNCH_PROC_H_

#include <sys/types.h>

#include <cstdint>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace adaptcomm::tools {

// A file's identity and modification time: a rewritten flight record has a new stamp.
struct FileStamp {
  ino_t inode = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};
std::optional<FileStamp> StampOf(const std::string& path);

// Up to 64 KiB of a small file (/proc entries); empty when it cannot be read.
std::string ReadSmallFile(const std::string& path);

// Whether the process has a handler for `signo` (/proc/PID/status, SigCgt). A signal without a
// handler would kill it instead.
bool CatchesSignal(pid_t pid, int signo);

// The processes that belong to one of `ranks` (rank pid = its process group, or the pid itself
// for a leader that moved) and catch `signo`, by rank pid. One pass over /proc.
std::map<pid_t, std::vector<pid_t>> RankProcessesCatching(const std::set<pid_t>& ranks, int signo);

// The flight records (flight.rank<R>.json) in `dir` written at or after `since`, by rank.
std::vector<int> FlightRecordRanks(const std::string& dir, time_t since);

// A fresh directory for this job's flight records: ${TMPDIR:-/tmp}/adaptcomm-flight-<time>-XXXXXX.
std::optional<std::string> MakeJobFlightDir();

}  // namespace adaptcomm::tools

#endif  // ADAPTCOMM_TOOLS_LAUNCH_PROC_H_

#include "lib/base/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"

namespace adaptcomm::log {
namespace {

std::atomic<int> g_process_rank{-1};
thread_local int t_thread_rank = -2;  // -2: use the process rank

Level LevelFromEnv() {
  const char* env = std::getenv("ADAPTCOMM_LOG_LEVEL");
  if (env == nullptr) return Level::kInfo;
  std::string v = absl::AsciiStrToLower(env);
  if (v == "debug" || v == "trace") return Level::kDebug;
  if (v == "info") return Level::kInfo;
  if (v == "warning" || v == "warn") return Level::kWarning;
  if (v == "error") return Level::kError;
  if (v == "off" || v == "none") return Level::kOff;
  std::fprintf(
      stderr,
      "[adaptcomm] ADAPTCOMM_LOG_LEVEL=%s is not one of debug|info|warning|error|off; using info\n",
      env);
  return Level::kInfo;
}

Level ActiveLevel() {
  static const Level level = LevelFromEnv();
  return level;
}

class Sink {
 public:
  void Write(int rank, std::string_view line) {
    absl::MutexLock lock(&mu_);
    std::FILE* out = OpenLocked(rank);
    std::fwrite(line.data(), 1, line.size(), out);
    std::fflush(out);
  }
  void Flush() {
    absl::MutexLock lock(&mu_);
    if (file_ != nullptr) std::fflush(file_);
    std::fflush(stderr);
  }

 private:
  std::FILE* OpenLocked(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const char* pattern = std::getenv("ADAPTCOMM_LOG_FILE");
    if (pattern == nullptr || *pattern == '\0') return stderr;
    std::string rank_text = rank >= 0 ? std::to_string(rank) : std::string("unknown");
    std::string path = absl::StrReplaceAll(pattern, {{"%r", rank_text}});
    if (file_ != nullptr && path == path_) return file_;
    if (file_ != nullptr) std::fclose(file_);
    file_ = std::fopen(path.c_str(), "a");
    path_ = path;
    if (file_ == nullptr) {
      std::fprintf(stderr, "[adaptcomm] cannot open ADAPTCOMM_LOG_FILE %s; logging to stderr\n",
                   path.c_str());
      return stderr;
    }
    return file_;
  }

  absl::Mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string path_ ABSL_GUARDED_BY(mu_);
};

Sink& TheSink() {
  static Sink* sink = new Sink();  // never destroyed: logging may happen during exit
  return *sink;
}

char LevelLetter(Level level) {
  switch (level) {
    case Level::kDebug:
      return 'D';
    case Level::kInfo:
      return 'I';
    case Level::kWarning:
      return 'W';
    case Level::kError:
      return 'E';
    case Level::kOff:
      break;
  }
  return '?';
}

}  // namespace

bool Enabled(Level level) { return level != Level::kOff && level >= ActiveLevel(); }

void Write(Level level, const std::string& message) {
  int rank = t_thread_rank != -2 ? t_thread_rank : g_process_rank.load(std::memory_order_relaxed);
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm parts;
  localtime_r(&tv.tv_sec, &parts);
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "%02d:%02d:%02d.%03d", parts.tm_hour, parts.tm_min,
                parts.tm_sec, static_cast<int>(tv.tv_usec / 1000));
  std::string rank_text = rank >= 0 ? absl::StrCat("r", rank) : std::string("r?");
  std::string line = absl::StrCat("[adaptcomm ", rank_text, " ", std::string(1, LevelLetter(level)),
                                  " ", stamp, "] ", message);
  if (line.empty() || line.back() != '\n') line.push_back('\n');
  TheSink().Write(rank, line);
}

void SetProcessRank(int rank) {
  if (t_thread_rank != -2) return;  // a rank run as a thread: see log.h
  g_process_rank.store(rank, std::memory_order_relaxed);
}
void Flush() { TheSink().Flush(); }

ScopedThreadRank::ScopedThreadRank(int rank) : previous_(t_thread_rank) { t_thread_rank = rank; }
ScopedThreadRank::~ScopedThreadRank() { t_thread_rank = previous_; }

}  // namespace adaptcomm::log

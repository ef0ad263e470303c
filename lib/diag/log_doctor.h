// `adaptcomm doctor`: classifies the lines of trainer logs with the knowledge base and aggregates
// them by cause, origin (rank) and peer address. Streaming: memory is bounded by the number of
// causes and the caps below, never by the size of the logs.
#ifndef ADAPTCOMM_LIB_DIAG_LOG_DOCTOR_H_
#define ADAPTCOMM_LIB_DIAG_LOG_DOCTOR_H_

#include <cstdint>
#include <istream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "lib/diag/kb_similarity.h"
#include "lib/diag/knowledge_base.h"

namespace adaptcomm::diag {

// Caps that keep a report (and memory) bounded whatever the log holds.
inline constexpr size_t kMaxLineBytes = 64 << 10;  // longer lines are truncated
// Only a line's head is classified: signatures sit near the start, and libstdc++'s recursive
// std::regex can exhaust the stack on `.*` over very long input.
inline constexpr size_t kMaxMatchBytes = 4096;
inline constexpr size_t kMaxOriginsPerCause = 1024;
inline constexpr size_t kMaxPeersPerCause = 32;
inline constexpr size_t kMaxUnclassified = 5;
inline constexpr size_t kMaxExampleBytes = 400;
inline constexpr size_t kMaxResemblanceCache = 4096;

struct CauseSummary {
  const KbEntry* entry = nullptr;
  uint64_t lines = 0;
  // "rank 3" (the trainer's rank), "node1 gpu3" (NCCL's host:pid:tid [dev] prefix: a CUDA
  // device, the local rank in one-process-per-GPU jobs) or "unknown" -> matching lines.
  std::map<std::string, uint64_t> origins;
  uint64_t origins_dropped = 0;           // lines whose origin did not fit under the cap
  std::map<std::string, uint64_t> peers;  // "10.0.0.2:4711" -> lines naming it
  uint64_t peers_dropped = 0;
  // With culprit_group: the ranks the lines name as at fault ("rank 1" -> lines), which is not
  // the origin (rank 0 reports that rank 1 never reached the monitored barrier).
  std::map<std::string, uint64_t> culprits;
  uint64_t culprits_dropped = 0;
  std::string first_example;   // the first matching line, truncated
  std::string first_location;  // "file:line"
  uint64_t first_order = 0;    // index of the first matching line over all files read
  // With seq_group: the lowest sequence number seen per origin and the origin that is furthest
  // behind (lowest of all).
  std::map<std::string, uint64_t> lowest_seq;
  std::string behind_origin;
};

// Error lines that no signature matches but that resemble one family (kb_similarity.h): a likely
// cause, to be confirmed by reading them.
struct ResemblanceSummary {
  std::string family;                // the family's id (the entry's id without families)
  std::string family_title;          // "InfiniBand / RoCE / SHARP" ("" without families)
  const KbEntry* closest = nullptr;  // the entry of the best-scoring example
  double score = 0;                  // the best similarity over the lines
  std::vector<std::string> shared;   // the words the best line shares with that example
  uint64_t lines = 0;
  std::string first_example;   // truncated
  std::string first_location;  // "file:line"
};

struct DoctorReport {
  uint64_t files = 0;
  uint64_t lines = 0;
  uint64_t classified_lines = 0;
  uint64_t truncated_lines = 0;
  // Root causes first, then symptoms; within each, the most frequent first.
  std::vector<CauseSummary> causes;
  // Lines that look like errors (LooksLikeError, or a Python traceback whose exception line is
  // not one) that no entry explains. A log with only these is not clean: it failed in a way the
  // knowledge base does not know.
  uint64_t unclassified_errors = 0;
  // The NCCL WARN lines among them (the article's `grep NCCL | grep -v INFO` residue).
  uint64_t unclassified_warnings = 0;
  std::vector<std::string> unclassified_examples;  // the first kMaxUnclassified, "file:line: text"
  // The unclassified error lines that resemble a family, by family, the most lines first (at
  // most one per family: bounded by the knowledge base).
  std::vector<ResemblanceSummary> resemblances;
};

// What a report says about the run, and `adaptcomm doctor`'s exit code for it.
enum class DoctorVerdict {
  kClean = 0,               // no known failure signature and no error line
  kKnownFailure = 1,        // at least one cause found (unexplained error lines may remain)
  kUnrecognizedErrors = 3,  // error lines, none known or like a known one: a failure it cannot name
  kResemblesKnownFamily = 4,  // no known cause, but error lines resemble a family: a likely cause
};
inline constexpr int kDoctorExitUnreadable = 2;  // a log or the knowledge base could not be read
DoctorVerdict Verdict(const DoctorReport& report);
int DoctorExitCode(const DoctorReport& report);
// "clean", "known_failure", "unrecognized_errors", "resembles_known_family"
std::string VerdictName(DoctorVerdict verdict);

// Whether a line no entry explains reports an error: it says error/Error/ERROR, failed/Failed/
// FAILED, FATAL/Fatal, Exception, NCCL WARN or Segmentation fault - unless it is one of the lines
// healthy runs print with such words (NCCL INFO lines such as "dlerror=libnccl-net.so", Python
// `File "...", line N` frames, C++ `frame #N:` frames, "Exception raised from ...").
bool LooksLikeError(const std::string& line);

// The origin of a line ("rank 3", "node1 gpu3"), "" if it names none.
std::string ExtractOrigin(const std::string& line);
// IPv4 peers a line names, as "a.b.c.d:port" (from "a.b.c.d:port", NCCL's "a.b.c.d<port>",
// Gloo's "[a.b.c.d]:port" and c10d's "(a.b.c.d, port)").
std::vector<std::string> ExtractPeers(const std::string& line);
// The ranks a line names as at fault through the entry's culprit_group ("rank 1", "rank 3" for
// "Ranks 1, 3 failed to pass monitoredBarrier"); empty without one or without a match.
std::vector<std::string> ExtractCulprits(const KbEntry& entry, const std::string& line);

class LogDoctor {
 public:
  explicit LogDoctor(const KnowledgeBase& kb) : kb_(kb) {}

  // One line without its newline; `location` is "file:line" for the report.
  void FeedLine(const std::string& line, const std::string& file, uint64_t line_number);
  // Reads line by line with a fixed buffer; "-" reads standard input.
  [[nodiscard]] absl::Status FeedFile(const std::string& path);
  void FeedStream(std::istream& in, const std::string& name);

  DoctorReport Report() const;

 private:
  void Count(std::map<std::string, uint64_t>& map, uint64_t& dropped, size_t cap,
             const std::string& key);
  static void CountUnclassified(DoctorReport& totals, const std::string& example, bool warning);
  void FlushPendingTraceback();

  const KnowledgeBase& kb_;
  void NoteResemblance(const std::string& line, const std::string& location);

  std::map<const KbEntry*, CauseSummary> causes_;
  std::map<std::string, ResemblanceSummary> resemblances_;  // by family
  // Words compared -> result: a log repeats one unknown error with other numbers and hosts
  // thousands of times, and only the first kMaxResemblanceCache shapes are remembered.
  std::unordered_map<std::string, std::optional<Resemblance>> resemblance_cache_;
  DoctorReport totals_;
  // "file:line: Traceback (most recent call last):" until the traceback's exception line shows
  // whether it is explained (classified) or itself an error line; a traceback ending in neither
  // (KeyboardInterrupt, SystemExit) counts as one unclassified error.
  std::string pending_traceback_;
};

// The text report: top causes with origins, peers, fix and link. `max_causes` limits the list.
std::string RenderDoctorText(const DoctorReport& report,
                             size_t max_causes = std::numeric_limits<size_t>::max());
std::string RenderDoctorJson(const DoctorReport& report);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_LOG_DOCTOR_H_

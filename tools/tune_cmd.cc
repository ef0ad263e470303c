// `adaptcomm tune` (issue #15): measures the host backends' knobs per message-size band and writes
// the winners to a tuned table (lib/config/tuned_table.h) keyed by this topology's fingerprint.
// A job loads it through the profile's `tuning: {table: PATH}` or ADAPTCOMM_TUNED_TABLE.
//
// Ranks are forked processes on this host (--ranks N), as a launched job's are, sharing a file
// store in a temporary directory. Every candidate is a one-band-per-knob tuned table loaded by a
// communicator of its own exactly as a job loads the final table (ADAPTCOMM_TUNED_TABLE); all of
// them live at once, and each round times every candidate once, in a shuffled order. The first
// run of every candidate and size is checked element by element on every rank.
//
// Deciding, on speedups paired round by round (static time / candidate time, both measured in
// the same round, so a load change on this shared machine cancels out), against the noise of an
// A/A control (a second static communicator timed in the same rounds, lib/diag/paired_speedup.h):
// a candidate replaces the static value in a band only when its median speedup exceeds
// 1 + --threshold percent AND the control's 75th percentile, AND its 25th percentile exceeds 1
// (faster in three rounds of four); otherwise the band keeps the static value.
// Exit codes: 0 ok, 1 a rank failed or a result was wrong, 2 bad arguments.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "lib/base/byte_text.h"
#include "lib/base/cpu_binding.h"
#include "lib/config/tuned_table.h"
#include "lib/config/tuning.h"
#include "lib/core/selection/backend_selection.h"
#include "lib/diag/collective_timing.h"
#include "lib/diag/paired_speedup.h"
#include "nlohmann/json.hpp"
#include "tools/subcommands.h"
#include "tools/tune_plan.h"

namespace adaptcomm::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Ops per timed sample: about 20 ms of them, at most 200 and at most 8 MiB of data; `op_us` is
// one op's time. Enough ops to average the scheduling noise of millisecond Gloo ops (at 2 ms a
// sample was a single 4 KiB Gloo op, whose A/A control spanned [0.36, 2.72] and hid bcube's 1.4-2x
// there), few enough that a round of all candidates sees one machine load. Microsecond shm ops
// reach the 200 or the 8 MiB first.
int32_t OpsPerSample(uint64_t bytes, double op_us) {
  const double by_time = op_us > 0 ? 20000.0 / op_us : 200;
  const double by_bytes = static_cast<double>((8 * kMiB) / bytes);
  return static_cast<int32_t>(std::clamp(std::min(by_time, by_bytes), 1.0, 200.0));
}
int Rounds(const TuneArgs& a, uint64_t bytes) {
  if (a.rounds > 0) return a.rounds;
  return bytes <= 4 * kMiB ? 31 : bytes <= 64 * kMiB ? 11 : 7;
}

// Candidate `c` as a tuned table of one band per knob reaching over every size: a candidate is
// measured on a communicator that loads it exactly as a job loads the final table.
config::TunedTable CandidateTable(const Plan& p, const Candidate& c,
                                  const config::TopologyFingerprint& fp) {
  config::TunedTable t;
  t.fingerprint = fp;
  for (const std::string& op : p.backend == "shm" ? std::vector<std::string>{"allreduce", "reduce"}
                                                  : std::vector<std::string>{"allreduce"}) {
    for (const auto& [knob, v] : c.knobs) {
      const config::TunedKnobSpec* spec = config::FindTunedKnob(p.backend, knob);
      config::TunedEntry e;
      e.backend = p.backend;
      e.op = op;
      e.knob = knob;
      e.max_bytes = config::kTunedMaxBytesUnbounded;
      e.number = v;
      e.value = spec->type == config::KnobType::kChoice ? spec->choices[static_cast<size_t>(v)]
                                                        : absl::StrCat(v);
      t.entries.push_back(std::move(e));
    }
  }
  return t;
}

Work Issue(Communicator& comm, const std::string& op, TensorView v) {
  if (op == "reduce") return comm.Reduce(v);
  return comm.Allreduce(v);
}

// Runs `op` once on data (rank+1) + (i % 7) and checks every element of the result (the root's,
// for reduce); leaves the buffer zeroed, so the timed runs add zeros (no overflow, no denormals).
absl::Status CheckedRun(Communicator& comm, const std::string& op, std::vector<float>& buf,
                        size_t count, const std::string& what) {
  const int n = comm.size();
  for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(comm.rank() + 1 + i % 7);
  if (absl::Status s = Issue(comm, op, HostView(buf.data(), count)).Wait(); !s.ok()) return s;
  if (op == "allreduce" || comm.rank() == 0) {
    for (size_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
      if (buf[i] != want) {
        return absl::DataLossError(absl::StrFormat("%s: element %zu is %g, expected %g on rank %d",
                                                   what, i, buf[i], want, comm.rank()));
      }
    }
  }
  std::fill(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(count), 0.0f);
  return absl::OkStatus();
}

// samples[op][size][candidate]: microseconds per op, rank 0's clock.
using Samples = std::map<std::string, std::map<uint64_t, std::map<size_t, std::vector<double>>>>;

// Every rank runs the same sequence; rank 0 records. `comms[i]` runs candidate i (or, in the
// comparison, [0] static and [1] tuned). `parts`: the rounds are split over that many calls
// (each with the communicators created in another order), this one runs its share.
absl::Status Measure(const TuneArgs& a, const Plan& p, std::vector<Communicator*> comms,
                     const std::function<std::vector<size_t>(uint64_t)>& which, Samples* out,
                     int parts = 1) {
  const uint64_t largest = p.sizes.back();
  std::vector<float> buf(largest / sizeof(float));
  for (const std::string& op : p.ops) {
    for (uint64_t bytes : p.sizes) {
      const size_t count = bytes / sizeof(float);
      const std::vector<size_t> ids = which(bytes);
      double warm_us = 0;  // the static candidate's warm-up op, rank 0's clock
      for (size_t id : ids) {
        const std::string what =
            absl::StrCat(op, " ", CompactByteSizeText(bytes), " candidate ", id);
        if (absl::Status s = CheckedRun(*comms[id], op, buf, count, what); !s.ok()) return s;
        const auto start = Clock::now();
        if (absl::Status s = Issue(*comms[id], op, HostView(buf.data(), count)).Wait(); !s.ok()) {
          return s;
        }
        if (id == ids[0]) {
          warm_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
        }
      }
      // Every rank takes rank 0's count of ops per sample.
      int32_t k = OpsPerSample(bytes, warm_us);
      if (absl::Status s = comms[ids[0]]->Broadcast(HostView(&k, 1)).Wait(); !s.ok()) return s;
      const int rounds = (Rounds(a, bytes) + parts - 1) / parts;
      // Each round in its own order, the same on every rank (a fixed seed): no candidate always
      // follows the same one, whose lingering work (spinning waiters, cache contents) would
      // bias it.
      std::mt19937 order_rng(static_cast<uint32_t>(bytes));
      std::vector<size_t> order = ids;
      for (int r = 0; r < rounds; ++r) {
        std::shuffle(order.begin(), order.end(), order_rng);
        for (size_t id : order) {
          Communicator& comm = *comms[id];
          if (absl::Status s = comm.Barrier().Wait(); !s.ok()) return s;
          const auto start = Clock::now();
          for (int i = 0; i < k; ++i) {
            if (absl::Status s = Issue(comm, op, HostView(buf.data(), count)).Wait(); !s.ok()) {
              return s;
            }
          }
          const double us =
              std::chrono::duration<double, std::micro>(Clock::now() - start).count() / k;
          if (out != nullptr) (*out)[op][bytes][id].push_back(us);
        }
      }
    }
  }
  return absl::OkStatus();
}

// Samples as text: one line per op, size and candidate ("allreduce 4096 0 12.5 13.1 ...").
std::string SamplesText(const Samples& samples) {
  std::string out;
  for (const auto& [op, sizes] : samples) {
    for (const auto& [bytes, per] : sizes) {
      for (const auto& [id, us] : per) {
        absl::StrAppend(&out, op, " ", bytes, " ", id);
        for (double u : us) absl::StrAppendFormat(&out, " %.17g", u);
        out += "\n";
      }
    }
  }
  return out;
}

Samples ParseSamples(const std::string& text) {
  Samples samples;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 3) continue;
    std::vector<double>& us = samples[f[0]][std::strtoull(f[1].c_str(), nullptr, 10)]
                                     [std::strtoul(f[2].c_str(), nullptr, 10)];
    for (size_t i = 3; i < f.size(); ++i) us.push_back(std::strtod(f[i].c_str(), nullptr));
  }
  return samples;
}

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs body(rank, store) in `n` forked processes, as a launched job's ranks run (on the CPUs
// `bind_to` gives them), sharing a file store in `dir` (a fresh directory); each writes its status
// to dir/status.<rank>. The first failure wins. A rank's waits are all bounded by --timeout, so
// every child ends.
absl::Status OnRanks(int n, const std::string& bind_to, const std::string& dir,
                     const std::function<absl::Status(int, std::shared_ptr<Store>)>& body) {
  absl::StatusOr<CpuBindMode> mode = ParseCpuBindMode(bind_to);
  if (!mode.ok()) return mode.status();
  const std::vector<std::vector<int>> cores = AllowedCores();
  std::vector<std::vector<int>> rank_cpus;
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<std::vector<int>> cpus = CpusForLocalRank(cores, *mode, r, n);
    if (!cpus.ok()) return cpus.status();
    rank_cpus.push_back(*std::move(cpus));
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> children;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    if (pid == 0) {
      absl::Status st = rank_cpus[static_cast<size_t>(r)].empty()
                            ? absl::OkStatus()
                            : BindCallingThread(rank_cpus[static_cast<size_t>(r)]);
      absl::StatusOr<std::shared_ptr<Store>> store = CreateFileStore(dir + "/store");
      if (st.ok()) st = store.ok() ? body(r, *store) : store.status();
      std::ofstream(absl::StrCat(dir, "/status.", r)) << (st.ok() ? "ok" : st.ToString());
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(st.ok() ? 0 : 1);
    }
    children.push_back(pid);
  }
  absl::Status first;
  for (int r = 0; r < n; ++r) {
    int wstatus = 0;
    waitpid(children[r], &wstatus, 0);
    if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) continue;
    std::string why = ReadWhole(absl::StrCat(dir, "/status.", r));
    if (why.empty()) why = absl::StrCat("exited with status ", wstatus);
    if (first.ok()) first = absl::InternalError(absl::StrCat("rank ", r, ": ", why));
  }
  return first;
}

CommunicatorOptions RankOptions(const TuneArgs& a, int rank, std::shared_ptr<Store> store,
                                const std::string& name) {
  CommunicatorOptions o;
  o.rank = rank;
  o.world_size = a.ranks;
  o.store = std::move(store);
  o.master_addr = "127.0.0.1";
  o.name = name;
  o.timeout = absl::Seconds(a.timeout_s);
  o.init_timeout = absl::Seconds(a.timeout_s);
  o.backend = a.backend == "shm" ? BackendChoice::kShm : BackendChoice::kGloo;
  o.fallback = Fallback::kDeny;
  return o;
}

// One communicator per entry of `tables` (a tuned table's path, loaded through
// ADAPTCOMM_TUNED_TABLE as a job loads it; empty: the static profile), measured twice: created in
// order, then in reverse. Where a communicator stands in the creation order changed its small ops'
// time whatever its settings (up to 1.7x slower created second; the static one, created first
// among six, 2-6x slower at 4-64 KiB), so each order takes half of the rounds (`parts` = 2) or
// all of them (1). `explain`: set to the last table's communicator's Explain(). Rank 0 records.
absl::Status MeasureInBothCreationOrders(const TuneArgs& a, const Plan& p, int rank,
                                         const std::shared_ptr<Store>& store,
                                         const std::vector<std::string>& tables,
                                         const std::string& name,
                                         const std::function<std::vector<size_t>(uint64_t)>& which,
                                         int parts, Samples* out, std::string* explain) {
  const size_t n = tables.size();
  for (int half = 0; half < 2; ++half) {
    std::vector<std::unique_ptr<Communicator>> owned(n);
    for (size_t k = 0; k < n; ++k) {
      const size_t i = half == 0 ? k : n - 1 - k;
      if (tables[i].empty()) {
        unsetenv(config::kTunedTableEnv);
      } else {
        setenv(config::kTunedTableEnv, tables[i].c_str(), 1);
      }
      absl::StatusOr<std::unique_ptr<Communicator>> c =
          Communicator::Create(RankOptions(a, rank, store, absl::StrCat(name, half, "-", i)));
      if (!c.ok()) return c.status();
      owned[i] = *std::move(c);
    }
    unsetenv(config::kTunedTableEnv);
    std::vector<Communicator*> comms;
    for (const auto& c : owned) comms.push_back(c.get());
    if (absl::Status st = Measure(a, p, comms, which, rank == 0 ? out : nullptr, parts); !st.ok()) {
      return st;
    }
    if (explain != nullptr) *explain = owned.back()->Explain();
  }
  return absl::OkStatus();
}

struct Decision {
  std::string op;
  uint64_t bytes = 0;
  size_t winner = 0;  // candidate index; 0 = static kept
  size_t best = 0;    // the candidate with the highest median speedup (0: none measured)
  diag::TimingSummary stat, alt;
  diag::PairedSpeedup speedup;  // of the best candidate over the static one
  diag::PairedSpeedup control;  // of the A/A control over the static one: the noise
};

std::vector<Decision> Decide(const TuneArgs& a, const Plan& p, const Samples& s) {
  std::vector<Decision> out;
  for (const std::string& op : p.ops) {
    for (uint64_t bytes : p.sizes) {
      const auto& per = s.at(op).at(bytes);
      Decision d;
      d.op = op;
      d.bytes = bytes;
      d.stat = diag::Summarize(per.at(0));
      for (const auto& [id, samples] : per) {
        if (id == 0) continue;
        const diag::PairedSpeedup sp = diag::PairSpeedups(per.at(0), samples);
        if (p.candidates[id].control) {
          d.control = sp;
        } else if (d.best == 0 || sp.median > d.speedup.median) {
          d.best = id;
          d.speedup = sp;
        }
      }
      if (d.best != 0) {
        d.alt = diag::Summarize(per.at(d.best));
        if (diag::FasterBeyondNoise(d.speedup, d.control, a.threshold_pct)) d.winner = d.best;
      }
      out.push_back(d);
    }
  }
  return out;
}

std::string Today() {
  std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d", std::localtime(&now));
  return text;
}

config::TunedTable MakeTable(const TuneArgs& a, const Plan& p, const std::vector<Decision>& ds) {
  config::TunedTable t;
  t.description = absl::StrCat("adaptcomm tune ", Today(), ": ", a.ranks, " ranks, ", p.backend);
  t.fingerprint = internal::selection::CurrentFingerprint(p.backend, 1, a.ranks);
  const std::vector<std::string> knobs =
      p.backend == "shm" ? std::vector<std::string>{"flat_max_bytes", "chunk_bytes"}
                         : std::vector<std::string>{"algorithm", "max_segment_bytes"};
  for (const std::string& op : p.ops) {
    for (const std::string& knob : knobs) {
      const config::TunedKnobSpec* spec = config::FindTunedKnob(p.backend, knob);
      uint64_t previous = 0;
      for (size_t i = 0; i < ds.size(); ++i) {
        const Decision& d = ds[i];
        if (d.op != op) continue;
        const bool last = d.bytes == p.sizes.back();
        config::TunedEntry e;
        e.backend = p.backend;
        e.op = op;
        e.knob = knob;
        e.min_bytes = previous;
        e.max_bytes = last ? config::kTunedMaxBytesUnbounded : d.bytes;
        previous = d.bytes;
        const Candidate& c = p.candidates[d.winner];
        int64_t v = c.knobs.at(knob);
        // A flat winner covers its band: the flat bound is the band's top (at most a slot half).
        if (knob == "flat_max_bytes" && v > 0 && !c.is_static) {
          v = static_cast<int64_t>(std::min<uint64_t>(d.bytes, ShmSlotHalf()));
        }
        e.number = v;
        e.value = spec->type == config::KnobType::kChoice ? spec->choices[static_cast<size_t>(v)]
                                                          : absl::StrCat(v);
        const Candidate& best = p.candidates[d.best];
        e.source =
            d.winner != 0
                ? absl::StrFormat(
                      "adaptcomm tune %s at %s: %s %.1f us vs static %.1f us, "
                      "speedup %.2f [%.2f, %.2f], A/A [%.2f, %.2f]",
                      Today(), CompactByteSizeText(d.bytes), c.name, d.alt.median, d.stat.median,
                      d.speedup.median, d.speedup.p25, d.speedup.p75, d.control.p25, d.control.p75)
                : absl::StrFormat(
                      "adaptcomm tune %s at %s: static %.1f us kept (best %s %.1f us, "
                      "speedup %.2f [%.2f, %.2f], A/A [%.2f, %.2f], within noise)",
                      Today(), CompactByteSizeText(d.bytes), d.stat.median,
                      d.best == 0 ? "none" : best.name, d.alt.median, d.speedup.median,
                      d.speedup.p25, d.speedup.p75, d.control.p25, d.control.p75);
        t.entries.push_back(std::move(e));
      }
    }
  }
  return t;
}

struct CompareRow {
  std::string op;
  uint64_t bytes;
  double static_us, tuned_us;
  double speedup = 0, speedup_p25 = 0, speedup_p75 = 0;  // paired, round by round
};

int Fail(const TuneArgs& a, int code, const std::string& message) {
  std::fprintf(stderr, "tune: %s\n", message.c_str());
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"ok", false}, {"error", message}}.dump(2).c_str());
  }
  return code;
}

// The ranks' binding: --bind-to, except that `auto` leaves Gloo ranks unbound where it would give
// each a single CPU. Gloo's threads (the caller's, the executor's worker, its tcp event loop) would
// take turns on that CPU at every op, a slowdown that the rank's selection reason warns of and
// that a job launched as it advises (`--bind-to none`) does not have: the table would be tuned on
// it.
std::string RanksBindTo(const TuneArgs& a) {
  if (a.bind_to != "auto" || a.backend != "gloo") return a.bind_to;
  // The last rank gets the fewest CPUs (CpusForLocalRank gives the first ones the rest).
  absl::StatusOr<std::vector<int>> fewest =
      CpusForLocalRank(AllowedCores(), CpuBindMode::kAuto, a.ranks - 1, a.ranks);
  if (!fewest.ok() || fewest->size() != 1) return a.bind_to;
  std::fprintf(stderr,
               "tune: gloo ranks left unbound (--bind-to auto would give each one CPU, where "
               "gloo's threads take turns at every op; --bind-to core binds them anyway)\n");
  return "none";
}

// What a run found, for the report.
struct TuneOutcome {
  std::vector<Decision> decisions;
  config::TunedTable table;
  double tune_s = 0;
  std::vector<CompareRow> compare;  // --compare
  std::string explain;              // --compare: the tuned communicator's Explain()
  double total_s = 0;
};

// Tuning: every candidate a communicator of its own, all measured round by round; rank 0's
// samples are left in <dir>/tune/samples.
absl::Status MeasureCandidates(const TuneArgs& a, const Plan& p, const std::string& bind_to,
                               const std::string& dir) {
  const config::TopologyFingerprint here =
      internal::selection::CurrentFingerprint(p.backend, 1, a.ranks);
  for (size_t i = 0; i < p.candidates.size(); ++i) {
    std::ofstream(absl::StrCat(dir, "/candidate", i, ".yaml"))
        << config::FormatTunedTable(CandidateTable(p, p.candidates[i], here));
  }
  return OnRanks(
      a.ranks, bind_to, absl::StrCat(dir, "/tune"),
      [&](int rank, std::shared_ptr<Store> store) -> absl::Status {
        std::vector<std::string> tables;
        for (size_t i = 0; i < p.candidates.size(); ++i) {
          tables.push_back(p.candidates[i].is_static ? std::string()
                                                     : absl::StrCat(dir, "/candidate", i, ".yaml"));
        }
        Samples mine;
        absl::Status st = MeasureInBothCreationOrders(
            a, p, rank, store, tables, "tune", [&](uint64_t bytes) { return Distinct(p, bytes); },
            /*parts=*/2, &mine, nullptr);
        if (st.ok() && rank == 0) std::ofstream(dir + "/tune/samples") << SamplesText(mine);
        return st;
      });
}

// Comparison: the static profile vs the table loaded at communicator creation.
absl::Status CompareWithStatic(const TuneArgs& a, const Plan& p, const std::string& bind_to,
                               const std::string& dir, TuneOutcome& out) {
  // Both communicators are created the way a job creates one: the static one without the
  // table, the tuned one with ADAPTCOMM_TUNED_TABLE set (in the rank's own process); all the
  // rounds in each creation order.
  absl::Status st = OnRanks(a.ranks, bind_to, absl::StrCat(dir, "/compare"),
                            [&](int rank, std::shared_ptr<Store> store) -> absl::Status {
                              Samples mine;
                              std::string tuned_explain;
                              absl::Status st = MeasureInBothCreationOrders(
                                  a, p, rank, store, {std::string(), a.out}, "compare",
                                  [](uint64_t) {
                                    return std::vector<size_t>{0, 1};
                                  },
                                  /*parts=*/1, &mine, &tuned_explain);
                              if (st.ok() && rank == 0) {
                                std::ofstream(dir + "/compare/samples") << SamplesText(mine);
                                std::ofstream(dir + "/compare/explain") << tuned_explain;
                              }
                              return st;
                            });
  if (!st.ok()) return st;
  Samples cs = ParseSamples(ReadWhole(dir + "/compare/samples"));
  out.explain = ReadWhole(dir + "/compare/explain");
  for (const std::string& op : p.ops) {
    for (uint64_t bytes : p.sizes) {
      const diag::PairedSpeedup sp = diag::PairSpeedups(cs[op][bytes][0], cs[op][bytes][1]);
      out.compare.push_back({op, bytes, diag::Median(cs[op][bytes][0]),
                             diag::Median(cs[op][bytes][1]), sp.median, sp.p25, sp.p75});
    }
  }
  return absl::OkStatus();
}

void PrintTuneJson(const TuneArgs& a, const Plan& p, const TuneOutcome& out) {
  nlohmann::json j;
  j["ok"] = true;
  j["ranks"] = a.ranks;
  j["backend"] = p.backend;
  j["table"] = a.out;
  j["fingerprint"] = out.table.fingerprint.Describe();
  j["threshold_pct"] = a.threshold_pct;
  j["tune_seconds"] = out.tune_s;
  j["bands"] = nlohmann::json::array();
  for (const Decision& d : out.decisions) {
    std::vector<std::string> measured;
    for (size_t id : Distinct(p, d.bytes)) measured.push_back(p.candidates[id].name);
    j["bands"].push_back({{"op", d.op},
                          {"bytes", d.bytes},
                          {"static_median_us", d.stat.median},
                          {"best", d.best == 0 ? "" : p.candidates[d.best].name},
                          {"best_median_us", d.alt.median},
                          {"speedup_median", d.speedup.median},
                          {"speedup_p25", d.speedup.p25},
                          {"speedup_p75", d.speedup.p75},
                          {"aa_median", d.control.median},
                          {"aa_p25", d.control.p25},
                          {"aa_p75", d.control.p75},
                          {"chosen", p.candidates[d.winner].name},
                          {"measured", measured}});
  }
  if (a.compare) {
    j["compare"] = nlohmann::json::array();
    for (const CompareRow& r : out.compare) {
      j["compare"].push_back({{"op", r.op},
                              {"bytes", r.bytes},
                              {"static_median_us", r.static_us},
                              {"tuned_median_us", r.tuned_us},
                              {"speedup", r.speedup},
                              {"speedup_p25", r.speedup_p25},
                              {"speedup_p75", r.speedup_p75}});
    }
    j["explain"] = out.explain;
  }
  j["seconds"] = out.total_s;
  std::printf("%s\n", j.dump(2).c_str());
}

void PrintTuneText(const TuneArgs& a, const Plan& p, const TuneOutcome& out) {
  std::printf("adaptcomm tune: %d ranks (processes), backend %s, fingerprint %s\n", a.ranks,
              p.backend.c_str(), out.table.fingerprint.Describe().c_str());
  std::printf("%-10s %8s %11s %-18s %11s %-21s  %-14s  %s\n", "op", "size", "static_us", "best",
              "best_us", "speedup [p25, p75]", "A/A [p25, p75]", "chosen");
  for (const Decision& d : out.decisions) {
    std::printf("%-10s %8s %11.1f %-18s %11.1f %5.2f [%5.2f, %5.2f]    [%5.2f, %5.2f]  %s\n",
                d.op.c_str(), CompactByteSizeText(d.bytes).c_str(), d.stat.median,
                d.best == 0 ? "-" : p.candidates[d.best].name.c_str(), d.alt.median,
                d.speedup.median, d.speedup.p25, d.speedup.p75, d.control.p25, d.control.p75,
                d.winner == 0 ? "static (within noise)" : p.candidates[d.winner].name.c_str());
  }
  std::printf("wrote %s (%zu entries) in %.1f s\n", a.out.c_str(), out.table.entries.size(),
              out.tune_s);
  if (a.compare) {
    std::printf("\ncompare, same run: static profile vs the table loaded at creation\n");
    std::printf("%-10s %8s %11s %11s  %s\n", "op", "size", "static_us", "tuned_us",
                "speedup [p25, p75]");
    for (const CompareRow& r : out.compare) {
      std::printf("%-10s %8s %11.1f %11.1f  %5.2f [%5.2f, %5.2f]\n", r.op.c_str(),
                  CompactByteSizeText(r.bytes).c_str(), r.static_us, r.tuned_us, r.speedup,
                  r.speedup_p25, r.speedup_p75);
    }
    std::printf("\n%s", out.explain.c_str());
    std::printf("total %.1f s\n", out.total_s);
  }
}

int RunTune(const TuneArgs& a) {
  const auto started = Clock::now();
  const std::string bind_to = RanksBindTo(a);
  ProfileRequest req;
  req.world_size = a.ranks;
  absl::StatusOr<EffectiveConfig> profile = ResolveProfile(req);
  if (!profile.ok()) return Fail(a, 2, std::string(profile.status().message()));
  absl::StatusOr<Plan> plan = MakePlan(a, *profile);
  if (!plan.ok()) return Fail(a, 2, std::string(plan.status().message()));
  const Plan& p = *plan;

  char dir_template[] = "/tmp/adaptcomm-tune-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return Fail(a, 1, "cannot create a temporary directory");
  const std::string dir = dir_template;
  if (absl::Status tuned = MeasureCandidates(a, p, bind_to, dir); !tuned.ok()) {
    return Fail(a, 1, tuned.ToString());
  }
  TuneOutcome out;
  const Samples samples = ParseSamples(ReadWhole(dir + "/tune/samples"));
  out.decisions = Decide(a, p, samples);
  out.table = MakeTable(a, p, out.decisions);
  const std::string text = config::FormatTunedTable(out.table);
  {
    std::ofstream f(a.out);
    f << text;
    if (!f.good()) return Fail(a, 1, absl::StrCat("cannot write ", a.out));
  }
  // What was written must read back for this topology, exactly as a job would load it.
  absl::StatusOr<config::TunedTable> back = config::LoadTunedTableFor(a.out, out.table.fingerprint);
  if (!back.ok())
    return Fail(a, 1, absl::StrCat("the written table does not load: ", back.status().ToString()));
  out.tune_s = std::chrono::duration<double>(Clock::now() - started).count();

  if (a.compare) {
    if (absl::Status st = CompareWithStatic(a, p, bind_to, dir, out); !st.ok()) {
      return Fail(a, 1, st.ToString());
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  out.total_s = std::chrono::duration<double>(Clock::now() - started).count();
  if (a.json) {
    PrintTuneJson(a, p, out);
  } else {
    PrintTuneText(a, p, out);
  }
  return 0;
}

std::function<int()> SetupTune(CLI::App& sub) {
  auto a = std::make_shared<TuneArgs>();
  sub.add_option("--ranks", a->ranks, "Ranks, as forked processes on this host")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  sub.add_option("--backend", a->backend, "shm or gloo")->capture_default_str();
  sub.add_option("--ops", a->ops, "Comma-separated: allreduce (shm also reduce)")
      ->capture_default_str();
  sub.add_option("--sizes", a->sizes,
                 "Comma-separated message sizes (KiB/MiB); each is the top of a band reaching "
                 "down to the previous size, the largest one's band reaches to any size")
      ->capture_default_str();
  sub.add_option("--out", a->out, "Where to write the tuned table")->capture_default_str();
  sub.add_option("--threshold", a->threshold_pct,
                 "Percent by which a candidate's median must beat the static one")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  sub.add_option("--rounds", a->rounds,
                 "Samples per candidate and size (default: 31 up to 4 MiB, 11 up to 64 MiB, 7)")
      ->check(CLI::Range(3, 1000));
  sub.add_flag(
      "--compare", a->compare,
      "Then time the static profile against the written table, loaded by a communicator "
      "as a job loads it (ADAPTCOMM_TUNED_TABLE), in the same run, and print its Explain()");
  sub.add_option("--timeout", a->timeout_s, "Bound of creation and of each operation, seconds")
      ->check(DurationSeconds(/*zero_allowed=*/false))
      ->capture_default_str();
  sub.add_option("--bind-to", a->bind_to,
                 "The ranks' CPUs, as `adaptcomm launch --bind-to`: core, none, or auto (core "
                 "when each rank can have a core of its own, but gloo ranks stay unbound where "
                 "that core would be their one CPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "core", "none"}));
  sub.add_flag("--json", a->json, "Machine-readable output");
  sub.footer(
      "Candidates (each applied to every size): shm: the static profile, flat exchange, "
      "two-phase with 64 KiB/256 KiB/1 MiB/4 MiB chunks; gloo: the static profile, the other "
      "algorithm, 1/4/16 MiB segments; and an A/A control, the static profile again on a "
      "communicator of its own, whose speedup over the static one is the noise. Candidates that "
      "behave alike at a size are measured once. Each round times every candidate once (in a "
      "shuffled order), half of the rounds with "
      "the candidates' communicators created in reverse order; a sample is the mean of about 20 ms "
      "of back-to-back ops (at most 200 ops and 8 MiB) after a barrier, on rank 0's clock. The "
      "first run of every candidate and "
      "size is checked element by element.\n"
      "Decision per band, on speedups paired round by round (static time / candidate time, both "
      "from the same round, so load changes cancel): a candidate replaces the static value only "
      "when its median speedup exceeds 1 + --threshold percent AND the A/A control's 75th "
      "percentile, AND its 25th percentile exceeds 1 (faster in three rounds of four); otherwise "
      "the band keeps the static value.\n"
      "Load the table with the profile's `tuning: {table: PATH}` or ADAPTCOMM_TUNED_TABLE; it "
      "applies only on this fingerprint (hosts, ranks per host, cores, backend, Gloo version).\n"
      "Exit code: 0 ok, 1 a rank failed or a result was wrong, 2 bad arguments.");
  return [a] { return RunTune(*a); };
}

}  // namespace

ADAPTCOMM_SUBCOMMAND(tune, "Measure the backends' knobs per size band and write a tuned table",
                     SetupTune);

}  // namespace adaptcomm::tools

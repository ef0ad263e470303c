// `adaptcomm tune` (issue #15): measures the host backends' knobs per message-size band and writes
// the winners to a tuned table (lib/config/tuned_table.h) keyed by this topology's fingerprint.
// A job loads it through the profile's `tuning: {table: PATH}` or ADAPTCOMM_TUNED_TABLE.
//
// Ranks are threads of this process (--ranks N, one host) sharing an in-process store. Every
// candidate is a backend of its own, built with the candidate's values for every size; all of
// them live at once, and each round times every candidate once (in rotated order), so a load
// change on this shared machine hits all candidates alike. The first run of every candidate and
// size is checked element by element on every rank.
//
// Deciding: a candidate replaces the static value in a band only when its median is more than
// --threshold percent below the static median AND the interquartile ranges do not overlap (the
// candidate's 75th percentile under the static 25th); otherwise the band keeps the static value.
// Exit codes: 0 ok, 1 a rank failed or a result was wrong, 2 bad arguments.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "lib/base/log.h"
#include "lib/config/tuned_table.h"
#include "lib/config/tuning.h"
#include "lib/config/units.h"
#include "lib/core/backend_selection.h"
#include "lib/diag/collective_timing.h"
#include "lib/gloo/gloo_backend.h"
#include "lib/shm/shm_backend.h"
#include "nlohmann/json.hpp"
#include "tools/subcommands.h"

namespace adaptcomm::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

struct TuneArgs {
  int ranks = 2;
  std::string backend = "shm";
  std::string ops = "allreduce";
  std::string sizes = "4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB,256MiB";
  std::string out = "tuned.yaml";
  double threshold_pct = 3.0;
  int rounds = 0;  // 0: by size
  bool compare = false;
  bool json = false;
  double timeout_s = 120;
};

// One point of the tuning space: a value for every knob of the backend, used for every size.
struct Candidate {
  std::string name;
  bool is_static = false;
  std::map<std::string, int64_t> knobs;  // TunedKnobSpec::knob -> value (choice: index)
};

struct Plan {
  std::string backend;  // "shm" or "gloo"
  std::vector<std::string> ops;
  std::vector<uint64_t> sizes;        // ascending
  std::vector<Candidate> candidates;  // [0] is the static profile
};

std::string Human(uint64_t b) {
  if (b >= kMiB && b % kMiB == 0) return absl::StrCat(b / kMiB, "MiB");
  if (b >= kKiB && b % kKiB == 0) return absl::StrCat(b / kKiB, "KiB");
  return absl::StrCat(b, "B");
}

// The shm slot half: the largest flat exchange and chunk (ShmBackendOptions::slot_bytes / 2).
uint64_t ShmSlotHalf() { return ShmBackendOptions{}.slot_bytes / 2; }

absl::StatusOr<Plan> MakePlan(const TuneArgs& a, const EffectiveConfig& profile) {
  Plan p;
  p.backend = a.backend;
  if (a.backend != "shm" && a.backend != "gloo") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend '", a.backend, "': tune measures shm or gloo"));
  }
  for (absl::string_view t : absl::StrSplit(a.ops, ',', absl::SkipWhitespace())) {
    const std::string op(absl::StripAsciiWhitespace(t));
    const bool known = op == "allreduce" || (op == "reduce" && a.backend == "shm");
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ops '", op, "': ", a.backend, " has tuned knobs for ",
                       a.backend == "shm" ? "allreduce and reduce" : "allreduce", " only"));
    }
    p.ops.push_back(op);
  }
  for (absl::string_view t : absl::StrSplit(a.sizes, ',', absl::SkipWhitespace())) {
    const std::string tok(absl::StripAsciiWhitespace(t));
    absl::StatusOr<uint64_t> b = config::ParseByteSize(tok);
    if (!b.ok() || *b < 4 || *b > (uint64_t{1} << 30) || *b % 4 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sizes '", tok, "': a multiple of 4 bytes from 4 B to 1 GiB"));
    }
    p.sizes.push_back(*b);
  }
  std::sort(p.sizes.begin(), p.sizes.end());
  p.sizes.erase(std::unique(p.sizes.begin(), p.sizes.end()), p.sizes.end());
  if (p.ops.empty() || p.sizes.empty()) {
    return absl::InvalidArgumentError("--ops and --sizes must name at least one each");
  }
  if (a.backend == "shm") {
    const ShmBackendOptions d;
    p.candidates.push_back({"static",
                            true,
                            {{"flat_max_bytes", static_cast<int64_t>(d.flat_max_bytes)},
                             {"chunk_bytes", static_cast<int64_t>(d.chunk_bytes)}}});
    p.candidates.push_back({"flat",
                            false,
                            {{"flat_max_bytes", static_cast<int64_t>(ShmSlotHalf())},
                             {"chunk_bytes", static_cast<int64_t>(d.chunk_bytes)}}});
    for (uint64_t chunk : {64 * kKiB, 256 * kKiB, 1 * kMiB, 4 * kMiB}) {
      p.candidates.push_back(
          {absl::StrCat("two-phase/", Human(chunk)),
           false,
           {{"flat_max_bytes", 0}, {"chunk_bytes", static_cast<int64_t>(chunk)}}});
    }
  } else {
    const int64_t algo = profile.gloo.algorithm == "bcube" ? 1 : 0;
    const auto segment = static_cast<int64_t>(profile.gloo.max_segment_bytes);
    p.candidates.push_back({"static", true, {{"algorithm", algo}, {"max_segment_bytes", segment}}});
    p.candidates.push_back({algo == 1 ? "ring" : "bcube",
                            false,
                            {{"algorithm", 1 - algo}, {"max_segment_bytes", segment}}});
    for (uint64_t seg : {64 * kKiB, 256 * kKiB, 1 * kMiB, 4 * kMiB}) {
      if (static_cast<int64_t>(seg) == segment) continue;
      p.candidates.push_back(
          {absl::StrCat(algo == 1 ? "bcube" : "ring", "/seg ", Human(seg)),
           false,
           {{"algorithm", algo}, {"max_segment_bytes", static_cast<int64_t>(seg)}}});
    }
  }
  return p;
}

// What candidate `c` actually does for `bytes`: candidates that behave alike at a size are
// measured once (the first one, so the static profile stands for every twin of it).
std::string Behaviour(const Plan& p, const Candidate& c, uint64_t bytes) {
  if (p.backend == "shm") {
    const uint64_t half = ShmSlotHalf();
    if (bytes <= std::min<uint64_t>(c.knobs.at("flat_max_bytes"), half)) return "flat";
    const uint64_t chunk = std::min<uint64_t>(c.knobs.at("chunk_bytes"), half);
    return chunk >= bytes ? "one chunk" : absl::StrCat("chunks of ", chunk);
  }
  return absl::StrCat(c.knobs.at("algorithm"), "/", c.knobs.at("max_segment_bytes"));
}

std::vector<size_t> Distinct(const Plan& p, uint64_t bytes) {
  std::vector<size_t> out;
  std::vector<std::string> seen;
  for (size_t i = 0; i < p.candidates.size(); ++i) {
    std::string b = Behaviour(p, p.candidates[i], bytes);
    if (std::find(seen.begin(), seen.end(), b) != seen.end()) continue;
    seen.push_back(b);
    out.push_back(i);
  }
  return out;
}

// Ops per timed sample (enough to beat the clock and the barrier) and samples per candidate.
int OpsPerSample(uint64_t bytes) {
  return static_cast<int>(std::clamp<uint64_t>((8 * kMiB) / bytes, 1, 200));
}
int Rounds(const TuneArgs& a, uint64_t bytes) {
  if (a.rounds > 0) return a.rounds;
  return bytes <= 4 * kMiB ? 21 : bytes <= 64 * kMiB ? 11 : 7;
}

config::SizeBands Everywhere(int64_t value) {
  return {config::SizeBand{0, config::kTunedMaxBytesUnbounded, value}};
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const Plan& p, const Candidate& c, int rank,
                                                     int size, std::shared_ptr<Store> store,
                                                     const EffectiveConfig& profile,
                                                     absl::Duration timeout) {
  if (p.backend == "shm") {
    ShmBackendOptions o;
    o.rank = rank;
    o.size = size;
    o.store = std::move(store);
    o.init_timeout = timeout;
    if (!c.is_static) {
      ShmBackendOptions::TunedBands bands;
      bands.flat_max_bytes = Everywhere(c.knobs.at("flat_max_bytes"));
      bands.chunk_bytes = Everywhere(c.knobs.at("chunk_bytes"));
      o.tuned_allreduce = bands;
      o.tuned_reduce = bands;
    }
    return CreateShmBackend(o);
  }
  GlooBackendOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::move(store);
  o.hostname = "127.0.0.1";
  o.init_timeout = timeout;
  o.default_timeout = timeout;
  o.algorithm = profile.gloo.algorithm;
  o.max_segment_bytes = profile.gloo.max_segment_bytes;
  if (!c.is_static) {
    o.tuned_algorithm = Everywhere(c.knobs.at("algorithm"));
    o.tuned_max_segment_bytes = Everywhere(c.knobs.at("max_segment_bytes"));
  }
  return CreateGlooBackend(o);
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
// comparison, [0] static and [1] tuned).
absl::Status Measure(const TuneArgs& a, const Plan& p, std::vector<Communicator*> comms,
                     const std::function<std::vector<size_t>(uint64_t)>& which, Samples* out) {
  const uint64_t largest = p.sizes.back();
  std::vector<float> buf(largest / sizeof(float));
  for (const std::string& op : p.ops) {
    for (uint64_t bytes : p.sizes) {
      const size_t count = bytes / sizeof(float);
      const std::vector<size_t> ids = which(bytes);
      for (size_t id : ids) {
        const std::string what = absl::StrCat(op, " ", Human(bytes), " candidate ", id);
        if (absl::Status s = CheckedRun(*comms[id], op, buf, count, what); !s.ok()) return s;
        if (absl::Status s = Issue(*comms[id], op, HostView(buf.data(), count)).Wait(); !s.ok()) {
          return s;
        }
      }
      const int k = OpsPerSample(bytes);
      const int rounds = Rounds(a, bytes);
      for (int r = 0; r < rounds; ++r) {
        for (size_t j = 0; j < ids.size(); ++j) {
          const size_t id = ids[(j + static_cast<size_t>(r)) % ids.size()];
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

// All `n` threads wait until every one has arrived (a creation that failed on one rank fails on
// every rank alike, so all of them always arrive).
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int n) : n_(n) {}
  void Wait() {
    absl::MutexLock lock(&mu_);
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      return;
    }
    Waiter w{this, generation_};
    mu_.Await(absl::Condition(&Waiter::Passed, &w));
  }

 private:
  struct Waiter {
    ThreadBarrier* self;
    int generation;
    // Called by Await with mu_ held.
    static bool Passed(Waiter* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return w->self->generation_ != w->generation;
    }
  };
  absl::Mutex mu_;
  const int n_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// Runs body(rank, store) on --ranks threads sharing an in-process store; the first error wins.
absl::Status OnRanks(int n, const std::function<absl::Status(int, std::shared_ptr<Store>)>& body) {
  std::shared_ptr<Store> store = CreateHashStore();
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      log::ScopedThreadRank rank_for_logs(r);
      st[r] = body(r, store);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!st[r].ok())
      return absl::Status(st[r].code(), absl::StrCat("rank ", r, ": ", st[r].message()));
  }
  return absl::OkStatus();
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

struct Decision {
  std::string op;
  uint64_t bytes = 0;
  size_t winner = 0;  // candidate index; 0 = static kept
  size_t best = 0;    // fastest non-static candidate measured (0: none)
  diag::TimingSummary stat, alt;
  double q25_static = 0, q75_best = 0;
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
      d.q25_static = diag::Percentile(per.at(0), 25);
      double best_median = 0;
      for (const auto& [id, samples] : per) {
        if (id == 0) continue;
        const double m = diag::Median(samples);
        if (d.best == 0 || m < best_median) {
          d.best = id;
          best_median = m;
        }
      }
      if (d.best != 0) {
        d.alt = diag::Summarize(per.at(d.best));
        d.q75_best = diag::Percentile(per.at(d.best), 75);
        const bool faster = d.stat.median > d.alt.median * (1 + a.threshold_pct / 100);
        const bool apart = d.q75_best < d.q25_static;
        if (faster && apart) d.winner = d.best;
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
                ? absl::StrFormat("adaptcomm tune %s at %s: %s %.1f us vs static %.1f us", Today(),
                                  Human(d.bytes), c.name, d.alt.median, d.stat.median)
                : absl::StrFormat(
                      "adaptcomm tune %s at %s: static %.1f us kept (best %s %.1f us "
                      "within noise)",
                      Today(), Human(d.bytes), d.stat.median, d.best == 0 ? "none" : best.name,
                      d.alt.median);
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
};

int Fail(const TuneArgs& a, int code, const std::string& message) {
  std::fprintf(stderr, "tune: %s\n", message.c_str());
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"ok", false}, {"error", message}}.dump(2).c_str());
  }
  return code;
}

int RunTune(const TuneArgs& a) {
  const auto started = Clock::now();
  ProfileRequest req;
  req.world_size = a.ranks;
  absl::StatusOr<EffectiveConfig> profile = ResolveProfile(req);
  if (!profile.ok()) return Fail(a, 2, std::string(profile.status().message()));
  absl::StatusOr<Plan> plan = MakePlan(a, *profile);
  if (!plan.ok()) return Fail(a, 2, std::string(plan.status().message()));
  const Plan& p = *plan;
  const absl::Duration timeout = absl::Seconds(a.timeout_s);

  // ---- tuning: every candidate a communicator of its own, all measured round by round ----
  Samples samples;
  absl::Status tuned = OnRanks(a.ranks, [&](int rank, std::shared_ptr<Store> store) {
    std::vector<std::unique_ptr<Communicator>> owned;
    std::vector<Communicator*> comms;
    for (size_t i = 0; i < p.candidates.size(); ++i) {
      const std::string name = absl::StrCat("tune", i);
      absl::StatusOr<std::unique_ptr<Backend>> b = MakeBackend(
          p, p.candidates[i], rank, a.ranks, CreatePrefixStore(name, store), *profile, timeout);
      if (!b.ok()) return b.status();
      absl::StatusOr<std::unique_ptr<Communicator>> c =
          Communicator::CreateWithBackend(*std::move(b), RankOptions(a, rank, store, name));
      if (!c.ok()) return c.status();
      comms.push_back(c->get());
      owned.push_back(*std::move(c));
    }
    return Measure(
        a, p, comms, [&](uint64_t bytes) { return Distinct(p, bytes); },
        rank == 0 ? &samples : nullptr);
  });
  if (!tuned.ok()) return Fail(a, 1, tuned.ToString());
  const std::vector<Decision> decisions = Decide(a, p, samples);
  const config::TunedTable table = MakeTable(a, p, decisions);
  const std::string text = config::FormatTunedTable(table);
  {
    std::ofstream f(a.out);
    f << text;
    if (!f.good()) return Fail(a, 1, absl::StrCat("cannot write ", a.out));
  }
  // What was written must read back for this topology, exactly as a job would load it.
  absl::StatusOr<config::TunedTable> back = config::LoadTunedTableFor(a.out, table.fingerprint);
  if (!back.ok())
    return Fail(a, 1, absl::StrCat("the written table does not load: ", back.status().ToString()));
  const double tune_s = std::chrono::duration<double>(Clock::now() - started).count();

  // ---- comparison: the static profile vs the table loaded at communicator creation ----
  std::vector<CompareRow> compare;
  std::string explain;
  if (a.compare) {
    Samples cs;
    // Both communicators are created the way a job creates one: the static one without the
    // table, the tuned one with ADAPTCOMM_TUNED_TABLE set, which only rank 0's thread changes
    // while every rank waits (the variable is the process's).
    ThreadBarrier between(a.ranks);
    absl::Status st = OnRanks(a.ranks, [&](int rank, std::shared_ptr<Store> store) {
      absl::StatusOr<std::unique_ptr<Communicator>> stat =
          Communicator::Create(RankOptions(a, rank, store, "static"));
      between.Wait();
      if (rank == 0) setenv(config::kTunedTableEnv, a.out.c_str(), 1);
      between.Wait();
      absl::StatusOr<std::unique_ptr<Communicator>> tuned_comm =
          Communicator::Create(RankOptions(a, rank, store, "tuned"));
      between.Wait();
      if (rank == 0) unsetenv(config::kTunedTableEnv);
      if (!stat.ok()) return stat.status();
      if (!tuned_comm.ok()) return tuned_comm.status();
      if (rank == 0) explain = (*tuned_comm)->Explain();
      return Measure(
          a, p, {stat->get(), tuned_comm->get()},
          [](uint64_t) {
            return std::vector<size_t>{0, 1};
          },
          rank == 0 ? &cs : nullptr);
    });
    if (!st.ok()) return Fail(a, 1, st.ToString());
    for (const std::string& op : p.ops) {
      for (uint64_t bytes : p.sizes) {
        compare.push_back(
            {op, bytes, diag::Median(cs[op][bytes][0]), diag::Median(cs[op][bytes][1])});
      }
    }
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - started).count();

  if (a.json) {
    nlohmann::json j;
    j["ok"] = true;
    j["ranks"] = a.ranks;
    j["backend"] = p.backend;
    j["table"] = a.out;
    j["fingerprint"] = table.fingerprint.Describe();
    j["threshold_pct"] = a.threshold_pct;
    j["tune_seconds"] = tune_s;
    j["bands"] = nlohmann::json::array();
    for (const Decision& d : decisions) {
      j["bands"].push_back({{"op", d.op},
                            {"bytes", d.bytes},
                            {"static_median_us", d.stat.median},
                            {"best", d.best == 0 ? "" : p.candidates[d.best].name},
                            {"best_median_us", d.alt.median},
                            {"chosen", p.candidates[d.winner].name}});
    }
    if (a.compare) {
      j["compare"] = nlohmann::json::array();
      for (const CompareRow& r : compare) {
        j["compare"].push_back({{"op", r.op},
                                {"bytes", r.bytes},
                                {"static_median_us", r.static_us},
                                {"tuned_median_us", r.tuned_us},
                                {"speedup", r.tuned_us > 0 ? r.static_us / r.tuned_us : 0}});
      }
      j["explain"] = explain;
    }
    j["seconds"] = total_s;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("adaptcomm tune: %d ranks (threads), backend %s, fingerprint %s\n", a.ranks,
              p.backend.c_str(), table.fingerprint.Describe().c_str());
  std::printf("%-10s %8s %11s %-18s %11s %8s  %s\n", "op", "size", "static_us", "best", "best_us",
              "ratio", "chosen");
  for (const Decision& d : decisions) {
    std::printf("%-10s %8s %11.1f %-18s %11.1f %8.3f  %s\n", d.op.c_str(), Human(d.bytes).c_str(),
                d.stat.median, d.best == 0 ? "-" : p.candidates[d.best].name.c_str(), d.alt.median,
                d.alt.median > 0 ? d.stat.median / d.alt.median : 0.0,
                d.winner == 0 ? "static (within noise)" : p.candidates[d.winner].name.c_str());
  }
  std::printf("wrote %s (%zu entries) in %.1f s\n", a.out.c_str(), table.entries.size(), tune_s);
  if (a.compare) {
    std::printf("\ncompare, same run: static profile vs the table loaded at creation\n");
    std::printf("%-10s %8s %11s %11s %8s\n", "op", "size", "static_us", "tuned_us", "speedup");
    for (const CompareRow& r : compare) {
      std::printf("%-10s %8s %11.1f %11.1f %8.3f\n", r.op.c_str(), Human(r.bytes).c_str(),
                  r.static_us, r.tuned_us, r.tuned_us > 0 ? r.static_us / r.tuned_us : 0.0);
    }
    std::printf("\n%s", explain.c_str());
    std::printf("total %.1f s\n", total_s);
  }
  return 0;
}

std::function<int()> SetupTune(CLI::App& sub) {
  auto a = std::make_shared<TuneArgs>();
  sub.add_option("--ranks", a->ranks, "Ranks, as threads of this process on this host")
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
                 "Samples per candidate and size (default: 21 up to 4 MiB, 11 up to 64 MiB, 7)")
      ->check(CLI::Range(3, 1000));
  sub.add_flag(
      "--compare", a->compare,
      "Then time the static profile against the written table, loaded by a communicator "
      "as a job loads it (ADAPTCOMM_TUNED_TABLE), in the same run, and print its Explain()");
  sub.add_option("--timeout", a->timeout_s, "Bound of creation and of each operation, seconds")
      ->check(DurationSeconds(/*zero_allowed=*/false))
      ->capture_default_str();
  sub.add_flag("--json", a->json, "Machine-readable output");
  sub.footer(
      "Candidates (each applied to every size): shm: the static profile, flat exchange, "
      "two-phase with 64 KiB/256 KiB/1 MiB/4 MiB chunks; gloo: the static profile, the other "
      "algorithm, 64 KiB..4 MiB segments. Candidates that behave alike at a size are measured "
      "once. Each round times every candidate once (rotated order); a sample is the mean of "
      "enough back-to-back ops after a barrier, on rank 0's clock. The first run of every "
      "candidate and size is checked element by element.\n"
      "Decision per band: a candidate replaces the static value only when its median is more "
      "than --threshold percent below the static median AND the interquartile ranges do not "
      "overlap (its 75th percentile under the static 25th); otherwise the band keeps the static "
      "value.\n"
      "Load the table with the profile's `tuning: {table: PATH}` or ADAPTCOMM_TUNED_TABLE; it "
      "applies only on this fingerprint (hosts, ranks per host, cores, backend, Gloo version).\n"
      "Exit code: 0 ok, 1 a rank failed or a result was wrong, 2 bad arguments.");
  return [a] { return RunTune(*a); };
}

}  // namespace

ADAPTCOMM_SUBCOMMAND(tune, "Measure the backends' knobs per size band and write a tuned table",
                     SetupTune);

}  // namespace adaptcomm::tools

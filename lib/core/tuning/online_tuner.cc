#include "lib/core/tuning/online_tuner.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/base/byte_text.h"
#include "lib/base/log.h"
#include "lib/config/units.h"
#include "lib/core/executor/op_executor.h"

namespace adaptcomm::internal {
namespace {

std::string BytesText(uint64_t b) { return b == UINT64_MAX ? "max" : ByteSizeText(b); }

std::string BandText(const std::string& op, int band) {
  return absl::StrCat(op, " (", BytesText(config::OnlineBandMin(band)), ", ",
                      BytesText(config::OnlineBandMax(band)), "]");
}

// What the ranks must have tried alike: the candidates and the trials of each (FNV-1a 64).
std::string PlanDigest(const std::vector<config::OnlineCandidate>& candidates, int trials) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ULL;
    }
  };
  mix(absl::StrCat(trials));
  for (const config::OnlineCandidate& c : candidates)
    mix(absl::StrCat("|", c.name, ":", c.Values()));
  return absl::StrFormat("%016x", h);
}

int64_t Median(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One rank's published measurement: "m <plan> <ns of each trial...>" (candidate by candidate, in
// the order the trials ran) or "i <why there is none>".
struct Measurement {
  bool complete = false;
  std::string plan;
  std::vector<int64_t> trial_ns;
  std::string why;
};

Measurement DecodeMeasurement(const std::string& text) {
  Measurement m;
  if (text.rfind("i ", 0) == 0) {
    m.why = text.substr(2);
    return m;
  }
  std::vector<std::string> parts = absl::StrSplit(text, ' ', absl::SkipEmpty());
  if (parts.size() < 3 || parts[0] != "m") {
    m.why = absl::StrCat("an unreadable measurement '", text.substr(0, 80), "'");
    return m;
  }
  m.plan = parts[1];
  for (size_t i = 2; i < parts.size(); ++i) {
    int64_t ns = 0;
    if (!absl::SimpleAtoi(parts[i], &ns) || ns <= 0) {
      m.why = absl::StrCat("an unreadable measurement '", text.substr(0, 80), "'");
      return m;
    }
    m.trial_ns.push_back(ns);
  }
  m.complete = true;
  return m;
}

// The verdict of one band: "w <winner> <median ns per candidate...>" or "s <why the static values
// stay>".
struct Verdict {
  int winner = 0;
  std::vector<int64_t> median_ns;
  std::string reason;
};

std::string EncodeVerdict(const Verdict& v) {
  if (!v.reason.empty()) return absl::StrCat("s ", v.reason);
  return absl::StrCat("w ", v.winner, " ", absl::StrJoin(v.median_ns, " "));
}

absl::StatusOr<Verdict> DecodeVerdict(const std::string& text, size_t candidates) {
  Verdict v;
  if (text.rfind("s ", 0) == 0) {
    v.reason = text.substr(2);
    return v;
  }
  std::vector<std::string> parts = absl::StrSplit(text, ' ', absl::SkipEmpty());
  bool ok = parts.size() == candidates + 2 && parts[0] == "w" &&
            absl::SimpleAtoi(parts[1], &v.winner) && v.winner >= 0 &&
            static_cast<size_t>(v.winner) < candidates;
  for (size_t i = 2; ok && i < parts.size(); ++i) {
    int64_t ns = 0;
    ok = absl::SimpleAtoi(parts[i], &ns);
    v.median_ns.push_back(ns);
  }
  if (!ok)
    return absl::DataLossError(absl::StrCat("unreadable verdict '", text.substr(0, 80), "'"));
  return v;
}

// Every rank's measurement -> the verdict. A trial's time is the shortest over the ranks: the rank
// that started the op last waited for no one, the others' times include waiting for it (how far
// apart the ranks arrive is the caller's doing, and with lockstep ranks it follows the position
// in the round robin, not the candidate). A candidate's time is the median of its trials'; the
// fastest wins if it beats the static values by more than `threshold_pct`. The same inputs give
// the same verdict on every rank.
Verdict Judge(const std::vector<Measurement>& all, size_t candidates, int trials,
              double threshold_pct) {
  Verdict v;
  const size_t expected = candidates * static_cast<size_t>(trials);
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].complete) {
      v.reason = absl::StrCat("rank ", r, " has no measurement: ", all[r].why);
      return v;
    }
    if (all[r].plan != all[0].plan || all[r].trial_ns.size() != expected) {
      v.reason = absl::StrCat("rank ", r, " tried other candidates than rank 0 (plan ", all[r].plan,
                              " vs ", all[0].plan, ")");
      return v;
    }
  }
  for (size_t c = 0; c < candidates; ++c) {
    std::vector<int64_t> per_op;
    for (size_t t = 0; t < static_cast<size_t>(trials); ++t) {
      int64_t shortest = INT64_MAX;
      for (const Measurement& m : all) shortest = std::min(shortest, m.trial_ns[c * trials + t]);
      per_op.push_back(shortest);
    }
    v.median_ns.push_back(Median(per_op));
  }
  size_t best = 0;
  for (size_t c = 1; c < candidates; ++c) {
    if (v.median_ns[c] < v.median_ns[best]) best = c;
  }
  const double bar = static_cast<double>(v.median_ns[0]) * (1.0 - threshold_pct / 100.0);
  v.winner = best != 0 && static_cast<double>(v.median_ns[best]) < bar ? static_cast<int>(best) : 0;
  return v;
}

struct Agreement {
  Verdict verdict;
  // Set when this rank published its measurement but cannot learn the verdict: the others may
  // run a winner, so the communicator must not go on with the static values.
  std::string unresolved;
};

// The store protocol of one band (keys under `prefix`): "m/<rank>" each rank's measurement,
// "ticket" (Store::Add) and "verdict", written once by the rank that took ticket 1.
Agreement Agree(Store& store, const std::string& prefix, int rank, int world,
                const std::string& mine, size_t candidates, int trials, double threshold_pct,
                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Agreement a;
  Verdict proposal;
  const absl::Status published = store.Set(absl::StrCat(prefix, "/m/", rank), mine);
  if (!published.ok()) {
    proposal.reason =
        absl::StrCat("rank ", rank, " could not publish its measurement: ", published.message());
  } else {
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back(absl::StrCat(prefix, "/m/", r));
    const absl::Status all_there =
        store.Wait(keys, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    std::vector<Measurement> all;
    std::vector<int> missing;
    for (int r = 0; r < world && proposal.reason.empty(); ++r) {
      absl::StatusOr<std::string> text = store.Get(keys[r], absl::ZeroDuration());
      if (text.ok()) {
        all.push_back(DecodeMeasurement(*text));
      } else if (absl::IsNotFound(text.status()) || absl::IsDeadlineExceeded(text.status())) {
        missing.push_back(r);
      } else {
        proposal.reason =
            absl::StrCat("reading rank ", r, "'s measurement failed: ", text.status().message());
      }
    }
    if (proposal.reason.empty() && !missing.empty()) {
      proposal.reason =
          absl::StrCat("no measurement from rank(s) ", absl::StrJoin(missing, ", "), " within ",
                       absl::FormatDuration(timeout),
                       all_there.ok() ? "" : absl::StrCat(" (", all_there.message(), ")"));
    }
    if (proposal.reason.empty()) proposal = Judge(all, candidates, trials, threshold_pct);
  }
  absl::StatusOr<int64_t> ticket = store.Add(absl::StrCat(prefix, "/ticket"), 1);
  std::string lost;
  if (ticket.ok() && *ticket == 1) {
    // The first rank here decides for all: its proposal is the verdict.
    a.verdict = proposal;
    if (absl::Status s = store.Set(absl::StrCat(prefix, "/verdict"), EncodeVerdict(proposal));
        !s.ok()) {
      ADAPTCOMM_LOG(kWarning, "online tuning: writing the verdict of ", prefix,
                    " failed (the other ranks will abort): ", s.message());
    }
    return a;
  }
  if (!ticket.ok()) {
    lost = absl::StrCat("taking the ticket failed: ", ticket.status().message());
  } else {
    absl::StatusOr<std::string> text = store.Get(absl::StrCat(prefix, "/verdict"), timeout);
    if (text.ok()) {
      absl::StatusOr<Verdict> v = DecodeVerdict(*text, candidates);
      if (v.ok()) {
        a.verdict = *std::move(v);
        return a;
      }
      lost = std::string(v.status().message());
    } else {
      lost = absl::StrCat("the verdict never came: ", text.status().message());
    }
  }
  // No verdict. When this rank's measurement is not in the store, no rank can have judged a winner
  // (a verdict needs every rank's): every rank runs the static values. Otherwise it cannot tell.
  a.verdict = proposal;
  if (!published.ok()) return a;
  a.unresolved = lost;
  return a;
}

std::string Us(double us) { return absl::StrFormat("%.1f us", us); }

}  // namespace

std::string OnlineDecision::Describe() const {
  std::string out = BandText(op, band);
  switch (state) {
    case State::kTrials:
      return absl::StrCat(out, ": trying ", candidates, " candidates, ", trial_ops_issued, " of ",
                          static_cast<int64_t>(candidates) * trials, " trial ops issued");
    case State::kDeciding:
      return absl::StrCat(out, ": the ranks are agreeing on the winner");
    case State::kDecided:
      break;
  }
  absl::StrAppend(&out, ": ", winner, ", ", values);
  if (!reason.empty()) return absl::StrCat(out, " (", reason, ")");
  if (medians_us.empty()) return out;
  if (winner != "static") {
    double mine = 0;
    for (const auto& [name, us] : medians_us) {
      if (name == winner) mine = us;
    }
    return absl::StrCat(out, " (online: ", trials, " trials, median ", Us(mine), " vs ",
                        Us(medians_us[0].second), " static)");
  }
  size_t best = medians_us.size() > 1 ? 1 : 0;
  for (size_t c = 2; c < medians_us.size(); ++c) {
    if (medians_us[c].second < medians_us[best].second) best = c;
  }
  absl::StrAppend(&out, " (online: ", trials, " trials, median ", Us(medians_us[0].second));
  if (best != 0) {
    absl::StrAppend(&out, " vs ", Us(medians_us[best].second), " for ", medians_us[best].first,
                    ", the best other");
  }
  return absl::StrCat(out, ")");
}

std::shared_ptr<OnlineTuner> OnlineTuner::Create(OnlineTunerOptions options) {
  if (!options.settings.enabled) return nullptr;
  return std::make_shared<OnlineTuner>(std::move(options));
}

OnlineTuner::OnlineTuner(OnlineTunerOptions options) : options_(std::move(options)) {
  op_index_.fill(-1);
  for (size_t i = 0; i < options_.settings.ops.size() && i < kMaxOps; ++i) {
    for (OpKind kind : {OpKind::kAllreduce, OpKind::kReduce}) {
      if (options_.settings.ops[i] == OpKindName(kind)) {
        op_index_[static_cast<size_t>(kind)] = static_cast<int>(i);
      }
    }
  }
  if (options_.world_size < 2) {
    off_ = "one rank: nothing to agree on";
  } else if (options_.store == nullptr) {
    off_ = "no store to agree through (a communicator on a caller's backend)";
  } else if (options_.elastic) {
    off_ =
        "elastic communicators do not tune online (a joining process could not follow a trial "
        "window in progress)";
  } else if (options_.knob_space == nullptr || *options_.knob_space == '\0') {
    off_ = absl::StrCat("backend ", options_.backend, " takes no per-op knob values");
  }
}

OnlineTuner::Band& OnlineTuner::BandLocked(int op, int band) {
  const int key = op * kBands + band;
  auto [it, inserted] = bands_.try_emplace(key);
  Band& b = it->second;
  if (!inserted) return b;
  const OnlineTuningSettings& s = options_.settings;
  config::OnlineSpaceInputs in;
  in.world_size = options_.world_size;
  in.allow_reorder = s.allow_reorder;
  if (options_.static_knobs) {
    in.static_knobs = [this, name = s.ops[op]](uint64_t bytes) {
      return options_.static_knobs(name, bytes);
    };
  }
  b.op = op;
  b.band = band;
  b.candidates = config::OnlineCandidates(options_.knob_space, s.ops[op], band, in);
  for (const config::OnlineCandidate& c : b.candidates) {
    auto knobs = std::make_shared<OpKnobs>();
    knobs->backend = options_.knob_space;
    knobs->values = c.knobs;
    trials_[knobs.get()] = {key, static_cast<int>(b.trial_knobs.size())};
    b.trial_knobs.push_back(std::move(knobs));
  }
  b.samples_ns.resize(b.candidates.size());
  OnlineDecision& d = b.decision;
  d.op = s.ops[op];
  d.band = band;
  d.min_bytes = config::OnlineBandMin(band);
  d.max_bytes = config::OnlineBandMax(band);
  d.candidates = static_cast<int>(b.candidates.size());
  d.trials = s.trials_per_candidate;
  d.values = b.candidates[0].Values();
  if (b.candidates.size() < 2) {
    d.state = OnlineDecision::State::kDecided;
    decided_[key].store(&b, std::memory_order_release);
    d.reason = s.allow_reorder ? "no other candidate for this op and size"
                               : "no other candidate that keeps float results bit for bit "
                                 "(tuning.online.allow_reorder)";
  }
  return b;
}

void OnlineTuner::Assign(OpDesc& desc) {
  if (!active() || desc.wire.has_value() || desc.output.device.is_cuda() ||
      desc.input.device.is_cuda()) {
    return;
  }
  const int op = op_index_[static_cast<size_t>(desc.kind)];
  if (op < 0) return;
  const int band = config::OnlineBand(desc.output.bytes());
  // Decided bands (every op after the window) take no lock: `chosen` is fixed before the store.
  if (const Band* decided = decided_[op * kBands + band].load(std::memory_order_acquire)) {
    desc.knobs = decided->chosen;
    return;
  }
  absl::Status abort_with;
  {
    absl::MutexLock lock(&mu_);
    Band& b = BandLocked(op, band);
    // Another thread of this rank is at the decision point: its verdict is this op's values too.
    mu_.Await(absl::Condition(
        +[](Band* band) { return band->decision.state != OnlineDecision::State::kDeciding; }, &b));
    if (b.decision.state == OnlineDecision::State::kDecided) {
      desc.knobs = b.chosen;
      return;
    }
    if (!b.warmed) {
      // The band's first op runs the static values untimed: the first touch of the caller's
      // buffer and of the transport's memory would count against whichever candidate came first.
      b.warmed = true;
      return;
    }
    if (b.issued < Window(b)) {
      desc.knobs = b.trial_knobs[b.issued % static_cast<int64_t>(b.candidates.size())];
      b.decision.trial_ops_issued = ++b.issued;
      trials_in_flight_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    abort_with = DecideLocked(b);
    decided_[op * kBands + band].store(&b, std::memory_order_release);
    desc.knobs = b.chosen;
  }
  // Not under mu_: the executor calls this tuner under its own lock.
  if (!abort_with.ok() && options_.abort) options_.abort(abort_with);
}

std::string OnlineTuner::MeasurementLocked(const Band& b, bool trials_ended, bool aborted) const {
  if (aborted) return "i its communicator was aborted";
  if (!trials_ended) {
    return absl::StrCat("i its trial ops had not ended within ",
                        absl::FormatDuration(options_.settings.decision_timeout));
  }
  std::vector<int64_t> trial_ns;
  for (size_t c = 0; c < b.candidates.size(); ++c) {
    if (b.samples_ns[c].size() != static_cast<size_t>(options_.settings.trials_per_candidate)) {
      return absl::StrCat("i ", options_.settings.trials_per_candidate - b.samples_ns[c].size(),
                          " trial(s) of candidate ", b.candidates[c].name, " failed");
    }
    for (int64_t ns : b.samples_ns[c]) trial_ns.push_back(std::max<int64_t>(1, ns));
  }
  return absl::StrCat("m ", PlanDigest(b.candidates, options_.settings.trials_per_candidate), " ",
                      absl::StrJoin(trial_ns, " "));
}

absl::Status OnlineTuner::DecideLocked(Band& b) {
  OnlineDecision& d = b.decision;
  d.state = OnlineDecision::State::kDeciding;
  const OnlineTuningSettings& s = options_.settings;
  // This rank's trials are ahead of this op in the executor; an aborted communicator ends none.
  // (Aborted() takes the executor's lock, which it holds when it calls OnEnd: asked without mu_.)
  const absl::Time deadline = absl::Now() + s.decision_timeout;
  const int64_t window = Window(b);
  auto ended = [&b, window] { return b.ended >= window; };
  bool aborted = false;
  while (!ended() && absl::Now() < deadline) {
    mu_.Unlock();
    aborted = options_.aborted && options_.aborted();
    mu_.Lock();
    if (aborted) break;
    mu_.AwaitWithTimeout(absl::Condition(&ended),
                         std::min(absl::Milliseconds(50), deadline - absl::Now()));
  }
  const std::string mine = MeasurementLocked(b, ended(), aborted);
  const std::string band = BandText(d.op, d.band);
  const std::string prefix = absl::StrCat(d.op, "/", d.band);
  const size_t candidates = b.candidates.size();
  mu_.Unlock();
  const Agreement agreed =
      Agree(*options_.store, prefix, options_.rank, options_.world_size, mine, candidates,
            s.trials_per_candidate, s.threshold_pct, s.decision_timeout);
  mu_.Lock();
  const Verdict& v = agreed.verdict;
  d.state = OnlineDecision::State::kDecided;
  if (!agreed.unresolved.empty()) {
    d.reason = absl::StrCat("no verdict: ", agreed.unresolved);
    const absl::Status why = absl::AbortedError(
        absl::StrCat("communicator '", options_.communicator, "': online tuning of ", band, ": ",
                     agreed.unresolved,
                     "; this rank cannot tell which values the other ranks run, so it aborts"));
    ADAPTCOMM_LOG(kError, why.message());
    return why;
  }
  if (!v.reason.empty()) {
    d.reason = absl::StrCat("online tuning fell back to the static values: ", v.reason);
    ADAPTCOMM_LOG(kWarning, "communicator '", options_.communicator, "': online tuning of ", band,
                  " keeps the static values: ", v.reason);
    return absl::OkStatus();
  }
  for (size_t c = 0; c < candidates; ++c) {
    d.medians_us.emplace_back(b.candidates[c].name, static_cast<double>(v.median_ns[c]) / 1000.0);
  }
  const config::OnlineCandidate& won = b.candidates[v.winner];
  d.winner = won.name;
  d.values = won.Values();
  d.knobs = won.knobs;
  if (v.winner != 0) {
    // A copy: ops after the window are not trials.
    b.chosen = std::make_shared<OpKnobs>(*b.trial_knobs[v.winner]);
  }
  ADAPTCOMM_LOG(kInfo, "communicator '", options_.communicator, "': online tuning: ", d.Describe());
  return absl::OkStatus();
}

void OnlineTuner::OnStart(const OpDesc& op, absl::Time when) {
  // Ops after the window cost no lock here (a trial is counted in flight before it is queued).
  if (op.knobs == nullptr || trials_in_flight_.load(std::memory_order_relaxed) == 0) return;
  absl::MutexLock lock(&mu_);
  if (trials_.count(op.knobs.get()) != 0) started_[op.seq] = when;
}

void OnlineTuner::OnEnd(const OpDesc& op, const absl::Status& status, absl::Time when) {
  if (op.knobs == nullptr || trials_in_flight_.load(std::memory_order_relaxed) == 0) return;
  absl::MutexLock lock(&mu_);
  const auto trial = trials_.find(op.knobs.get());
  if (trial == trials_.end()) return;
  Band& b = bands_.at(trial->second.first);
  ++b.ended;
  trials_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  const auto start = started_.find(op.seq);
  if (start == started_.end()) return;
  if (status.ok() && b.decision.state != OnlineDecision::State::kDecided) {
    b.samples_ns[trial->second.second].push_back(absl::ToInt64Nanoseconds(when - start->second));
  }
  started_.erase(start);
}

std::vector<OnlineDecision> OnlineTuner::Decisions() const {
  absl::MutexLock lock(&mu_);
  std::vector<OnlineDecision> out;
  for (const auto& [key, b] : bands_) out.push_back(b.decision);
  return out;
}

std::string OnlineTuner::Explain() const {
  const OnlineTuningSettings& s = options_.settings;
  std::string out = absl::StrCat("online tuning (tuning.online.enabled from ", s.source, "): ");
  if (!active()) return absl::StrCat(out, "off: ", off_, "\n");
  absl::StrAppend(&out, s.trials_per_candidate, " trials per candidate, ops ",
                  absl::StrJoin(s.ops, ", "), ", backend ", options_.knob_space, ", threshold ",
                  s.threshold_pct, "%", s.allow_reorder ? ", float reordering allowed" : "", "\n");
  const std::vector<OnlineDecision> decisions = Decisions();
  if (decisions.empty()) absl::StrAppend(&out, "  (no tuned op issued yet)\n");
  for (const OnlineDecision& d : decisions) absl::StrAppend(&out, "  ", d.Describe(), "\n");
  return out;
}

std::shared_ptr<OnlineTuner> StartOnlineTuner(const CommunicatorOptions& options,
                                              const EffectiveConfig& config, bool elastic,
                                              const std::shared_ptr<Store>& store,
                                              const std::shared_ptr<OpExecutor>& executor) {
  OnlineTunerOptions t;
  t.settings = config.tuning.online;
  t.rank = *options.rank;  // resolved at creation
  t.world_size = *options.world_size;
  t.communicator = options.name;
  t.backend = executor->backend().name();
  t.knob_space = executor->backend().capabilities().per_op_knobs;
  std::weak_ptr<OpExecutor> weak = executor;
  t.static_knobs = [weak](const std::string& op, uint64_t bytes) {
    std::vector<std::pair<std::string, int64_t>> values;
    auto e = weak.lock();
    if (e == nullptr) return values;
    for (OpKind kind : {OpKind::kAllreduce, OpKind::kReduce}) {
      if (op == OpKindName(kind)) values = e->backend().StaticKnobs(kind, bytes);
    }
    return values;
  };
  if (store != nullptr) t.store = CreatePrefixStore("online", store);
  t.elastic = elastic;
  t.abort = [weak](const absl::Status& s) {
    if (auto e = weak.lock()) e->Abort(s);
  };
  t.aborted = [weak] {
    auto e = weak.lock();
    return e == nullptr || e->Aborted();
  };
  std::shared_ptr<OnlineTuner> tuner = OnlineTuner::Create(std::move(t));
  if (tuner == nullptr) return nullptr;
  if (tuner->active()) {
    executor->AddObserver(tuner);  // times the trials
  } else {
    ADAPTCOMM_LOG(kInfo, "communicator '", options.name, "': ", tuner->Explain());
  }
  return tuner;
}

}  // namespace adaptcomm::internal

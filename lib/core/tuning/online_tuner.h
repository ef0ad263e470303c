// OnlineTuner: online tuning (issue #15 item 3), opted into by the profile's `tuning.online`.
//
// For each tuned op (tuning.online.ops) and size band (lib/config/online_tuning.h), after one
// untimed warm-up op, the next candidates x trials_per_candidate ops of the band are trials: the
// communicator gives each its candidate's knob values (OpDesc::knobs, round robin over the
// candidates so that a change of load hits all of them alike) and times it from its start to its
// end on the executor (an OpObserver). Every rank assigns the same candidate to the same op, since
// ranks issue a band's ops in the same order.
//
// The next op of the band is the decision point: on the thread that issues it, each rank waits for
// its own trials to end, publishes every trial's time to the store and waits for every rank's (all
// bounded by tuning.online.decision_timeout). A trial's time is the shortest over the ranks: the
// rank that started the op last waited for no one, the others' times include how far apart the
// caller's threads arrived, which with lockstep ranks follows the position in the round robin
// rather than the candidate (the per-rank medians' maximum over ranks picked a 1.4-1.7x slower
// candidate at 4 KiB on shm). A candidate's time is the median of its trials'; the fastest wins if
// it beats the static values by more than tuning.online.threshold_pct, else the static values
// stay. Identical inputs give every rank the same winner. The verdict itself is the one written by
// the first rank to take the band's ticket in the store (Store::Add), so that ranks whose
// proposals differ (one saw every rank's times in time, one did not) still run the same values.
// The winner applies to every later op of the band, for the rest of the job.
//
// Failures never hang and never let ranks run different values: a rank whose publish fails, or
// whose trials did not end in time, makes every rank keep the static values (each logs why: the
// times it lacks, or the reason published in their place). A rank that published but cannot learn
// the verdict (the store failed it after that) aborts the communicator, because it cannot tell
// which values its peers run.
//
// Cost: during the window, the trials of slower candidates, and at each decision point one wait
// for this rank's last trials plus four store requests (set, wait, add, set or get). After the
// window: no lock (a decided band's values are read lock-free).
//
// Not tuned: ops with an OpDesc::wire (their time is the casts'), CUDA views, backends without a
// knob space (Capabilities::per_op_knobs: NCCL, hierarchical), one-rank communicators, elastic
// communicators (a process that joins could not follow a trial window in progress) and
// communicators without a store.
#ifndef ADAPTCOMM_LIB_CORE_TUNING_ONLINE_TUNER_H_
#define ADAPTCOMM_LIB_CORE_TUNING_ONLINE_TUNER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/ext/backend.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "lib/config/online_tuning.h"
#include "lib/trace/op_observer.h"

namespace adaptcomm::internal {

class OpExecutor;  // lib/core/executor/op_executor.h

struct OnlineTunerOptions {
  OnlineTuningSettings settings;
  int rank = 0;
  int world_size = 1;
  std::string communicator;          // its name, for log lines
  std::string backend;               // Backend::name()
  const char* knob_space = nullptr;  // Capabilities::per_op_knobs
  // The knob values the backend runs an op of `op` ("allreduce") and `bytes` with when the op sets
  // none (Backend::StaticKnobs); null: not known (every candidate is tried).
  std::function<std::vector<std::pair<std::string, int64_t>>(const std::string& op, uint64_t bytes)>
      static_knobs;
  std::shared_ptr<Store> store;  // the communicator's scope; null: none
  bool elastic = false;
  // Aborts the communicator (a rank that cannot learn a verdict).
  std::function<void(const absl::Status&)> abort;
  // Whether the communicator was aborted: its trials will not end, so nothing waits for them.
  std::function<bool()> aborted;
};

// What one op x band runs.
struct OnlineDecision {
  enum class State { kTrials, kDeciding, kDecided };
  std::string op;  // "allreduce"
  int band = 0;
  uint64_t min_bytes = 0;  // exclusive
  uint64_t max_bytes = 0;  // inclusive; UINT64_MAX for the last band
  State state = State::kTrials;
  int candidates = 0;
  int trials = 0;                // per candidate
  int64_t trial_ops_issued = 0;  // so far
  std::string winner = "static";
  std::string values;  // the winner's ("flat_max_bytes=0 chunk_bytes=262144")
  std::vector<std::pair<std::string, int64_t>> knobs;  // the winner's; empty: static
  // Per candidate, the median over its trials of each trial's shortest time over the ranks
  // (microseconds), in candidate order; empty without a measured verdict.
  std::vector<std::pair<std::string, double>> medians_us;
  // Why the static values stay without a measured verdict ("" when there was one).
  std::string reason;

  // "allreduce (64 KiB, 256 KiB]: two-phase/256KiB, flat_max_bytes=0 chunk_bytes=262144
  // (online: 5 trials, median 41.0 us vs 55.2 us static)"
  std::string Describe() const;
};

class OnlineTuner final : public trace::OpObserver {
 public:
  // Null when tuning.online.enabled is false. Otherwise a tuner, which may be inactive: active()
  // false and Explain() says why (one rank, no store, elastic, a backend without knobs).
  static std::shared_ptr<OnlineTuner> Create(OnlineTunerOptions options);
  explicit OnlineTuner(OnlineTunerOptions options);

  bool active() const { return off_.empty(); }
  // On the issuing thread, after the op was validated and before it is queued: sets desc.knobs for
  // a trial or a decided band. At a band's decision point it blocks for the agreement (bounded by
  // tuning.online.decision_timeout, twice at most).
  void Assign(OpDesc& desc);

  // Every band that has seen an op, by op and size.
  std::vector<OnlineDecision> Decisions() const;
  // The lines Communicator::Explain() adds.
  std::string Explain() const;

  void OnEnqueue(const OpDesc&, absl::Time) override {}
  void OnStart(const OpDesc& op, absl::Time when) override;
  void OnEnd(const OpDesc& op, const absl::Status& status, absl::Time when) override;

 private:
  static constexpr int kMaxOps = 2;  // the kinds with knobs: allreduce, reduce
  static constexpr int kBands = 16;  // more than config::OnlineBandEdges() holds
  struct Band {
    int op = 0;  // index into options_.settings.ops
    int band = 0;
    std::vector<config::OnlineCandidate> candidates;
    std::vector<std::shared_ptr<const OpKnobs>> trial_knobs;  // per candidate
    bool warmed = false;  // the band's first op went by (untimed, static values)
    int64_t issued = 0;   // trial ops given knobs
    int64_t ended = 0;    // trial ops the executor finished, whatever their status
    std::vector<std::vector<int64_t>> samples_ns;  // per candidate, successful trials only
    std::shared_ptr<const OpKnobs> chosen;         // after the decision; null: static
    OnlineDecision decision;
  };

  int64_t Window(const Band& b) const {
    return static_cast<int64_t>(b.candidates.size()) * options_.settings.trials_per_candidate;
  }
  Band& BandLocked(int op, int band) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The decision point of `b`: waits for its trials, agrees, and fixes b.chosen. Releases mu_
  // while it waits on the store. An error: the communicator must be aborted with it.
  absl::Status DecideLocked(Band& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // This rank's measurement of `b` as published ("m <plan> <ns>..." or "i <why>").
  std::string MeasurementLocked(const Band& b, bool trials_ended, bool aborted) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const OnlineTunerOptions options_;
  std::string off_;  // why the tuner is inactive ("" when active); fixed at construction
  mutable absl::Mutex mu_;
  std::map<int, Band> bands_ ABSL_GUARDED_BY(mu_);  // op * kBands + band; nodes never move
  // A trial's knob set -> its band key and candidate.
  std::unordered_map<const OpKnobs*, std::pair<int, int>> trials_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, absl::Time> started_ ABSL_GUARDED_BY(mu_);  // trial seq -> start
  // Lock-free paths for the ops after the window: a band once decided (its `chosen` never changes
  // after), and the trial ops queued or running.
  std::array<std::atomic<const Band*>, kMaxOps * kBands> decided_{};
  std::atomic<int64_t> trials_in_flight_{0};
  std::array<int, 16> op_index_;  // OpKind -> index into settings.ops, -1: not tuned
};

// The tuner of a communicator whose profile asks for online tuning (else null), on the executor
// of its backend, whose ops it times (an observer: REQUIRES the executor not started yet).
std::shared_ptr<OnlineTuner> StartOnlineTuner(const CommunicatorOptions& options,
                                              const EffectiveConfig& config, bool elastic,
                                              const std::shared_ptr<Store>& store,
                                              const std::shared_ptr<OpExecutor>& executor);

// The decisions of `comm`'s online tuner (empty when it has none). Defined with the
// communicator (lib/core/communicator/communicator.cc), which owns the tuner.
std::vector<OnlineDecision> OnlineTuningDecisions(const Communicator& comm);

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_TUNING_ONLINE_TUNER_H_

// The tuning space of online tuning (issue #15 item 3), declared as data: which values of the
// host backends' knobs (TunedKnobs(), lib/config/tuned_table.h) a communicator tries on live
// traffic in each message-size band, and which of them can change a result. The runtime that
// tries them and agrees on the winners is lib/core/tuning/online_tuner.h; the backends apply an
// op's values through OpDesc::knobs (include/adaptcomm/ext/backend.h).
//
// Results. shm: every candidate keeps every result bit for bit, floats included: the flat path
// and the chunked path reduce each element in rank order, and a chunk boundary never splits an
// element's sum (lib/shm/shm_backend.h). Gloo: the algorithm and the segment size decide which rank
// starts each element's ring sum; with two ranks a sum has one order (a + b == b + a in IEEE
// arithmetic, NaN payloads aside), with more ranks a float sum may differ in the last bits. Those
// candidates are marked reorders_floats and tried only with tuning.online.allow_reorder.
#ifndef ADAPTCOMM_LIB_CONFIG_ONLINE_TUNING_H_
#define ADAPTCOMM_LIB_CONFIG_ONLINE_TUNING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "adaptcomm/profile.h"

namespace adaptcomm::config {

inline constexpr char kOnlineTuningEnv[] = "ADAPTCOMM_ONLINE_TUNING";

// The size bands tuned separately: (0, 4 KiB], (4 KiB, 16 KiB], ... (64 MiB, 256 MiB],
// (256 MiB, max]; band i is (OnlineBandEdges()[i-1], OnlineBandEdges()[i]], the first from 0.
const std::vector<uint64_t>& OnlineBandEdges();
// The band holding `bytes` (0 for 0 bytes).
int OnlineBand(uint64_t bytes);
uint64_t OnlineBandMin(int band);  // exclusive
uint64_t OnlineBandMax(int band);  // inclusive; UINT64_MAX for the last band

// One point of the space: values for some knobs of one backend; the others keep the backend's
// own (the profile's or a tuned table's). The static candidate sets none.
struct OnlineCandidate {
  std::string backend;  // "shm", "gloo"
  std::string name;     // "static", "flat", "two-phase/256KiB", "bcube", "ring/seg 4MiB"
  std::vector<std::pair<std::string, int64_t>> knobs;  // TunedKnobSpec::knob -> value
  bool reorders_floats = false;  // may change a float result (see the top of this file)
  // "flat_max_bytes=0 chunk_bytes=262144", "algorithm=bcube"; "profile/table values" for the
  // static candidate.
  std::string Values() const;
};

// What the candidates are built from besides the backend, op and band.
struct OnlineSpaceInputs {
  int world_size = 2;
  bool allow_reorder = false;
  // The knob values the backend runs an op of `bytes` with when the op sets none
  // (Backend::StaticKnobs: the profile's, or a tuned table's band). Null or empty: not known.
  // Alike on every rank (the profile is checked across ranks, a tuned table applies on all or
  // none), so that every rank tries the same candidates in the same order.
  std::function<std::vector<std::pair<std::string, int64_t>>(uint64_t bytes)> static_knobs;
};

// The candidates of `backend` ("shm", "gloo") for `op` in `band`, the static one first. Each
// candidate runs an algorithm of its own at the band's largest size (KnobBehaviour,
// lib/config/knob_behaviour.h): one that would run what the static values run there, or what an
// earlier candidate runs, is left out (without static values, only those alike each other).
// reorders_floats ones are left out unless allow_reorder. Only the static one when the backend
// has no knobs for the op.
std::vector<OnlineCandidate> OnlineCandidates(const std::string& backend, const std::string& op,
                                              int band, const OnlineSpaceInputs& in);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_ONLINE_TUNING_H_

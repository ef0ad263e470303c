#include "lib/config/online_tuning.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/byte_text.h"
#include "lib/config/knob_behaviour.h"
#include "lib/config/tuned_table.h"
#include "lib/config/units.h"

namespace adaptcomm::config {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
// What the last band's candidates are compared at (it has no largest size).
constexpr uint64_t kLastBandProbe = uint64_t{1} << 30;

int64_t KnobMax(const std::string& backend, const std::string& knob) {
  const TunedKnobSpec* spec = FindTunedKnob(backend, knob);
  return spec == nullptr ? 0 : spec->max;
}

bool Applies(const std::string& backend, const std::string& op) {
  bool any = false;
  for (const TunedKnobSpec& k : TunedKnobs()) {
    if (k.backend == backend && std::find(k.ops.begin(), k.ops.end(), op) != k.ops.end()) {
      any = true;
    }
  }
  return any;
}

// shm: the flat exchange up to the largest flat size, or reduce-scatter + allgather in chunks of
// 64 KiB .. 4 MiB (what `adaptcomm tune` measures).
void ShmCandidates(std::vector<OnlineCandidate>& out) {
  const int64_t half = KnobMax("shm", "flat_max_bytes");  // half a slot: the largest step
  out.push_back({"shm", "flat", {{"flat_max_bytes", half}}, false});
  for (uint64_t chunk : {64 * kKiB, 256 * kKiB, 1 * kMiB, 4 * kMiB}) {
    out.push_back({"shm",
                   absl::StrCat("two-phase/", CompactByteSizeText(chunk)),
                   {{"flat_max_bytes", 0}, {"chunk_bytes", static_cast<int64_t>(chunk)}},
                   false});
  }
}

// Gloo: the other algorithm, and the static one with ring segments of 1/4/16 MiB (bcube has no
// segment cap; after recursive doubling, only the ring). With more than two ranks each changes
// which rank starts an element's sum.
void GlooCandidates(const std::map<std::string, int64_t>& statics, int world_size,
                    std::vector<OnlineCandidate>& out) {
  const bool reorders = world_size > 2;
  auto algorithm = statics.find("algorithm");
  const int64_t static_algorithm = algorithm != statics.end() ? algorithm->second : 0;
  if (static_algorithm == 2) {
    // Recursive doubling runs where bcube's groups would be a full mesh: the ring is the only
    // other algorithm worth a trial, and neither has a segment cap to try.
    out.push_back({"gloo", "ring", {{"algorithm", 0}}, reorders});
    return;
  }
  const bool bcube = static_algorithm == 1;
  out.push_back({"gloo", bcube ? "ring" : "bcube", {{"algorithm", bcube ? 0 : 1}}, reorders});
  for (uint64_t segment : {1 * kMiB, 4 * kMiB, 16 * kMiB}) {
    out.push_back({"gloo",
                   absl::StrCat(bcube ? "bcube" : "ring", "/seg ", CompactByteSizeText(segment)),
                   {{"max_segment_bytes", static_cast<int64_t>(segment)}},
                   reorders});
  }
}

}  // namespace

const std::vector<uint64_t>& OnlineBandEdges() {
  static const auto* edges =
      new std::vector<uint64_t>{4 * kKiB, 16 * kKiB, 64 * kKiB, 256 * kKiB, 1 * kMiB,
                                4 * kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB, UINT64_MAX};
  return *edges;
}

int OnlineBand(uint64_t bytes) {
  const std::vector<uint64_t>& edges = OnlineBandEdges();
  for (size_t i = 0; i < edges.size(); ++i) {
    if (bytes <= edges[i]) return static_cast<int>(i);
  }
  return static_cast<int>(edges.size()) - 1;
}

uint64_t OnlineBandMin(int band) { return band <= 0 ? 0 : OnlineBandEdges()[band - 1]; }
uint64_t OnlineBandMax(int band) { return OnlineBandEdges()[band]; }

std::string OnlineCandidate::Values() const {
  if (knobs.empty()) return "profile/table values";
  std::vector<std::string> parts;
  for (const auto& [knob, value] : knobs) {
    const TunedKnobSpec* spec = FindTunedKnob(backend, knob);
    if (spec != nullptr && spec->type == KnobType::kChoice && value >= 0 &&
        static_cast<size_t>(value) < spec->choices.size()) {
      parts.push_back(absl::StrCat(knob, "=", spec->choices[value]));
    } else {
      parts.push_back(absl::StrCat(knob, "=", value));
    }
  }
  return absl::StrJoin(parts, " ");
}

std::vector<OnlineCandidate> OnlineCandidates(const std::string& backend, const std::string& op,
                                              int band, const OnlineSpaceInputs& in) {
  std::vector<OnlineCandidate> out = {{backend, "static", {}, false}};
  if (!Applies(backend, op)) return out;
  const uint64_t max = OnlineBandMax(band);
  const uint64_t probe = max == UINT64_MAX ? kLastBandProbe : max;
  std::map<std::string, int64_t> statics;
  if (in.static_knobs) {
    for (const auto& [knob, value] : in.static_knobs(probe)) statics[knob] = value;
  }
  std::vector<OnlineCandidate> space;
  if (backend == "shm") {
    ShmCandidates(space);
  } else if (backend == "gloo") {
    GlooCandidates(statics, in.world_size, space);
  }
  // What each runs at the band's largest size (f32 elements): the static values' first, then each
  // behaviour once. One not known (no static values) is tried.
  auto behaviour = [&](const OnlineCandidate& c) {
    std::map<std::string, int64_t> values = statics;
    for (const auto& [knob, value] : c.knobs) values[knob] = value;
    return KnobBehaviour(backend, values, probe, sizeof(float), in.world_size);
  };
  std::vector<std::string> seen = {behaviour(out[0])};
  for (OnlineCandidate& c : space) {
    const std::string b = behaviour(c);
    if (!b.empty()) {
      if (std::find(seen.begin(), seen.end(), b) != seen.end()) continue;
      seen.push_back(b);
    }
    if (c.reorders_floats && !in.allow_reorder) continue;
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace adaptcomm::config

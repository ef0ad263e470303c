#include "lib/config/online_tuning.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/byte_text.h"
#include "lib/config/gloo_segment.h"
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
void ShmCandidates(uint64_t probe, std::vector<OnlineCandidate>& out) {
  const int64_t half = KnobMax("shm", "flat_max_bytes");  // half a slot: the largest step
  if (probe <= static_cast<uint64_t>(half)) {
    out.push_back({"shm", "flat", {{"flat_max_bytes", half}}, false});
  }
  bool one_chunk_tried = false;
  for (uint64_t chunk : {64 * kKiB, 256 * kKiB, 1 * kMiB, 4 * kMiB}) {
    if (chunk >= probe) {
      if (one_chunk_tried) continue;  // a single chunk whatever its bound
      one_chunk_tried = true;
    }
    out.push_back({"shm",
                   absl::StrCat("two-phase/", CompactByteSizeText(chunk)),
                   {{"flat_max_bytes", 0}, {"chunk_bytes", static_cast<int64_t>(chunk)}},
                   false});
  }
}

// Gloo: the other algorithm, and ring segments of 1/4/16 MiB where a cap changes the static ring
// at the band's largest size (GlooRingSegmentCapInEffect: the profile's 0 is Gloo's 1 MiB, and a
// cap counts only past 2 * ranks segments); bcube has no segment cap. With more than two ranks
// each changes which rank starts an element's sum.
void GlooCandidates(uint64_t probe, const OnlineSpaceInputs& in,
                    std::vector<OnlineCandidate>& out) {
  const bool reorders = in.world_size > 2;
  const bool bcube = in.gloo_algorithm == "bcube";
  out.push_back({"gloo", bcube ? "ring" : "bcube", {{"algorithm", bcube ? 0 : 1}}, reorders});
  if (bcube) return;
  // Compared in bytes: the caps tried are whole MiB, a whole number of elements of any type.
  auto in_effect = [&](uint64_t segment) {
    return GlooRingSegmentCapInEffect(probe, 1, in.world_size, segment);
  };
  std::vector<uint64_t> behaviours = {in_effect(in.gloo_max_segment_bytes)};
  for (uint64_t segment : {1 * kMiB, 4 * kMiB, 16 * kMiB}) {
    const uint64_t cap = in_effect(segment);
    if (std::find(behaviours.begin(), behaviours.end(), cap) != behaviours.end()) continue;
    behaviours.push_back(cap);
    out.push_back({"gloo",
                   absl::StrCat(in.gloo_algorithm, "/seg ", CompactByteSizeText(segment)),
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
  if (backend == "shm") {
    ShmCandidates(probe, out);
  } else if (backend == "gloo") {
    GlooCandidates(probe, in, out);
  }
  if (!in.allow_reorder) {
    out.erase(std::remove_if(out.begin(), out.end(),
                             [](const OnlineCandidate& c) { return c.reorders_floats; }),
              out.end());
  }
  return out;
}

absl::Status ApplyOnlineTuningEnv(EffectiveConfig& cfg, const char* value) {
  if (value == nullptr || *value == '\0') return absl::OkStatus();
  absl::StatusOr<bool> on = ParseBool(value);
  if (!on.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOnlineTuningEnv, "='", value, "': must be 1/true/on or 0/false/off"));
  }
  const std::string source = absl::StrCat("exported ", kOnlineTuningEnv);
  cfg.tuning.online.enabled = *on;
  cfg.tuning.online.source = source;
  for (SettingRecord& s : cfg.settings) {
    if (s.key == "tuning.online.enabled") {
      s.value = *on ? "true" : "false";
      s.source = source;
    }
  }
  return absl::OkStatus();
}

}  // namespace adaptcomm::config

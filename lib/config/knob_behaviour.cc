#include "lib/config/knob_behaviour.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "lib/config/gloo_segment.h"
#include "lib/config/tuned_table.h"

namespace adaptcomm::config {
namespace {

std::optional<int64_t> Value(const std::map<std::string, int64_t>& values, const char* knob) {
  auto it = values.find(knob);
  if (it == values.end()) return std::nullopt;
  return it->second;
}

}  // namespace

std::string KnobBehaviour(std::string_view backend, const std::map<std::string, int64_t>& values,
                          uint64_t bytes, size_t element_bytes, int ranks) {
  if (backend == "shm") {
    const std::optional<int64_t> flat_max = Value(values, "flat_max_bytes");
    const std::optional<int64_t> chunk = Value(values, "chunk_bytes");
    const TunedKnobSpec* spec = FindTunedKnob("shm", "flat_max_bytes");
    if (!flat_max.has_value() || !chunk.has_value() || *chunk <= 0 || spec == nullptr) return "";
    // Half a slot (the knobs' largest value) is the most one step moves.
    const auto half = static_cast<uint64_t>(spec->max);
    if (bytes <= std::min(static_cast<uint64_t>(std::max<int64_t>(*flat_max, 0)), half)) {
      return "flat";
    }
    const uint64_t step = std::min(static_cast<uint64_t>(*chunk), half);
    return step >= bytes ? "one chunk" : absl::StrCat("chunks of ", step);
  }
  if (backend == "gloo") {
    const std::optional<int64_t> algorithm = Value(values, "algorithm");
    if (!algorithm.has_value()) return "";
    if (*algorithm == 1) return "bcube";  // neither has a segment cap
    if (*algorithm == 2) return "recursive doubling";
    const std::optional<int64_t> segment = Value(values, "max_segment_bytes");
    if (!segment.has_value()) return "";
    const uint64_t cap = GlooRingSegmentCapInEffect(
        bytes, element_bytes, ranks, static_cast<uint64_t>(std::max<int64_t>(*segment, 0)));
    return cap == 0 ? "ring" : absl::StrCat("ring, segments of at most ", cap);
  }
  return "";
}

}  // namespace adaptcomm::config

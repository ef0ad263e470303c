#include "tools/tune_plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/base/byte_text.h"
#include "lib/config/gloo_segment.h"
#include "lib/config/knob_behaviour.h"
#include "lib/config/units.h"
#include "lib/shm/shm_backend.h"

namespace adaptcomm::tools {

uint64_t ShmSlotHalf() { return ShmBackendOptions{}.slot_bytes / 2; }

absl::StatusOr<Plan> MakePlan(const TuneArgs& a, const EffectiveConfig& profile) {
  Plan p;
  p.backend = a.backend;
  p.ranks = a.ranks;
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
          {absl::StrCat("two-phase/", CompactByteSizeText(chunk)),
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
    for (uint64_t seg : {1 * kMiB, 4 * kMiB, 16 * kMiB}) {
      if (seg == config::GlooMaxSegmentBytes(static_cast<uint64_t>(segment)))
        continue;  // the static one
      p.candidates.push_back(
          {absl::StrCat(algo == 1 ? "bcube" : "ring", "/seg ", CompactByteSizeText(seg)),
           false,
           {{"algorithm", algo}, {"max_segment_bytes", static_cast<int64_t>(seg)}}});
    }
  }
  Candidate control = p.candidates[0];
  control.name = "static (A/A)";
  control.control = true;
  p.candidates.push_back(std::move(control));
  return p;
}

namespace {

// What candidate `c` actually does for `bytes` of f32 data (what tune measures).
std::string Behaviour(const Plan& p, const Candidate& c, uint64_t bytes) {
  return config::KnobBehaviour(p.backend, c.knobs, bytes, sizeof(float), p.ranks);
}

}  // namespace

std::vector<size_t> Distinct(const Plan& p, uint64_t bytes) {
  std::vector<size_t> out;
  std::vector<std::string> seen;
  for (size_t i = 0; i < p.candidates.size(); ++i) {
    if (p.candidates[i].control) {
      out.push_back(i);  // measured at every size: the twin of the static one on purpose
      continue;
    }
    std::string b = Behaviour(p, p.candidates[i], bytes);
    if (!b.empty()) {  // empty: not known, so alike nothing
      if (std::find(seen.begin(), seen.end(), b) != seen.end()) continue;
      seen.push_back(b);
    }
    out.push_back(i);
  }
  return out;
}

}  // namespace adaptcomm::tools

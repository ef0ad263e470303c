// What `adaptcomm tune` measures (issue #15): its command line, and the plan it makes of it, the
// ops, sizes and candidate knob values per backend (tools/tune_cmd.cc measures and decides).
#ifndef ADAPTCOMM_TOOLS_TUNE_PLAN_H_
#define ADAPTCOMM_TOOLS_TUNE_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "adaptcomm/profile.h"

namespace adaptcomm::tools {

inline constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

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
  std::string bind_to = "auto";  // lib/base/cpu_binding.h, as `adaptcomm launch --bind-to`
};

// One point of the tuning space: a value for every knob of the backend, used for every size.
struct Candidate {
  std::string name;
  bool is_static = false;
  std::map<std::string, int64_t> knobs;  // TunedKnobSpec::knob -> value (choice: index)
  // The A/A control: the static profile again, on a communicator of its own, never chosen; its
  // speedup over the static one is this machine's noise at each size.
  bool control = false;
};

struct Plan {
  std::string backend;  // "shm" or "gloo"
  int ranks = 2;
  std::vector<std::string> ops;
  std::vector<uint64_t> sizes;        // ascending
  std::vector<Candidate> candidates;  // [0] is the static profile, the last its A/A control
};

// The shm slot half: the largest flat exchange and chunk (ShmBackendOptions::slot_bytes / 2).
uint64_t ShmSlotHalf();

// The plan of `a` (InvalidArgument naming the flag otherwise); the Gloo candidates start from
// `profile`'s static values.
absl::StatusOr<Plan> MakePlan(const TuneArgs& a, const EffectiveConfig& profile);

// The indices of the candidates measured at `bytes`: candidates that behave alike at a size are
// measured once (the first one, so the static profile stands for every twin of it), and the A/A
// control always. Gloo ring candidates are alike where no segment cap is reached
// (GlooRingSegmentCapInEffect): every size up to 4 MiB on 2 ranks, for the caps tried.
std::vector<size_t> Distinct(const Plan& p, uint64_t bytes);

}  // namespace adaptcomm::tools

#endif  // ADAPTCOMM_TOOLS_TUNE_PLAN_H_

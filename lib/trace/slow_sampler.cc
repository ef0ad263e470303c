#include "lib/trace/slow_sampler.h"

#include <algorithm>
#include <bit>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace adaptcomm::trace {

int SlowSampler::LevelOf(uint64_t seq) {
  // SplitMix64's finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom number
  // generators"): every bit of the seq moves every bit of the hash, so its low bits are as good
  // as random and the same on every rank.
  uint64_t z = seq + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  const int zeros = z == 0 ? 64 : std::countr_zero(z);
  return std::min(zeros / 4, kLevels - 1);
}

void SlowSampler::End(uint64_t seq, bool keep, int64_t entered_ns, int64_t started_ns,
                      int64_t ended_ns) {
  const int64_t prev_entered = last_entered_ns_.load(std::memory_order_relaxed);
  const int64_t prev_ended = last_ended_ns_.load(std::memory_order_relaxed);
  last_entered_ns_.store(entered_ns, std::memory_order_relaxed);
  last_ended_ns_.store(ended_ns, std::memory_order_relaxed);
  if (!keep) return;
  const int64_t wait = ended_ns - entered_ns;
  const int64_t data = ended_ns - started_ns;
  const int64_t gap = prev_entered > 0 ? entered_ns - prev_entered : 0;
  const int64_t idle = prev_ended > 0 ? entered_ns - prev_ended : 0;
  const int top = LevelOf(seq);
  for (int level = 0; level <= top; ++level) {
    const auto l = static_cast<size_t>(level);
    const uint64_t n = next_[l].load(std::memory_order_relaxed);
    next_[l].store(n + 1, std::memory_order_relaxed);
    Slot& s = rings_[l][n % kSlots];
    // A sequence lock (Boehm, "Can seqlocks get along with programming language memory
    // models?"): the seq is 0 while the fields change, and a reader that saw it before and after
    // unchanged read one sample whole. The fields are stored with release (and read with acquire)
    // rather than fenced: a reader that reads any new field then sees the 0 too. On x86 both are
    // plain moves, and TSan, which does not model fences, checks it.
    s.seq.store(0, std::memory_order_relaxed);
    s.wait_ns.store(std::max<int64_t>(wait, 0), std::memory_order_release);
    s.data_ns.store(std::max<int64_t>(data, 0), std::memory_order_release);
    s.gap_ns.store(std::max<int64_t>(gap, 0), std::memory_order_release);
    s.idle_ns.store(std::max<int64_t>(idle, 0), std::memory_order_release);
    s.seq.store(seq, std::memory_order_release);
  }
  if (seq > last_seq_.load(std::memory_order_relaxed)) {
    last_seq_.store(seq, std::memory_order_relaxed);
  }
}

std::vector<SlowSample> SlowSampler::Collect(int level, uint64_t after) const {
  const auto l = static_cast<size_t>(std::clamp(level, 0, kLevels - 1));
  std::vector<SlowSample> out;
  for (const Slot& s : rings_[l]) {
    const uint64_t seq = s.seq.load(std::memory_order_acquire);
    if (seq == 0 || seq <= after) continue;
    SlowSample sample;
    sample.seq = seq;
    sample.wait_ns = s.wait_ns.load(std::memory_order_acquire);
    sample.data_ns = s.data_ns.load(std::memory_order_acquire);
    sample.gap_ns = s.gap_ns.load(std::memory_order_acquire);
    sample.idle_ns = s.idle_ns.load(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != seq) continue;  // overwritten meanwhile
    out.push_back(sample);
  }
  std::sort(out.begin(), out.end(),
            [](const SlowSample& a, const SlowSample& b) { return a.seq < b.seq; });
  return out;
}

int SamplingLevelFor(uint64_t ops, uint64_t per_look) {
  int level = 0;
  for (uint64_t stride = 1; level < SlowSampler::kLevels - 1 && ops / stride > per_look;
       stride *= 16) {
    ++level;
  }
  return level;
}

std::string EncodeSlowSamples(const std::string& host, const std::vector<SlowSample>& samples) {
  std::string out = absl::StrCat("host ", host, "\n");
  for (const SlowSample& s : samples) {
    absl::StrAppend(&out, s.seq, " ", s.wait_ns, " ", s.data_ns, " ", s.gap_ns, " ", s.idle_ns,
                    "\n");
  }
  return out;
}

absl::StatusOr<DecodedSlowSamples> DecodeSlowSamples(const std::string& text) {
  DecodedSlowSamples d;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (first) {
      first = false;
      if (!absl::ConsumePrefix(&line, "host ")) {
        return absl::InvalidArgumentError("slowness samples: no host line");
      }
      d.host = std::string(line);
      continue;
    }
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    SlowSample s;
    if (f.size() != 5 || !absl::SimpleAtoi(f[0], &s.seq) || !absl::SimpleAtoi(f[1], &s.wait_ns) ||
        !absl::SimpleAtoi(f[2], &s.data_ns) || !absl::SimpleAtoi(f[3], &s.gap_ns) ||
        !absl::SimpleAtoi(f[4], &s.idle_ns)) {
      return absl::InvalidArgumentError(absl::StrCat("slowness samples: bad line '", line, "'"));
    }
    d.samples.push_back(s);
  }
  if (first) return absl::InvalidArgumentError("slowness samples: empty");
  return d;
}

}  // namespace adaptcomm::trace

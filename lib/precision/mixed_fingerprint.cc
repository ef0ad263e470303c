#include "lib/precision/mixed_fingerprint.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace adaptcomm::mixed {
namespace {

constexpr int64_t kFingerprintMagic = 0x4d49584450524543;  // "MIXDPREC"

std::string Describe(const int64_t* f) {
  return absl::StrCat(OpKindName(static_cast<OpKind>(f[kFpKind])), " ",
                      ReduceOpName(static_cast<ReduceOp>(f[kFpOp])),
                      " wire=", DTypeName(static_cast<DType>(f[kFpWire])), " count=", f[kFpCountIn],
                      "->", f[kFpCountOut], " seq=", f[kFpSeq]);
}

}  // namespace

void EncodeFingerprint(const Fingerprint& fp, int64_t* f) {
  f[kFpMagic] = kFingerprintMagic;
  f[kFpKind] = static_cast<int64_t>(fp.kind);
  f[kFpOp] = static_cast<int64_t>(fp.kind == OpKind::kAllgather ? ReduceOp::kSum : fp.op);
  f[kFpWire] = static_cast<int64_t>(fp.wire);
  f[kFpCountIn] = static_cast<int64_t>(fp.count_in);
  f[kFpCountOut] = static_cast<int64_t>(fp.count_out);
  f[kFpSeq] = static_cast<int64_t>(fp.seq);
  f[kFpFailed] = fp.hook_failed ? 1 : 0;
  f[kFpOverflow] = static_cast<int64_t>(fp.overflow);
  f[kFpNonfinite] = static_cast<int64_t>(fp.nonfinite);
}

absl::Status JudgeFingerprints(const int64_t* all, int n, const Fingerprint& mine,
                               const absl::Status& own_hook_failure, OverflowPolicy policy,
                               int64_t* total_overflow, bool* resend) {
  const int64_t* ref = all;
  std::vector<std::string> differ, failed, overflowed;
  *total_overflow = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t* g = all + static_cast<size_t>(r) * kFingerprintFields;
    bool same = g[kFpMagic] == kFingerprintMagic;
    for (int k = kFpKind; k <= kFpSeq; ++k) same = same && g[k] == ref[k];
    if (!same) {
      differ.push_back(g[kFpMagic] == kFingerprintMagic
                           ? absl::StrCat("rank ", r, " has {", Describe(g), "}")
                           : absl::StrCat("rank ", r, " is not in a mixed-precision op"));
    }
    if (g[kFpFailed] != 0) failed.push_back(absl::StrCat(r));
    if (g[kFpOverflow] > 0) overflowed.push_back(absl::StrCat("rank ", r, ": ", g[kFpOverflow]));
    *total_overflow += g[kFpOverflow];
  }
  if (!differ.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("mismatched mixed-precision collectives: ", "rank 0 has {", Describe(ref),
                     "}, ", absl::StrJoin(differ, ", ")));
  }
  if (!failed.empty()) {
    if (!own_hook_failure.ok()) return own_hook_failure;
    return absl::AbortedError(absl::StrCat("mixed-precision ", OpKindName(mine.kind), " seq ",
                                           mine.seq, " aborted: a hook failed on rank(s) ",
                                           absl::StrJoin(failed, ", ")));
  }
  if (mine.wire == DType::kF16 && *total_overflow > 0) {
    if (policy == OverflowPolicy::kFail) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fp16 wire overflow in mixed ", OpKindName(mine.kind), " seq ", mine.seq, ": ",
          *total_overflow, " finite values have |x| >= 65520 (", absl::StrJoin(overflowed, ", "),
          "); policy=fail. Use a bf16 wire or OverflowPolicy::kResendBF16"));
    }
    if (policy != OverflowPolicy::kReport) *resend = true;
  }
  return absl::OkStatus();
}

bool AnyNonfiniteInput(const int64_t* all, int n) {
  for (int r = 0; r < n; ++r) {
    if (all[static_cast<size_t>(r) * kFingerprintFields + kFpNonfinite] != 0) return true;
  }
  return false;
}

}  // namespace adaptcomm::mixed

// The fingerprint a mixed-precision op exchanges at the global barrier (and before an fp16 overflow
// decision): what each rank is calling, whether its hooks failed, and its cast counts. Shared by
// the host path (mixed_runner.cc) and the device path (mixed_device.cc), so both judge alike and
// give the same messages.
#ifndef ADAPTCOMM_LIB_PRECISION_MIXED_FINGERPRINT_H_
#define ADAPTCOMM_LIB_PRECISION_MIXED_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "adaptcomm/precision.h"

namespace adaptcomm::mixed {

// One rank's fingerprint is kFingerprintFields int64 values (exchanged as DType::kI64).
enum FingerprintField : int {
  kFpMagic,
  kFpKind,
  kFpOp,
  kFpWire,
  kFpCountIn,
  kFpCountOut,
  kFpSeq,
  kFpFailed,  // 1: a hook of this rank threw before the collective
  kFpOverflow,
  kFpNonfinite,
  kFingerprintFields,
};

struct Fingerprint {
  OpKind kind = OpKind::kAllreduce;
  ReduceOp op = ReduceOp::kSum;
  DType wire = DType::kBF16;
  size_t count_in = 0;
  size_t count_out = 0;
  uint64_t seq = 0;
  bool hook_failed = false;
  uint64_t overflow = 0;
  uint64_t nonfinite = 0;
};

void EncodeFingerprint(const Fingerprint& fp, int64_t* out);

// Judges every rank's fingerprint (`all`: n of them, in rank order), identically on every rank:
// FailedPrecondition naming each rank whose op differs from rank 0's; Aborted naming the ranks
// whose hook failed (or `own_hook_failure` when it failed here); with an fp16 wire and overflow
// somewhere, InvalidArgument under OverflowPolicy::kFail, else `resend` is set unless the policy is
// kReport. `total_overflow` gets the sum over ranks.
[[nodiscard]] absl::Status JudgeFingerprints(const int64_t* all, int n, const Fingerprint& mine,
                                             const absl::Status& own_hook_failure,
                                             OverflowPolicy policy, int64_t* total_overflow,
                                             bool* resend);

// Whether any rank's fingerprint counted NaN/Inf inputs.
bool AnyNonfiniteInput(const int64_t* all, int n);

}  // namespace adaptcomm::mixed

#endif  // ADAPTCOMM_LIB_PRECISION_MIXED_FINGERPRINT_H_

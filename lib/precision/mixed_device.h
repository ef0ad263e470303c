// The device (CUDA view) path of the mixed-precision collectives (adaptcomm/precision.h). It only
// calls the CUDA seam (lib/cuda/cuda_api.h) the communicator was built with
// (internal::CommunicatorCudaApi), never CUDA itself, so it is tested on the fake at that seam and
// needs no GPU to build.
//
// Per call, on the caller's stream S = input.stream and the context's communication stream B:
//   cast fp32 -> wire on S (CUDA kernel) | barrier | collective on the wire buffer on B (NCCL
//   reduces bf16/fp16 natively; avg is a sum, scaled in fp32 by the cast back) | barrier |
//   cast back wire -> fp32 with the scale, on S | the counters read back, S waited for.
// Barriers:
//   kStream: EventRecord(cast_done, S); StreamWaitEvent(B, cast_done) - no host stall before the
//     collective; after it EventRecord(coll_done, B); StreamWaitEvent(S, coll_done).
//   kHost: the host waits (bounded event poll) for the cast on S before issuing the collective,
//     and for B after it.
//   kGlobal: kHost plus the fingerprint allgather (the host path's layout and messages, exchanged
//     through device scratch because an NCCL communicator takes no host buffers) and a Barrier
//     after the collective.
//   debug_skip_host_barrier (TEST ONLY) skips the wait before the collective at every level: the
//     collective may read the wire buffer before the cast wrote it (the article's race).
// The call stays synchronous, as documented for the host path: it returns when `output` holds the
// result (the host waits for S at the end: after the collective that costs only the cast back).
// Differences from the host path:
//   * accumulate_fp32 and pipeline_chunk_bytes do not apply: the wire collective is the backend's
//     (NCCL's) own bf16/fp16 reduction (error bound: "backend accumulation" in precision.h).
//   * hooks run on the calling thread at the same points, with wire_data == nullptr and
//     wire_count == 0 (the wire buffer is device memory); with kStream, kAfterCast runs when the
//     cast is queued, not finished.
//   * cast_time is the time to queue the cast (plus the wait, for kHost/kGlobal).
//   * the fp16 overflow guard (OverflowPolicy other than kReport) reads the device counter back
//     before the collective: one host wait on S per call even with kStream, plus the count
//     exchange; for allreduce another wait to count the NaN/Inf of the fp16 result.
// Scratch (device wire buffers, 2 counters, pinned read-back, fingerprints), the communication
// stream and the events are made on first use, grow to the largest op, and are freed with the
// context. Errors: InvalidArgument for views (ValidateMixedDeviceViews), FailedPrecondition when
// no CUDA runtime or no cast kernels were built, Internal for a failing CUDA call, DeadlineExceeded
// when a stream wait passes opts.timeout (default 5 min), and what the collectives return.
#ifndef ADAPTCOMM_LIB_PRECISION_MIXED_DEVICE_H_
#define ADAPTCOMM_LIB_PRECISION_MIXED_DEVICE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adaptcomm/precision.h"

namespace adaptcomm {

// What the host runner (mixed_runner.h) hands the device path.
struct DeviceMixedCall {
  // The context's device state slot (MixedPrecisionContext::State::device; its call_mu is held).
  std::shared_ptr<void>* device_state = nullptr;
  Communicator* comm = nullptr;
  OpKind kind = OpKind::kAllreduce;
  TensorView input;
  TensorView output;
  const MixedOptions* opts = nullptr;
  uint64_t seq = 0;
  absl::Status* hook_failure = nullptr;  // set by call_hooks when a hook threw
  std::function<void(HookPoint, DType)> call_hooks;
};

// Views of a mixed op where either is on CUDA: both on the same CUDA device and stream.
absl::Status ValidateMixedDeviceViews(const char* op_name, const TensorView& input,
                                      const TensorView& output);

// Runs the op (validated) on the device; fills MixedStats as the host path does.
absl::StatusOr<MixedStats> RunMixedOnDevice(const DeviceMixedCall& call);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_PRECISION_MIXED_DEVICE_H_

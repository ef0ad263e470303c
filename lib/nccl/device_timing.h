// Device timing of the NCCL backend's stream-ordered ops: how long the device executed an op, for
// the per-op timing record (lib/trace/metrics.h: the execution-time histogram and the fail-slow
// detector's data phase), where the host sees only when it launched the op and when the watchdog
// found it done.
//
// A sampled op (DeviceTimingSampled: one in `every`, the same seqs on every rank) takes two CUDA
// events created with timing enabled, from a pool of their own (EventPool with timing). Launch
// records the first on the communicator's stream after that stream's wait for the op's issue
// point (and after the in-place alltoall's staging copy), right before the NCCL call, and the
// second right after the call, before the op's done event. Nothing waits on them: no stream waits
// for either, and the host never synchronizes with them. The watchdog, which already polls the
// done event with cudaEventQuery, reads them once the op is done (ReadDeviceTime: a cudaEventQuery
// of each, never a cudaEventSynchronize or a stream synchronize, then cudaEventElapsedTime only
// when both are complete).
//
// On abort: ncclCommAbort ends the kernels, the op fails, its time is never read; its events go
// back to the pool with the op's other events when the last holder of the op lets go, and the pool
// destroys them with the backend's shared state (nothing dangles).
// Under CUDA graph capture: no timing. An op whose caller's stream captures is refused at issue
// (MarkIssue, RefuseIfCapturing) before any event is taken or recorded, so a timing event is never
// recorded into a graph (where a query of it would invalidate the capture).
#ifndef ADAPTCOMM_LIB_NCCL_DEVICE_TIMING_H_
#define ADAPTCOMM_LIB_NCCL_DEVICE_TIMING_H_

#include <cstdint>
#include <optional>

#include "absl/time/time.h"
#include "lib/cuda/cuda_api.h"

namespace adaptcomm::nccl {

// Whether op `seq` is timed on the device when one op in `every` is (0 or less: none; 1: all).
// From a hash of the seq alone: every rank times the same ops (the fail-slow detector compares
// them across ranks), and a trainer's period (16 bucket allreduces per step) does not alias with
// it as seq % every would.
bool DeviceTimingSampled(uint64_t seq, int every);

// The time between `start` and `end` (timing events recorded on one stream, in that order), if
// both are complete; nullopt if either is not, or the runtime cannot tell. Two cudaEventQuery and
// one cudaEventElapsedTime, in thread-local capture mode (as the watchdog's completion query: a
// query in global mode would invalidate a graph another thread is capturing). Never blocks.
std::optional<absl::Duration> ReadDeviceTime(cuda::CudaApi& api, cuda::CudaEvent start,
                                             cuda::CudaEvent end);

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_DEVICE_TIMING_H_

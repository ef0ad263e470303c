// The staging buffer of the NCCL backend's in-place alltoall. An alltoall whose output overlaps its
// input cannot run on the buffer itself: built from grouped ncclSend/ncclRecv (NCCL before 2.28),
// the receive from peer p writes block p while the send of block p to p may not have read it yet,
// so a rank sends a block a peer already overwrote. ncclAlltoAll (2.28+) does not document
// in-place operation either (NCCL's collective functions say "in-place operation will happen if
// sendbuff == recvbuff" for every collective but alltoall). The input is therefore copied into
// this buffer first, on the op's stream (cudaMemcpyAsync, ordered before the NCCL call), and sent
// from there.
//
// One buffer per backend, grow-only and reused by every later in-place alltoall: once the largest
// size was seen, an op costs one device-to-device copy and no allocation. A buffer outgrown is kept
// until the backend goes (work already queued on the device may still read it: a stream-ordered
// launch does not wait for the ops before it) and freed with the rest; growth doubles, so what is
// kept is less than the largest buffer again.
//
// Allocation is cudaMalloc, on growth only, in thread-local capture mode (the allocation is not
// part of anyone's graph, and in CUDA's default global mode a cudaMalloc on this thread would
// invalidate a capture another thread has open). The backend refuses an op whose own stream
// captures before anything reaches this buffer (RefuseIfCapturing); if the calling thread itself is
// capturing another stream, cudaMalloc is refused by CUDA and Reserve returns FailedPrecondition
// saying to run one in-place alltoall of that size before the capture (the buffer is then kept) or
// to pass separate buffers.
//
// Thread safety: none; used by the thread that runs the backend's ops (one at a time).
#ifndef ADAPTCOMM_LIB_NCCL_ALLTOALL_STAGING_H_
#define ADAPTCOMM_LIB_NCCL_ALLTOALL_STAGING_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "adaptcomm/ext/backend.h"
#include "lib/cuda/cuda_api.h"

namespace adaptcomm::nccl {

// Whether `op` is an alltoall whose output bytes overlap its input bytes.
bool NeedsAlltoallStaging(const OpDesc& op);

class AlltoallStaging {
 public:
  AlltoallStaging(std::shared_ptr<cuda::CudaApi> cuda, int device)
      : cuda_(std::move(cuda)), device_(device) {}
  // Frees every buffer (cudaFree waits for the device work that may still read them).
  ~AlltoallStaging();
  AlltoallStaging(const AlltoallStaging&) = delete;
  AlltoallStaging& operator=(const AlltoallStaging&) = delete;

  // A device buffer of at least `bytes` on the backend's device (the calling thread's current
  // device must be it). FailedPrecondition when the calling thread captures a CUDA graph (see the
  // file comment), ResourceExhausted when cudaMalloc fails otherwise; nothing is queued then.
  absl::StatusOr<void*> Reserve(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  const std::shared_ptr<cuda::CudaApi> cuda_;
  const int device_;
  void* buffer_ = nullptr;
  size_t capacity_ = 0;
  std::vector<void*> outgrown_;
};

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_ALLTOALL_STAGING_H_

// A fault-injecting fake GPU of one rank for CPU-only tests: it implements both seams, the CUDA
// runtime (cuda::CudaApi) and NCCL (nccl::NcclApi), over one fake device state, so a test hands the
// same object to whoever takes either (CreateNcclBackend, internal::CommunicatorDeps). "Device
// memory" is ordinary host memory (tagged cuda:N by the test); copies are memcpy; collectives are
// computed across the ranks of one FakeNcclWorld (ranks are threads) once every rank has launched
// its part, so an op launched by one rank completes only when its peers launch theirs, as on a GPU.
//
// Streams are modelled only as far as the device paths need to show that their ordering matters:
// LaunchCast and MemcpyAsync are DEFERRED, queued on their stream, and run (a cast on the CPU
// reference kernels of lib/precision) only when something forces that stream: any later call on
// the same stream (in order), StreamSynchronize, an EventQuery of an event recorded on it after
// the work, or a StreamWaitEvent on such an event (the waiting stream's later work needs it). A
// collective on another stream that did not wait reads whatever the buffer held before (a cast
// racing its collective), and a copy queued behind a point that a collective waited for runs
// after that collective wrote the buffer. A collective behind deferred work of its stream is
// queued too (enqueuing never waits for the stream, as on a GPU). A copy queued on a stream
// whose last collective has not finished waits for it (a reused buffer that collective still
// reads). Every other call behaves as before (immediately), after flushing its stream's deferred
// work.
// Sends and receives (grouped) move each message when both its ends are posted, reading the
// sender's buffer then: an alltoall built from them with its output on its input overwrites
// blocks a peer has yet to read, as on a GPU. The native ncclAlltoAll refuses overlapping
// buffers (ncclInvalidArgument): NCCL does not document it in place.
// HoldStreams(true) models a GPU that has not run anything yet: collectives too (and groups, as
// one launch at ncclGroupEnd) are queued on their stream and none starts, whatever forces the
// stream, until HoldStreams(false); then a forced stream (EventQuery, StreamSynchronize, ...)
// launches them in order. StepHeldDevice() models the device's own progress while held: one more
// collective runs, as a GPU would finish it whether or not the host asks. CUDA graph capture
// (stream capture, CUDA C++ Programming Guide), as far as these calls go: BeginCapture(stream) puts
// a stream in capture mode on the calling thread. Work queued on a capturing stream (copies, casts,
// memsets, host functions, collectives, event records) is recorded in the capture and never runs. A
// stream that waits on an event recorded in a capture joins that capture. What CUDA forbids fails
// as CUDA fails it, and invalidates the capture (EndCapture then returns
// kCudaErrorStreamCaptureInvalidated): querying an event recorded in a capture
// (kCudaErrorCapturedEvent), synchronizing a capturing stream, a capturing stream waiting on an
// event recorded outside its capture (kCudaErrorStreamCaptureIsolation), and the "potentially
// unsafe" calls EventQuery and Malloc made by a thread whose capture mode
// (ThreadExchangeStreamCaptureMode, per thread) forbids them while a capture is open
// (kCudaErrorStreamCaptureUnsupported): in kGlobal mode (the default) any capture in kGlobal mode,
// in kThreadLocal mode only the thread's own.
#ifndef ADAPTCOMM_TESTS_FAKE_NCCL_API_H_
#define ADAPTCOMM_TESTS_FAKE_NCCL_API_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/cuda/cuda_api.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::testing {

class FakeNcclWorld;  // shared "network" of the fake ranks; create with MakeFakeNcclWorld()
std::shared_ptr<FakeNcclWorld> MakeFakeNcclWorld();

struct FakeNcclFaults {
  int version = 22809;  // what ncclGetVersion reports
  int device_count = 1;
  int device_count_error = cuda::kCudaSuccess;  // e.g. kCudaErrorNoDevice
  std::string library_path = "fake://libnccl.so.2";
  bool init_fails = false;           // init's asynchronous result becomes ncclSystemError
  int init_fails_first = 0;          // ... for only the first this many inits of this fake
  bool init_never_finishes = false;  // init stays ncclInProgress until aborted
  bool init_invalid_usage = false;   // ncclCommInitRankConfig returns ncclInvalidUsage
  int async_error_at_launch = 0;     // 1-based launch that fails asynchronously (never completes)
  // ... on every NCCL communicator this fake makes (0), or only on the n-th (1-based): a rebuilt
  // communicator then runs the op that failed.
  int async_error_on_comm = 0;
  nccl::NcclResult async_error = nccl::NcclResult::kRemoteError;
  int hang_at_launch = 0;  // 1-based launch that never completes, without any error
  // 1-based launch whose collective runs (the peers complete it, this rank's buffers get the
  // result) but whose completion this rank never sees, without any error: a rank the others
  // finished an op with, then lost. On this fake's first NCCL communicator only.
  int completion_lost_at_launch = 0;
  absl::Duration abort_hangs_for = absl::ZeroDuration();    // ncclCommAbort blocks this long
  absl::Duration event_query_takes = absl::ZeroDuration();  // a slow driver: each cudaEventQuery
  bool host_alloc_fails = false;
  int launch_cast_error = cuda::kCudaSuccess;  // LaunchCast returns this (nothing is queued)
  // ncclCommShrink (NCCL 2.27+): advertised (has_comm_shrink) and implemented: the survivors that
  // call it on one parent communicator with the same exclusion list meet in a new group, ranks
  // renumbered densely; NCCL_SHRINK_ABORT first ends the parent's ops (as ncclCommAbort would).
  // Without the flag a parent in error refuses (ncclInvalidUsage).
  bool has_comm_shrink = false;
  bool shrink_fails = false;  // the new communicator's asynchronous result is ncclSystemError
  // ncclCommSplit (NCCL 2.18+): advertised (has_comm_split) and implemented: the i-th split of a
  // parent communicator completes once every rank of the parent called its i-th split; each color
  // is then a new group, ranked by key, then parent rank. kSplitNoColor gets no communicator.
  bool has_comm_split = true;
  // The new communicator's asynchronous result is ncclSystemError, and its peers' ncclRemoteError.
  bool split_fails = false;
  // ncclAlltoAll (NCCL 2.28+): advertised (has_alltoall) and implemented as a collective.
  bool has_alltoall = false;
  // cudaEventElapsedTime between two complete timing events: this many milliseconds (the fake
  // has no device clock).
  float event_elapsed_ms = 0.25f;
  bool timing_events_unsupported = false;  // EventCreateWithTiming: kCudaErrorNotSupported
};

// One call on the seam, in the order this rank made them (FakeNcclApi::calls()).
struct FakeCall {
  std::string name;  // "LaunchCast", "EventRecord", "StreamWaitEvent", "AllReduce", ...
  void* stream = nullptr;
  void* event = nullptr;  // EventRecord / StreamWaitEvent
  std::string detail;     // LaunchCast: "f32->bf16" etc.; collectives: the dtype code
};

class FakeNcclApi final : public cuda::CudaApi, public nccl::NcclApi {
 public:
  FakeNcclApi(std::shared_ptr<FakeNcclWorld> world, FakeNcclFaults faults);
  ~FakeNcclApi() override;

  // Observations.
  int abort_calls() const { return abort_calls_.load(); }
  int finalize_calls() const { return finalize_calls_.load(); }
  int destroy_calls() const { return destroy_calls_.load(); }
  int init_calls() const { return init_calls_.load(); }
  int shrink_calls() const { return shrink_calls_.load(); }
  int split_calls() const { return split_calls_.load(); }
  // (color, key) of every ncclCommSplit this rank made, in order.
  std::vector<std::pair<int, int>> split_args() const;
  std::vector<int> last_shrink_flags() const;  // shrinkFlags of every ncclCommShrink, in order
  int memcpy_calls() const { return memcpy_calls_.load(); }
  int malloc_calls() const { return malloc_calls_.load(); }
  int cast_calls() const { return cast_calls_.load(); }
  int pointer_queries() const { return pointer_queries_.load(); }  // PointerGetAttributes
  // Collectives (or groups) posted to the world so far: started "on the device".
  int collectives_started() const;
  void HoldStreams(bool hold);
  // While held: runs the next queued collective (of the first stream that has one), with what is
  // queued before it and the event records right after it. Returns how many it started (0 or 1).
  int StepHeldDevice();
  // Every call on the seam that touches a stream or an event, in order.
  std::vector<FakeCall> calls() const;
  void ClearCalls();
  nccl::NcclCommConfig last_config() const;
  std::vector<nccl::NcclDataType> dtypes_seen() const;
  std::vector<nccl::NcclRedOp> ops_seen() const;
  // Pointers inside [p, p + bytes) are reported as host memory by PointerGetAttributes.
  void MarkHost(const void* p, size_t bytes);
  // cudaStreamBeginCapture(stream, mode) on the calling thread (see the top of this file).
  void BeginCapture(cuda::CudaStream stream, cuda::CaptureMode mode = cuda::CaptureMode::kGlobal);
  // cudaStreamEndCapture: kCudaSuccess, or kCudaErrorStreamCaptureInvalidated when a forbidden
  // call invalidated the capture. Every stream that joined the capture leaves it.
  int EndCapture(cuda::CudaStream stream);
  int event_queries() const { return event_queries_.load(); }  // EventQuery calls, all threads
  // Device timing: events created with timing (EventCreateWithTiming), EventElapsedTime calls,
  // and those that found an event not complete (kCudaErrorNotReady: the caller asked too early).
  int timing_events_created() const { return timing_events_created_.load(); }
  int elapsed_calls() const { return elapsed_calls_.load(); }
  int elapsed_not_ready() const { return elapsed_not_ready_.load(); }
  // Events created and not destroyed yet (both kinds).
  int events_alive() const;

  // CudaApi
  int GetDeviceCount(int* count) override;
  int SetDevice(int device) override;
  int GetDevice(int* device) override;  // per thread, as CUDA's (0 until set)
  int DriverVersion(int* version) override;
  int RuntimeVersion(int* version) override;
  int PointerGetAttributes(const void* ptr, cuda::PointerInfo* info) override;
  int StreamCreateNonBlocking(cuda::CudaStream* stream) override;
  int StreamDestroy(cuda::CudaStream stream) override;
  int EventCreateDisableTiming(cuda::CudaEvent* event) override;
  // An event whose EventElapsedTime works (cudaEventDefault). EventElapsedTime: the
  // 400 (cudaErrorInvalidResourceHandle) CUDA returns for an unknown event or one created without
  // timing, kCudaErrorCapturedEvent for one recorded in a capture, kCudaErrorNotReady while
  // either is not complete (it never forces a stream: a real cudaEventElapsedTime does not wait),
  // else faults.event_elapsed_ms.
  int EventCreateWithTiming(cuda::CudaEvent* event) override;
  int EventElapsedTime(float* ms, cuda::CudaEvent start, cuda::CudaEvent end) override;
  int EventRecord(cuda::CudaEvent event, cuda::CudaStream stream) override;
  int EventQuery(cuda::CudaEvent event) override;
  int EventDestroy(cuda::CudaEvent event) override;
  int MemcpyAsync(void* dst, const void* src, size_t bytes, cuda::MemcpyKind kind,
                  cuda::CudaStream stream) override;
  int Malloc(void** ptr, size_t bytes) override;
  int Free(void* ptr) override;
  int HostAlloc(void** ptr, size_t bytes) override;
  int FreeHost(void* ptr) override;
  int LaunchHostFunc(cuda::CudaStream stream, void (*fn)(void*), void* arg) override;
  std::string ErrorString(int error) override;
  int StreamWaitEvent(cuda::CudaStream stream, cuda::CudaEvent event) override;
  int StreamSynchronize(cuda::CudaStream stream) override;
  int StreamGetDevice(cuda::CudaStream stream, int* device) override;
  int MemsetAsync(void* ptr, int value, size_t bytes, cuda::CudaStream stream) override;
  int StreamIsCapturing(cuda::CudaStream stream, cuda::CaptureStatus* status) override;
  int ThreadExchangeStreamCaptureMode(cuda::CaptureMode* mode) override;
  int LaunchCast(cuda::CastDirection direction, const void* src, void* dst, size_t count,
                 float scale, cuda::CudaStream stream, cuda::DeviceCastCounters* counters) override;

  // NcclApi
  std::string library_path() const override { return faults_.library_path; }
  nccl::NcclResult GetVersion(int* version) override;
  nccl::NcclResult GetUniqueId(nccl::NcclUniqueId* id) override;
  nccl::NcclResult CommInitRankConfig(nccl::NcclComm* comm, int nranks,
                                      const nccl::NcclUniqueId& id, int rank,
                                      const nccl::NcclCommConfig& config) override;
  nccl::NcclResult CommGetAsyncError(nccl::NcclComm comm, nccl::NcclResult* async_error) override;
  nccl::NcclResult CommFinalize(nccl::NcclComm comm) override;
  nccl::NcclResult CommDestroy(nccl::NcclComm comm) override;
  nccl::NcclResult CommAbort(nccl::NcclComm comm) override;
  std::string GetErrorString(nccl::NcclResult result) override;
  std::string GetLastError(nccl::NcclComm comm) override;
  nccl::NcclResult GroupStart() override;
  nccl::NcclResult GroupEnd() override;
  nccl::NcclResult AllReduce(const void* send, void* recv, size_t count, nccl::NcclDataType dtype,
                             nccl::NcclRedOp op, nccl::NcclComm comm,
                             cuda::CudaStream stream) override;
  nccl::NcclResult Broadcast(const void* send, void* recv, size_t count, nccl::NcclDataType dtype,
                             int root, nccl::NcclComm comm, cuda::CudaStream stream) override;
  nccl::NcclResult Reduce(const void* send, void* recv, size_t count, nccl::NcclDataType dtype,
                          nccl::NcclRedOp op, int root, nccl::NcclComm comm,
                          cuda::CudaStream stream) override;
  nccl::NcclResult AllGather(const void* send, void* recv, size_t send_count,
                             nccl::NcclDataType dtype, nccl::NcclComm comm,
                             cuda::CudaStream stream) override;
  nccl::NcclResult ReduceScatter(const void* send, void* recv, size_t recv_count,
                                 nccl::NcclDataType dtype, nccl::NcclRedOp op, nccl::NcclComm comm,
                                 cuda::CudaStream stream) override;
  nccl::NcclResult Send(const void* send, size_t count, nccl::NcclDataType dtype, int peer,
                        nccl::NcclComm comm, cuda::CudaStream stream) override;
  nccl::NcclResult Recv(void* recv, size_t count, nccl::NcclDataType dtype, int peer,
                        nccl::NcclComm comm, cuda::CudaStream stream) override;
  bool has_alltoall() const override { return faults_.has_alltoall; }
  nccl::NcclResult AlltoAll(const void* send, void* recv, size_t count, nccl::NcclDataType dtype,
                            nccl::NcclComm comm, cuda::CudaStream stream) override;
  bool has_comm_split() const override { return faults_.has_comm_split; }
  nccl::NcclResult CommSplit(nccl::NcclComm comm, int color, int key, nccl::NcclComm* newcomm,
                             const nccl::NcclCommConfig* config) override;
  bool has_comm_shrink() const override { return faults_.has_comm_shrink; }
  nccl::NcclResult CommShrink(nccl::NcclComm comm, const std::vector<int>& exclude_ranks,
                              nccl::NcclComm* newcomm, const nccl::NcclCommConfig* config,
                              int shrink_flags) override;

  struct State;  // in the .cc

 private:
  const std::shared_ptr<FakeNcclWorld> world_;
  const FakeNcclFaults faults_;
  std::unique_ptr<State> state_;
  std::atomic<int> abort_calls_{0};
  std::atomic<int> finalize_calls_{0};
  std::atomic<int> destroy_calls_{0};
  std::atomic<int> init_calls_{0};
  std::atomic<int> shrink_calls_{0};
  std::atomic<int> split_calls_{0};
  std::atomic<int> memcpy_calls_{0};
  std::atomic<int> malloc_calls_{0};
  std::atomic<int> cast_calls_{0};
  std::atomic<int> pointer_queries_{0};
  std::atomic<int> event_queries_{0};
  std::atomic<int> timing_events_created_{0};
  std::atomic<int> elapsed_calls_{0};
  std::atomic<int> elapsed_not_ready_{0};
};

// One fake per rank of one fake world; rank `failing_rank`'s injects `failing`.
std::vector<std::shared_ptr<FakeNcclApi>> FakesWithFailingRank(int world_size, int failing_rank,
                                                               const FakeNcclFaults& failing);

// `fake` as a rank's CUDA runtime and NCCL, for creation and every rebuild.
internal::CommunicatorDeps FakeSeams(const std::shared_ptr<FakeNcclApi>& fake);

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_FAKE_NCCL_API_H_

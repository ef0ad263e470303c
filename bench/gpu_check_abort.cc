// bench/gpu_check_abort: two ranks on one GPU, a communicator aborted mid-allreduce while a
// consumer kernel on the trainer's stream reads the result (`bench/gpu_check.sh two-rank-abort`
// starts the two processes; docs/gpu.md, "Two ranks on one GPU: an abort mid-allreduce").
//
// Each rank runs a trainer's loop on cuda:0 with the NCCL backend: a fill kernel writes the rank's
// input on the trainer's stream, Allreduce on that stream, Work::Wait() (which releases the stream
// without waiting for the device), then a consumer kernel on the same stream copies the result into
// a "seen" buffer and counts the elements that are not the full sum into a device counter.
//
// The fault: at one step rank 1 stops itself (SIGSTOP) right after its allreduce and its consumer
// were queued; a helper process continues it 1 s after the op timeout (2 s, or 20 times the
// slowest warm-up op, at most 8 s). Its NCCL proxy thread stops with it, so the allreduce of both
// ranks hangs part way (over sockets NCCL moves data through the proxies); rank 0's op runs past
// its timeout and its communicator is aborted (ncclCommAbort), which
// also completes the op's end event that the consumer's stream waits on: the consumer then reads
// whatever the aborted allreduce left in the buffer. What adaptcomm must guarantee:
//   steps   (BeginStep/CommitStep, retry.replay auto): a step whose CommitStep returned OK had its
//           consumer see the full sum in every element; a failed step comes back IsStepRedo on
//           both ranks and is redone; every step commits; the final buffer is the fault-free
//           result bit for bit;
//   single ops (no steps, retry.replay copy): each op either succeeds with its consumer seeing
//           the full sum, or reports the loss (DataLoss, or the peer's failure naming it): never
//           OK after its consumer read a partial sum.
// One line per rank and variant, then "two-rank-abort rank R: PASS|FAIL". Exit 0: pass, 1: fail,
// 77: no CUDA device (skip).
//
//   gpu_check_abort --probe       no CUDA device: exit 77; else the GPUs and NCCL's version
//   gpu_check_abort --free-port   a free TCP port on 127.0.0.1
//   gpu_check_abort               one rank: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
#include "bench/gpu_check_abort.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/status.h"
#include "adaptcomm/store.h"
#include "lib/cuda/cuda_api.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::gpu_check_abort {
namespace {

// The communicator's op timeout and failure report window (the vote waits timeout + window for
// the stopped rank), as tests/fault_test.cc's stopped-rank test, which runs the same fault on host
// buffers. The checked allreduces get a timeout of their own (WarmUp): two ranks time-slice one
// GPU here, which may make an op much slower than on two GPUs. Rank 1 stays stopped for that
// timeout + kStopMargin, so rank 0's op times out first and rank 1 is back within the vote.
constexpr absl::Duration kOpTimeout = absl::Seconds(2);
constexpr absl::Duration kMaxOpTimeout = absl::Seconds(8);
constexpr absl::Duration kStopMargin = absl::Seconds(1);
constexpr absl::Duration kReportWindow = absl::Seconds(4);
// Bounds of the host's waits for the device: none of them may hang the check.
constexpr absl::Duration kDeviceBound = absl::Seconds(60);
constexpr int kSteps = 24, kFaultStep = 8;  // steps variant
constexpr int kOps = 16, kFaultOp = 6;      // single-op variant
constexpr int kMaxAttempts = 4;             // of one step

std::shared_ptr<cuda::CudaApi> g_cuda;

std::string CudaError(int e) { return absl::StrCat(g_cuda->ErrorString(e), " (", e, ")"); }

// Waits, bounded, until `stream` has run what was queued on it.
absl::Status Drain(void* stream) {
  void* ev = nullptr;
  if (int e = g_cuda->EventCreateDisableTiming(&ev); e != cuda::kCudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaEventCreate: ", CudaError(e)));
  }
  int e = g_cuda->EventRecord(ev, stream);
  const absl::Time deadline = absl::Now() + kDeviceBound;
  for (int i = 0; e == cuda::kCudaSuccess; ++i) {
    e = g_cuda->EventQuery(ev);
    if (e != cuda::kCudaErrorNotReady) break;
    if (absl::Now() > deadline) {
      g_cuda->EventDestroy(ev);
      return absl::DeadlineExceededError(absl::StrCat("the trainer's stream did not drain within ",
                                                      absl::FormatDuration(kDeviceBound)));
    }
    cuda::PollPause(i);
  }
  g_cuda->EventDestroy(ev);
  if (e != cuda::kCudaSuccess) {
    return absl::InternalError(absl::StrCat("the trainer's stream: ", CudaError(e)));
  }
  return absl::OkStatus();
}

struct DeviceMemory {
  void* p = nullptr;
  explicit DeviceMemory(size_t bytes) {
    if (g_cuda->Malloc(&p, bytes) != cuda::kCudaSuccess) p = nullptr;
  }
  ~DeviceMemory() {
    if (p != nullptr) g_cuda->Free(p);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

// Stops this process for a while: what a rank descheduled, swapped out or stuck in the kernel
// looks like to its peers (every thread stops, NCCL's proxy included; its kernels keep spinning on
// the GPU). The helper that continues it is forked ahead of time (Arm), so that the stop itself
// (Stop) comes within microseconds of the op's launch, before the allreduce can finish.
class StopHelper {
 public:
  explicit StopHelper(absl::Duration stopped) : stopped_(stopped) {}
  bool Arm() {
    if (pipe(fds_) != 0) return false;
    const pid_t self = getpid();
    pid_ = fork();
    if (pid_ == 0) {  // only async-signal-safe calls in the child of a CUDA process
      close(fds_[1]);
      char go = 0;
      if (read(fds_[0], &go, 1) == 1) {
        usleep(static_cast<useconds_t>(absl::ToInt64Microseconds(stopped_)));
        kill(self, SIGCONT);
      }
      _exit(0);
    }
    close(fds_[0]);
    return pid_ > 0;
  }
  // Returns once continued; the time it was stopped.
  absl::Duration Stop() {
    const absl::Time start = absl::Now();
    const char go = 1;
    if (write(fds_[1], &go, 1) == 1) raise(SIGSTOP);
    close(fds_[1]);
    waitpid(pid_, nullptr, 0);
    return absl::Now() - start;
  }

 private:
  absl::Duration stopped_;
  int fds_[2] = {-1, -1};
  pid_t pid_ = -1;
};

struct RankState {
  int rank = 0;
  int world = 0;
  size_t n = 0;  // floats per allreduce
  void* stream = nullptr;
  std::shared_ptr<Store> store;
  std::unique_ptr<DeviceMemory> buf, seen, counter;
  int failures = 0;

  TensorView View() const { return TensorView{buf->p, n, DType::kF32, Device::Cuda(0), stream}; }
  void Fail(const std::string& what) {
    ++failures;
    std::printf("  FAIL rank %d: %s\n", rank, what.c_str());
  }
  // The trainer's input for `step`, on its stream; the mismatch counter zeroed.
  bool Fill(int step) {
    int e = LaunchFill(static_cast<float*>(buf->p), n, rank, step, stream);
    if (e == cuda::kCudaSuccess) {
      e = g_cuda->MemsetAsync(counter->p, 0, sizeof(unsigned long long), stream);
    }
    if (e != cuda::kCudaSuccess) Fail(absl::StrCat("fill step ", step, ": ", CudaError(e)));
    return e == cuda::kCudaSuccess;
  }
  // The consumer, on the trainer's stream right after Wait().
  void Consume(int step) {
    const int e = LaunchConsume(static_cast<const float*>(buf->p), static_cast<float*>(seen->p), n,
                                world, step, static_cast<unsigned long long*>(counter->p), stream);
    if (e != cuda::kCudaSuccess) Fail(absl::StrCat("consumer step ", step, ": ", CudaError(e)));
  }
  // What the consumer counted (the stream drained first, bounded). -1: the stream did not drain.
  // (A copy into pageable memory blocks until the stream reaches it: drained first, bounded.)
  int64_t Mismatches() {
    unsigned long long count = 0;
    absl::Status s = Drain(stream);
    if (s.ok()) {
      g_cuda->MemcpyAsync(&count, counter->p, sizeof(count), cuda::MemcpyKind::kDeviceToHost,
                          stream);
      s = Drain(stream);
    }
    if (!s.ok()) {
      Fail(s.ToString());
      return -1;
    }
    return static_cast<int64_t>(count);
  }
  // Elements of `which` that differ, bit for bit, from the fault-free sum of `step`.
  size_t Differences(const DeviceMemory& which, int step) {
    std::vector<float> h(n);
    absl::Status s = Drain(stream);
    if (s.ok()) {
      g_cuda->MemcpyAsync(h.data(), which.p, n * sizeof(float), cuda::MemcpyKind::kDeviceToHost,
                          stream);
      s = Drain(stream);
    }
    if (!s.ok()) {
      Fail(s.ToString());
      return n;
    }
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const float want = Sum(world, step, i);
      bad += std::memcmp(&h[i], &want, sizeof(float)) != 0 ? 1 : 0;
    }
    return bad;
  }
};

CommunicatorOptions Options(const RankState& r, const std::string& name, ReplayMode replay) {
  CommunicatorOptions o;
  o.rank = r.rank;
  o.world_size = r.world;
  o.name = name;
  o.backend = BackendChoice::kNccl;
  o.fallback = Fallback::kDeny;
  o.store = r.store;
  o.timeout = kOpTimeout;
  o.init_timeout = absl::Seconds(90);
  o.failure_report_window = kReportWindow;
  o.max_retry_attempts = 3;
  o.replay = replay;
  return o;
}

// NCCL connects a communicator's peers at its first collective: one op with a long bound first,
// then three timed. Returns the checked ops' timeout, the same on both ranks (through the store):
// 20 times the slower rank's slowest timed op, within [kOpTimeout, kMaxOpTimeout]. Zero: failed.
absl::Duration WarmUp(RankState& r, Communicator& comm, const std::string& variant) {
  absl::Duration slowest;
  for (int i = 0; i < 4; ++i) {
    if (!r.Fill(0)) return absl::ZeroDuration();
    const absl::Time t0 = absl::Now();
    const absl::Status s =
        comm.Allreduce(r.View(), {.timeout = kDeviceBound}).Synchronize(kDeviceBound);
    if (!s.ok()) {
      r.Fail(absl::StrCat(variant, ": warm-up allreduce: ", s.ToString()));
      return absl::ZeroDuration();
    }
    if (i > 0) slowest = std::max(slowest, absl::Now() - t0);
  }
  const std::string key = absl::StrCat("two_rank_abort/", variant, "/op_us/");
  absl::Status s =
      r.store->Set(absl::StrCat(key, r.rank), absl::StrCat(absl::ToInt64Microseconds(slowest)));
  for (int i = 0; i < r.world && s.ok(); ++i) {
    absl::StatusOr<std::string> v = r.store->Get(absl::StrCat(key, i), kDeviceBound);
    s = v.status();
    if (s.ok()) slowest = std::max(slowest, absl::Microseconds(std::atoll(v->c_str())));
  }
  if (!s.ok()) {
    r.Fail(absl::StrCat(variant, ": exchanging op times: ", s.ToString()));
    return absl::ZeroDuration();
  }
  const absl::Duration timeout = std::clamp(20 * slowest, kOpTimeout, kMaxOpTimeout);
  std::printf("  rank %d %s: a %zu-float allreduce takes up to %s; op timeout %s\n", r.rank,
              variant.c_str(), r.n, absl::FormatDuration(slowest).c_str(),
              absl::FormatDuration(timeout).c_str());
  if (20 * slowest > kMaxOpTimeout) {
    std::printf(
        "  rank %d %s: WARNING: ops this slow may time out without a fault; a smaller "
        "GPU_CHECK_ABORT_MIB helps\n",
        r.rank, variant.c_str());
  }
  return timeout;
}

// Steps: BeginStep, fill, Allreduce, Wait, consumer, CommitStep; a redone step from the input.
void StepsVariant(RankState& r) {
  const absl::Time start = absl::Now();
  auto comm = Communicator::Create(Options(r, "two_rank_abort_steps", ReplayMode::kAuto));
  if (!comm.ok()) {
    r.Fail(absl::StrCat("steps: communicator: ", comm.status().ToString()));
    return;
  }
  const absl::Duration op_timeout = WarmUp(r, **comm, "steps");
  if (op_timeout == absl::ZeroDuration()) return;
  StopHelper helper(op_timeout + kStopMargin);
  bool stopped = false;
  int committed = 0, redone = 0, attempts = 0;
  int64_t partial_committed = 0, mismatches_redone = 0;
  for (int step = 0; step < kSteps;) {
    if (++attempts > kMaxAttempts) {
      r.Fail(absl::StrCat("steps: step ", step, " redone ", kMaxAttempts - 1, " times"));
      return;
    }
    const bool fault = r.rank == 1 && step == kFaultStep && !stopped;
    if (fault && !helper.Arm()) {
      r.Fail("steps: cannot fork the helper that continues a stopped rank");
      return;
    }
    if (absl::Status s = (*comm)->BeginStep(); !s.ok()) {
      r.Fail(absl::StrCat("steps: BeginStep ", step, ": ", s.ToString()));
      return;
    }
    if (!r.Fill(step)) return;
    Work work = (*comm)->Allreduce(r.View(), {.timeout = op_timeout});
    const absl::Status waited = work.Wait();  // releases the trainer's stream
    if (waited.ok()) r.Consume(step);
    if (fault) {
      stopped = true;
      std::printf("  rank %d steps: stopped after step %d's allreduce was queued, for %s\n", r.rank,
                  step, absl::FormatDuration(helper.Stop()).c_str());
    }
    const absl::Status commit = (*comm)->CommitStep();
    const int64_t mismatches = r.Mismatches();
    if (mismatches < 0) return;
    if (IsStepRedo(commit)) {
      ++redone;
      mismatches_redone += mismatches;
      std::printf(
          "  rank %d steps: step %d redone (its consumer saw %lld of %zu elements not the full "
          "sum: not committed); %s\n",
          r.rank, step, static_cast<long long>(mismatches), r.n, commit.ToString().c_str());
      continue;
    }
    if (!commit.ok()) {
      r.Fail(absl::StrCat("steps: CommitStep ", step, ": ", commit.ToString()));
      return;
    }
    if (!waited.ok()) {
      r.Fail(absl::StrCat("steps: step ", step,
                          " committed although its allreduce failed: ", waited.ToString()));
    }
    if (mismatches != 0) {
      partial_committed += mismatches;
      r.Fail(absl::StrCat("steps: PARTIAL SUM in committed step ", step, ": the consumer saw ",
                          mismatches, " of ", r.n, " elements not the full sum"));
    }
    ++committed;
    ++step;
    attempts = 0;
  }
  const size_t final_bad = r.Differences(*r.buf, kSteps - 1);
  const size_t seen_bad = r.Differences(*r.seen, kSteps - 1);
  if (final_bad != 0 || seen_bad != 0) {
    r.Fail(absl::StrCat("steps: the final buffer has ", final_bad, " and the consumer's copy ",
                        seen_bad, " elements off the fault-free result"));
  }
  // Rank 0's op hangs on its stopped peer: it must have been redone there. (Rank 1's may have
  // finished first if the stop came late; rank 0's cannot, it waits for rank 1's proxy.)
  if (r.rank == 0 && redone == 0) {
    r.Fail("steps: no step was redone: the fault did not hit (inconclusive)");
  }
  std::printf(
      "rank %d steps: %d of %d steps committed, %lld partial sums seen in committed steps; %d "
      "redone (%lld mismatches seen there by the consumer); final buffer %s; %s\n",
      r.rank, committed, kSteps, static_cast<long long>(partial_committed), redone,
      static_cast<long long>(mismatches_redone),
      final_bad == 0 && seen_bad == 0 ? "exact" : "WRONG",
      absl::FormatDuration(absl::Now() - start).c_str());
}

// Single ops (retry.replay copy): OK with the full sum, or the loss reported; never silent.
void CopyVariant(RankState& r) {
  const absl::Time start = absl::Now();
  auto comm = Communicator::Create(Options(r, "two_rank_abort_copy", ReplayMode::kCopy));
  if (!comm.ok()) {
    r.Fail(absl::StrCat("copy: communicator: ", comm.status().ToString()));
    return;
  }
  const absl::Duration op_timeout = WarmUp(r, **comm, "copy");
  if (op_timeout == absl::ZeroDuration()) return;
  StopHelper helper(op_timeout + kStopMargin);
  int ok_ops = 0;
  std::string outcome = "no op failed";
  for (int op = 0; op < kOps; ++op) {
    const bool fault = r.rank == 1 && op == kFaultOp;
    if (fault && !helper.Arm()) {
      r.Fail("copy: cannot fork the helper that continues a stopped rank");
      return;
    }
    if (!r.Fill(op)) return;
    Work work = (*comm)->Allreduce(r.View(), {.timeout = op_timeout});
    const absl::Status waited = work.Wait();
    if (waited.ok()) r.Consume(op);
    if (fault) {
      std::printf("  rank %d copy: stopped after op %d was queued, for %s\n", r.rank, op,
                  absl::FormatDuration(helper.Stop()).c_str());
    }
    if (!waited.ok()) {
      // Failed before the stream was released: nothing consumed it, and the trainer knows.
      outcome = absl::StrCat("op ", op, " failed at Wait (nothing consumed): ", waited.ToString());
      break;
    }
    const absl::Status done = work.Synchronize(kDeviceBound);
    const int64_t mismatches = r.Mismatches();
    if (mismatches < 0) return;
    if (done.ok()) {
      if (mismatches != 0) {
        r.Fail(absl::StrCat("copy: SILENT PARTIAL SUM: op ", op,
                            " returned OK but its consumer saw ", mismatches, " of ", r.n,
                            " elements not the full sum"));
      } else {
        ++ok_ops;
      }
      continue;
    }
    const bool loss_named = absl::IsDataLoss(done) ||
                            done.message().find("not re-run in place") != absl::string_view::npos;
    outcome =
        absl::StrCat("op ", op, " failed after its Wait released the stream; its consumer saw ",
                     mismatches, " of ", r.n, " elements not the full sum; ", done.ToString());
    // A consumer that read a partial sum must learn it from the op's status (DataLoss, or the
    // peer's report quoting it); an op that failed before any of it was read need not say so.
    if (!loss_named && mismatches != 0) {
      r.Fail(absl::StrCat("copy: op ", op,
                          "'s consumer read a partial sum, and its status is not "
                          "DataLoss (nor the peer's report naming it): ",
                          done.ToString()));
    }
    break;
  }
  if (r.rank == 0 && ok_ops == kOps) {
    r.Fail("copy: every op succeeded: the fault did not hit (inconclusive)");
  }
  std::printf("rank %d copy: %d of %d ops OK with the full sum seen; %s; %s\n", r.rank, ok_ops,
              kOps, outcome.c_str(), absl::FormatDuration(absl::Now() - start).c_str());
}

// Leave together: rank 0 serves the store the other rank still uses.
void Barrier(RankState& r, const std::string& name) {
  absl::Status s = r.store->Set(absl::StrCat("two_rank_abort/", name, "/", r.rank), "1");
  std::vector<std::string> keys;
  for (int i = 0; i < r.world; ++i) keys.push_back(absl::StrCat("two_rank_abort/", name, "/", i));
  if (s.ok()) s = r.store->Wait(keys, absl::Seconds(120));
  if (!s.ok()) r.Fail(absl::StrCat("store barrier '", name, "': ", s.ToString()));
}

// ncclCommSplit on the real NCCL: a child of both ranks in reverse order, built on the split of
// the parent's communicator (its selection reason says so), whose allreduce must give the
// fault-free sum element by element.
void SplitVariant(RankState& r) {
  auto comm = Communicator::Create(Options(r, "two_rank_split", ReplayMode::kAuto));
  if (!comm.ok()) {
    r.Fail(absl::StrCat("split: communicator: ", comm.status().ToString()));
    return;
  }
  if (WarmUp(r, **comm, "split") == absl::ZeroDuration()) return;
  absl::StatusOr<std::unique_ptr<Communicator>> child = (*comm)->Split(0, 1 - r.rank);
  if (!child.ok() || *child == nullptr) {
    r.Fail(absl::StrCat("split: ", child.ok() ? "no child" : child.status().ToString()));
    return;
  }
  const std::string& reason = (*child)->selection_reason();
  if ((*child)->rank() != 1 - r.rank || (*child)->size() != 2 ||
      reason.find("ncclCommSplit") == std::string::npos) {
    r.Fail(absl::StrCat("split: child rank ", (*child)->rank(), " of ", (*child)->size(),
                        ", selection '", reason, "'"));
    return;
  }
  constexpr int kStep = 7;
  if (!r.Fill(kStep)) return;
  const absl::Status s =
      (*child)->Allreduce(r.View(), {.timeout = kDeviceBound}).Synchronize(kDeviceBound);
  if (!s.ok()) {
    r.Fail(absl::StrCat("split: child's allreduce: ", s.ToString()));
    return;
  }
  if (const size_t bad = r.Differences(*r.buf, kStep); bad != 0) {
    r.Fail(absl::StrCat("split: ", bad, " of ", r.n, " elements differ from the sum"));
    return;
  }
  std::printf("  rank %d split: child rank %d of 2 built by ncclCommSplit, allreduce exact\n",
              r.rank, (*child)->rank());
}

// A group on the real NCCL, stream-ordered: a receive of the peer's input, an allreduce and a send
// of this rank's input (copied on the trainer's stream before GroupEnd, which the group must wait
// for) in one ncclGroupStart/ncclGroupEnd. The Waits return without the host waiting for the
// device; the consumer kernel queued right after them must see the exact sum, and the received
// block must be the peer's input, element by element.
void GroupVariant(RankState& r) {
  auto comm = Communicator::Create(Options(r, "two_rank_group", ReplayMode::kAuto));
  if (!comm.ok()) {
    r.Fail(absl::StrCat("group: communicator: ", comm.status().ToString()));
    return;
  }
  if (WarmUp(r, **comm, "group") == absl::ZeroDuration()) return;
  const size_t bytes = r.n * sizeof(float);
  DeviceMemory out(bytes), in(bytes);
  if (out.p == nullptr || in.p == nullptr) {
    r.Fail("group: cannot allocate the send and receive buffers");
    return;
  }
  constexpr int kStep = 9;
  if (!r.Fill(kStep)) return;
  if (int e =
          g_cuda->MemcpyAsync(out.p, r.buf->p, bytes, cuda::MemcpyKind::kDeviceToDevice, r.stream);
      e != cuda::kCudaSuccess) {
    r.Fail(absl::StrCat("group: copy of the input: ", CudaError(e)));
    return;
  }
  const int peer = 1 - r.rank;
  const absl::Time start = absl::Now();
  std::vector<Work> works;
  absl::Status s = (*comm)->Group([&] {
    works.push_back((*comm)->Recv(TensorView{in.p, r.n, DType::kF32, Device::Cuda(0), r.stream},
                                  peer, {.timeout = kDeviceBound}));
    works.push_back((*comm)->Allreduce(r.View(), {.timeout = kDeviceBound}));
    works.push_back((*comm)->Send(TensorView{out.p, r.n, DType::kF32, Device::Cuda(0), r.stream},
                                  peer, {.timeout = kDeviceBound}));
  });
  for (Work& w : works) {
    if (s.ok()) s = w.Wait(kDeviceBound);
  }
  const absl::Duration host = absl::Now() - start;
  if (!s.ok()) {
    r.Fail(absl::StrCat("group: ", s.ToString()));
    return;
  }
  r.Consume(kStep);
  if (const int64_t bad = r.Mismatches(); bad != 0) {
    r.Fail(absl::StrCat("group: the consumer after Wait() saw ", bad, " of ", r.n,
                        " elements differ from the sum"));
    return;
  }
  std::vector<float> got(r.n);
  g_cuda->MemcpyAsync(got.data(), in.p, bytes, cuda::MemcpyKind::kDeviceToHost, r.stream);
  if (absl::Status d = Drain(r.stream); !d.ok()) {
    r.Fail(absl::StrCat("group: ", d.ToString()));
    return;
  }
  size_t bad = 0;
  for (size_t i = 0; i < r.n; ++i) {
    const float want = Input(peer, kStep, i);
    bad += std::memcmp(&got[i], &want, sizeof(float)) != 0 ? 1 : 0;
  }
  if (bad != 0) {
    r.Fail(absl::StrCat("group: ", bad, " of ", r.n, " received elements differ from rank ", peer,
                        "'s input"));
    return;
  }
  std::printf(
      "  rank %d group: GroupEnd and 3 Waits took %s on the host; sum and received block exact\n",
      r.rank, absl::FormatDuration(host).c_str());
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

int RunRank() {
  RankState r;
  r.rank = EnvInt("RANK", -1);
  r.world = EnvInt("WORLD_SIZE", -1);
  const int port = EnvInt("MASTER_PORT", 0);
  const char* addr = std::getenv("MASTER_ADDR");
  if (r.rank < 0 || r.world != 2 || r.rank >= r.world || port <= 0) {
    std::printf(
        "FAIL: set RANK (0 or 1), WORLD_SIZE=2, MASTER_PORT (bench/gpu_check.sh "
        "two-rank-abort does)\n");
    return 1;
  }
  r.n = static_cast<size_t>(EnvInt("GPU_CHECK_ABORT_MIB", 4)) << 18;  // floats
  if (int e = g_cuda->SetDevice(0); e != cuda::kCudaSuccess) {
    std::printf("FAIL rank %d: cudaSetDevice(0): %s\n", r.rank, CudaError(e).c_str());
    return 1;
  }
  g_cuda->StreamCreateNonBlocking(&r.stream);
  r.buf = std::make_unique<DeviceMemory>(r.n * sizeof(float));
  r.seen = std::make_unique<DeviceMemory>(r.n * sizeof(float));
  r.counter = std::make_unique<DeviceMemory>(sizeof(unsigned long long));
  if (r.buf->p == nullptr || r.seen->p == nullptr || r.counter->p == nullptr) {
    std::printf("FAIL rank %d: cannot allocate 2 x %zu bytes on cuda:0\n", r.rank,
                r.n * sizeof(float));
    return 1;
  }
  TcpStoreOptions so;
  so.host = addr != nullptr && *addr != '\0' ? addr : "127.0.0.1";
  so.port = port;
  std::unique_ptr<TcpStoreServer> server;
  if (r.rank == 0) {
    auto started = StartTcpStoreServer(so);
    if (!started.ok()) {
      std::printf("FAIL rank 0: store server on port %d: %s\n", port,
                  started.status().ToString().c_str());
      return 1;
    }
    server = *std::move(started);
  }
  auto store = ConnectTcpStore(so);
  if (!store.ok()) {
    std::printf("FAIL rank %d: store: %s\n", r.rank, store.status().ToString().c_str());
    return 1;
  }
  r.store = *store;
  std::printf("rank %d (pid %d): %zu floats per allreduce on cuda:0, NCCL_HOSTID=%s\n", r.rank,
              static_cast<int>(getpid()), r.n,
              std::getenv("NCCL_HOSTID") != nullptr ? std::getenv("NCCL_HOSTID") : "(unset)");
  StepsVariant(r);
  Barrier(r, "steps");
  CopyVariant(r);
  Barrier(r, "copy");
  SplitVariant(r);
  Barrier(r, "split");
  GroupVariant(r);
  Barrier(r, "done");
  (void)Drain(r.stream);
  r.buf.reset();
  r.seen.reset();
  r.counter.reset();
  g_cuda->StreamDestroy(r.stream);
  std::printf("two-rank-abort rank %d: %s (%d failures)\n", r.rank,
              r.failures == 0 ? "PASS" : "FAIL", r.failures);
  return r.failures == 0 ? 0 : 1;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return 0;
  }
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace
}  // namespace adaptcomm::gpu_check_abort

int main(int argc, char** argv) {
  using namespace adaptcomm;
  using namespace adaptcomm::gpu_check_abort;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--free-port") {
    const int port = FreePort();
    std::printf("%d\n", port);
    return port > 0 ? 0 : 1;
  }
  if (!mode.empty() && mode != "--probe") {
    std::printf("usage: %s [--probe | --free-port]\n", argv[0]);
    return 2;
  }
  auto c = cuda::LoadCudaApi();
  int devices = 0;
  const int e = c.ok() ? (*c)->GetDeviceCount(&devices) : cuda::kCudaErrorNoDevice;
  if (!c.ok() || e != cuda::kCudaSuccess || devices == 0) {
    std::printf("no CUDA device (%s): the two-rank abort check is skipped\n",
                !c.ok()                   ? std::string(c.status().message()).c_str()
                : e != cuda::kCudaSuccess ? (*c)->ErrorString(e).c_str()
                                          : "0 devices");
    return 77;
  }
  g_cuda = *c;
  if (mode == "--probe") {
    auto api = nccl::LoadNcclApi();
    if (!api.ok()) {
      std::printf("FAIL: %d GPU(s) but NCCL does not load: %s\n", devices,
                  std::string(api.status().message()).c_str());
      return 1;
    }
    int version = 0;
    (*api)->GetVersion(&version);
    std::printf("%d GPU(s); NCCL %s from %s; both ranks on cuda:0\n", devices,
                nccl::NcclVersionString(version).c_str(), (*api)->library_path().c_str());
    return 0;
  }
  return RunRank();
}

#include "tests/fake_nccl_api.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/cast_kernels.h"
#include "tests/dtype_values.h"

namespace adaptcomm::testing {

using nccl::NcclComm;
using nccl::NcclDataType;
using nccl::NcclRedOp;
using nccl::NcclResult;

namespace {

struct FakeOp {
  int pending = 0;
  // The stream whose deferred work this op waits in (an event recorded behind it, a queued
  // collective); null is the legacy default stream when on_stream is set.
  void* marker_stream = nullptr;
  bool on_stream = false;
  // ncclCommAbort ends the communicator's kernels: its ops stop holding their streams.
  bool aborted = false;
  bool done() const { return pending == 0 || aborted; }
};

// Deferred work of one stream (see the header): a cast, a copy (count in bytes), a wait for
// another op, or the point an event was recorded at.
struct HeldCollective;  // a collective queued on its stream (FakeNcclApi::HoldStreams)
struct Deferred {
  enum class Kind { kCast, kCopy, kWait, kMarker, kCollective } kind = Kind::kCast;
  cuda::CastDirection direction = cuda::CastDirection::kF32ToBF16;
  const void* src = nullptr;
  void* dst = nullptr;
  size_t count = 0;
  float scale = 1.0f;
  cuda::DeviceCastCounters* counters = nullptr;
  std::shared_ptr<FakeOp> op;            // kWait: what it waits for; kMarker: the event's op;
                                         // kCollective: the op the launch becomes
  std::shared_ptr<HeldCollective> held;  // kCollective
};

// How long a forced stream waits for a collective of its queue (peers must launch theirs).
constexpr absl::Duration kFlushBound = absl::Seconds(30);

// One capture sequence (cudaStreamBeginCapture .. cudaStreamEndCapture): the thread and mode it
// was begun with, and whether a forbidden call invalidated it.
struct CaptureSeq {
  std::thread::id thread;
  cuda::CaptureMode mode = cuda::CaptureMode::kGlobal;
  bool invalidated = false;
};

// This thread's capture mode (cudaThreadExchangeStreamCaptureMode).
thread_local cuda::CaptureMode thread_capture_mode = cuda::CaptureMode::kGlobal;

// Runs one deferred cast on lib/precision's scalar reference kernels.
void RunCast(const Deferred& d) {
  namespace p = precision;
  CastStats st;
  switch (d.direction) {
    case cuda::CastDirection::kF32ToBF16:
      st = p::F32ToBF16Scalar(static_cast<const float*>(d.src), static_cast<uint16_t*>(d.dst),
                              d.count);
      break;
    case cuda::CastDirection::kF32ToF16:
      st = p::F32ToF16Scalar(static_cast<const float*>(d.src), static_cast<uint16_t*>(d.dst),
                             d.count);
      break;
    case cuda::CastDirection::kBF16ToF32:
    case cuda::CastDirection::kF16ToF32: {
      std::vector<float> sink(d.dst == nullptr ? d.count : 0);  // null dst: count only
      float* dst = d.dst == nullptr ? sink.data() : static_cast<float*>(d.dst);
      const auto* src = static_cast<const uint16_t*>(d.src);
      st = d.direction == cuda::CastDirection::kBF16ToF32
               ? p::BF16ToF32Scalar(src, dst, d.count, d.scale)
               : p::F16ToF32Scalar(src, dst, d.count, d.scale);
      break;
    }
    case cuda::CastDirection::kF32ToF32: {
      const auto* src = static_cast<const float*>(d.src);
      auto* dst = static_cast<float*>(d.dst);
      for (size_t i = 0; i < d.count; ++i) {
        st.nonfinite_inputs += !std::isfinite(src[i]);
        dst[i] = d.scale == 1.0f ? src[i] : src[i] * d.scale;
      }
      break;
    }
  }
  if (d.counters != nullptr) {
    d.counters->overflow += st.overflow;
    d.counters->nonfinite += st.nonfinite_inputs;
  }
}

const char* DirectionName(cuda::CastDirection d) {
  switch (d) {
    case cuda::CastDirection::kF32ToBF16:
      return "f32->bf16";
    case cuda::CastDirection::kF32ToF16:
      return "f32->f16";
    case cuda::CastDirection::kBF16ToF32:
      return "bf16->f32";
    case cuda::CastDirection::kF16ToF32:
      return "f16->f32";
    case cuda::CastDirection::kF32ToF32:
      return "f32*scale";
  }
  return "?";
}

enum class Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAllToAll };

struct Part {
  Kind kind = Kind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // allgather: send count; reduce_scatter: recv count; alltoall: per rank
  NcclDataType dtype = NcclDataType::kFloat32;
  NcclRedOp op = NcclRedOp::kSum;
  int root = 0;
  std::shared_ptr<FakeOp> fop;
};

struct Message {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0;
  std::shared_ptr<FakeOp> fop;
};

struct FakeComm;
struct HeldCollective {
  FakeComm* comm = nullptr;
  std::vector<Part> parts;  // one collective, or a group's collectives
  std::vector<std::pair<Message, std::pair<int, int>>> p2p;  // a group's: message, (peer, is_send)
  const FakeNcclFaults* faults = nullptr;
};

// One launch of `parts` and `p2p` on `c`: posts them to the world; returns the op to track
// (`fop` if given).
std::shared_ptr<FakeOp> Launch(FakeComm* c, const FakeNcclFaults& faults, std::vector<Part> parts,
                               std::vector<std::pair<Message, std::pair<int, int>>> p2p,
                               std::shared_ptr<FakeOp> fop = nullptr);

struct Group {
  int nranks = 0;
  int joined = 0;
  std::map<uint64_t, std::vector<std::optional<Part>>> collectives;
  std::map<std::pair<int, int>, std::deque<Message>> sends;  // (src, dst)
  std::map<std::pair<int, int>, std::deque<Message>> recvs;
  // Groups made by ncclCommShrink from this one, by the (sorted) excluded ranks.
  std::map<std::vector<int>, std::shared_ptr<Group>> shrunk;
  // The ncclCommSplit calls on this group, by their number on each rank: per parent rank its
  // (color, key) and the communicator it was handed (null for kSplitNoColor).
  struct SplitCall {
    int color = 0, key = 0;
    FakeComm* child = nullptr;
  };
  std::map<int, std::map<int, SplitCall>> splits;
  // A group of ncclCommSplit with a member whose init failed: the others' init fails too, as
  // NCCL's bootstrap sees the lost peer.
  bool peer_failed = false;
};

// The library sends only the eight dtypes of DType (lib/nccl maps them one to one); the fake
// computes with the tests' shared element codec.
DType AsDType(NcclDataType t) {
  switch (t) {
    case NcclDataType::kInt8:
      return DType::kI8;
    case NcclDataType::kUint8:
      return DType::kU8;
    case NcclDataType::kInt32:
    case NcclDataType::kUint32:
      return DType::kI32;
    case NcclDataType::kInt64:
    case NcclDataType::kUint64:
      return DType::kI64;
    case NcclDataType::kFloat16:
      return DType::kF16;
    case NcclDataType::kFloat32:
      return DType::kF32;
    case NcclDataType::kFloat64:
      return DType::kF64;
    case NcclDataType::kBfloat16:
      return DType::kBF16;
  }
  return DType::kF64;
}

ReduceOp AsReduceOp(NcclRedOp op) {
  switch (op) {
    case NcclRedOp::kSum:
      return ReduceOp::kSum;
    case NcclRedOp::kProd:
      return ReduceOp::kProd;
    case NcclRedOp::kMax:
      return ReduceOp::kMax;
    case NcclRedOp::kMin:
      return ReduceOp::kMin;
    case NcclRedOp::kAvg:
      return ReduceOp::kAvg;
  }
  return ReduceOp::kSum;
}

size_t Size(NcclDataType t) { return DTypeSize(AsDType(t)); }

double Load(NcclDataType t, const void* p, size_t i) {
  return LoadAs(AsDType(t), static_cast<const char*>(p) + i * Size(t));
}

void Store(NcclDataType t, void* p, size_t i, double v) {
  StoreAs(AsDType(t), v, static_cast<char*>(p) + i * Size(t));
}

// Reduction of element `i` (offset `base` elements into each send buffer) over all ranks.
double ReduceAt(const std::vector<std::optional<Part>>& parts, size_t base, size_t i) {
  const Part& p0 = *parts[0];
  double acc = Load(p0.dtype, p0.send, base + i);
  for (size_t r = 1; r < parts.size(); ++r) {
    acc = Combine(AsReduceOp(p0.op), acc, Load(p0.dtype, parts[r]->send, base + i));
  }
  if (p0.op == NcclRedOp::kAvg) acc /= static_cast<double>(parts.size());
  return acc;
}

// Whether rank r's part of a collective still writes its result: a rank whose communicator was
// aborted (ncclCommAbort ended its kernel) receives nothing, though its peers, whose data it had
// sent, may still complete.
bool Receives(const std::vector<std::optional<Part>>& parts, size_t r) {
  return !parts[r]->fop->aborted;
}

void Execute(std::vector<std::optional<Part>>& parts) {
  const Part& p0 = *parts[0];
  const size_t n = parts.size();
  const size_t es = Size(p0.dtype);
  switch (p0.kind) {
    case Kind::kAllReduce:
    case Kind::kReduce: {
      std::vector<double> out(p0.count);
      for (size_t i = 0; i < p0.count; ++i) out[i] = ReduceAt(parts, 0, i);
      for (size_t r = 0; r < n; ++r) {
        if (p0.kind == Kind::kReduce && static_cast<int>(r) != p0.root) continue;
        if (!Receives(parts, r)) continue;
        for (size_t i = 0; i < p0.count; ++i) Store(p0.dtype, parts[r]->recv, i, out[i]);
      }
      break;
    }
    case Kind::kBroadcast: {
      std::vector<char> data(p0.count * es);
      std::memcpy(data.data(), parts[static_cast<size_t>(p0.root)]->send, data.size());
      for (size_t r = 0; r < n; ++r) {
        if (Receives(parts, r)) std::memcpy(parts[r]->recv, data.data(), data.size());
      }
      break;
    }
    case Kind::kAllGather: {
      const size_t block = p0.count * es;
      std::vector<char> data(block * n);
      for (size_t r = 0; r < n; ++r) std::memcpy(data.data() + r * block, parts[r]->send, block);
      for (size_t r = 0; r < n; ++r) {
        if (Receives(parts, r)) std::memcpy(parts[r]->recv, data.data(), data.size());
      }
      break;
    }
    case Kind::kAllToAll: {
      // Into a copy first: a rank's send and receive buffers may be the same.
      const size_t block = p0.count * es;
      std::vector<std::vector<char>> out(n, std::vector<char>(block * n));
      for (size_t dst = 0; dst < n; ++dst) {
        for (size_t src = 0; src < n; ++src) {
          std::memcpy(out[dst].data() + src * block,
                      static_cast<const char*>(parts[src]->send) + dst * block, block);
        }
      }
      for (size_t r = 0; r < n; ++r) {
        if (Receives(parts, r)) std::memcpy(parts[r]->recv, out[r].data(), block * n);
      }
      break;
    }
    case Kind::kReduceScatter: {
      std::vector<std::vector<double>> out(n, std::vector<double>(p0.count));
      for (size_t r = 0; r < n; ++r) {
        for (size_t i = 0; i < p0.count; ++i) out[r][i] = ReduceAt(parts, r * p0.count, i);
      }
      for (size_t r = 0; r < n; ++r) {
        if (!Receives(parts, r)) continue;
        for (size_t i = 0; i < p0.count; ++i) Store(p0.dtype, parts[r]->recv, i, out[r][i]);
      }
      break;
    }
  }
  for (auto& p : parts) --p->fop->pending;
}

struct FakeComm {
  std::shared_ptr<Group> group;
  int rank = 0;
  int nranks = 0;
  bool init_failed = false;
  bool init_never = false;
  bool aborted = false;
  NcclResult async = NcclResult::kSuccess;
  uint64_t collective_index = 0;
  int launches = 0;
  int index = 0;  // 1-based: which communicator of its fake
  std::string last_error;
  std::vector<std::weak_ptr<FakeOp>> ops;  // launched here, for CommAbort
  int splits = 0;                          // ncclCommSplit calls made on it
};

}  // namespace

class FakeNcclWorld {
 public:
  absl::Mutex mu;
  std::map<std::string, std::shared_ptr<Group>> groups ABSL_GUARDED_BY(mu);
  uint64_t next_uid ABSL_GUARDED_BY(mu) = 1;
};

std::shared_ptr<FakeNcclWorld> MakeFakeNcclWorld() { return std::make_shared<FakeNcclWorld>(); }

std::vector<std::shared_ptr<FakeNcclApi>> FakesWithFailingRank(int world_size, int failing_rank,
                                                               const FakeNcclFaults& failing) {
  auto world = MakeFakeNcclWorld();
  std::vector<std::shared_ptr<FakeNcclApi>> fakes;
  for (int r = 0; r < world_size; ++r) {
    fakes.push_back(
        std::make_shared<FakeNcclApi>(world, r == failing_rank ? failing : FakeNcclFaults{}));
  }
  return fakes;
}

internal::CommunicatorDeps FakeSeams(const std::shared_ptr<FakeNcclApi>& fake) {
  internal::CommunicatorDeps deps;
  deps.use_given_apis = true;
  deps.cuda = fake;
  deps.nccl = fake;
  return deps;
}

// Everything below is guarded by the world's mutex.
struct FakeNcclApi::State {
  std::vector<std::unique_ptr<FakeComm>> comms;
  std::map<void*, std::shared_ptr<FakeOp>> stream_last;
  std::map<void*, std::shared_ptr<FakeOp>> events;
  std::set<void*> timing_events;  // created with timing (EventCreateWithTiming)
  uintptr_t next_handle = 0x1000;
  bool in_group = false;
  std::vector<Part> group_collectives;
  std::vector<std::pair<Message, std::pair<int, int>>> group_p2p;  // message, (peer, is_send)
  FakeComm* group_comm = nullptr;
  void* group_stream = nullptr;
  nccl::NcclCommConfig last_config;
  std::vector<NcclDataType> dtypes;
  std::vector<NcclRedOp> ops;
  std::vector<std::pair<uintptr_t, size_t>> host_ranges;
  std::map<void*, std::deque<Deferred>> deferred;  // per stream
  std::vector<FakeCall> calls;
  std::vector<int> shrink_flags;
  std::vector<std::pair<int, int>> split_args;
  std::map<void*, int> stream_devices;  // streams from StreamCreateNonBlocking
  bool holding = false;                 // HoldStreams(true): collectives wait on their stream
  int held_starts = 0;                  // collectives that may start while held (StepHeldDevice)
  int collectives_started = 0;          // launches posted to the world
  // Streams in capture mode (the one it began on and those that joined), and events last
  // recorded in a capture, each with its capture.
  std::map<void*, std::shared_ptr<CaptureSeq>> capturing;
  std::map<void*, std::shared_ptr<CaptureSeq>> captured_events;

  CaptureSeq* CaptureOf(void* stream) {
    auto it = capturing.find(stream);
    return it == capturing.end() ? nullptr : it->second.get();
  }
  // Whether this thread may make a "potentially unsafe" call now (its capture mode against the
  // open captures); if not, the captures that forbid it are invalidated.
  bool UnsafeCallAllowed() {
    const std::thread::id me = std::this_thread::get_id();
    bool allowed = true;
    for (auto& [stream, seq] : capturing) {
      const bool forbids =
          thread_capture_mode != cuda::CaptureMode::kRelaxed &&
          seq->mode != cuda::CaptureMode::kRelaxed &&
          (seq->thread == me || (seq->mode == cuda::CaptureMode::kGlobal &&
                                 thread_capture_mode == cuda::CaptureMode::kGlobal));
      if (forbids) {
        seq->invalidated = true;
        allowed = false;
      }
    }
    return allowed;
  }

  // Queues `held` on `stream` (see Post); returns the op its launch becomes.
  std::shared_ptr<FakeOp> DeferCollective(void* stream, HeldCollective held) {
    auto fop = std::make_shared<FakeOp>();
    fop->pending = 1;
    fop->marker_stream = stream;
    fop->on_stream = true;
    deferred[stream].push_back(Deferred{Deferred::Kind::kCollective,
                                        {},
                                        nullptr,
                                        nullptr,
                                        0,
                                        1.0f,
                                        nullptr,
                                        fop,
                                        std::make_shared<HeldCollective>(std::move(held))});
    return fop;
  }

  void Log(const char* name, void* stream, void* event = nullptr, std::string detail = "") {
    calls.push_back(FakeCall{name, stream, event, std::move(detail)});
  }

  // Runs the deferred work of `stream` in order. A wait for an op that is not done yet first
  // forces the stream the op's event was recorded on, then (blocking) waits up to kFlushBound for
  // it, or (not blocking) stops there. Returns whether the queue is empty. `depth` bounds the
  // recursion of streams waiting on each other (a real deadlock on a GPU too). With `until`, stops
  // once that op is done: forcing another stream up to an awaited event runs only the work before
  // the event (the work after it, e.g. a collective whose peers have not launched yet, may wait
  // kFlushBound, and the waiting stream does not need it).
  bool Flush(absl::Mutex& mu, void* stream, bool blocking, int depth = 0,
             const FakeOp* until = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = deferred.find(stream);
    if (it == deferred.end()) return true;
    while (!it->second.empty()) {
      if (until != nullptr && until->done()) return false;
      Deferred d = it->second.front();
      if (d.kind == Deferred::Kind::kCast) {
        RunCast(d);
      } else if (d.kind == Deferred::Kind::kCopy) {
        std::memmove(d.dst, d.src, d.count);
      } else if (d.kind == Deferred::Kind::kCollective) {
        if (d.held->comm->aborted) {
          // ncclCommAbort ended the communicator's kernels: this one never runs.
          d.op->aborted = true;
          it->second.pop_front();
          continue;
        }
        if (holding && held_starts == 0) return false;
        if (holding) --held_starts;
        ++collectives_started;
        Launch(d.held->comm, *d.held->faults, d.held->parts, d.held->p2p, d.op);
        // Later work of this stream runs after the collective: wait for it in its place.
        it->second.front() =
            Deferred{Deferred::Kind::kWait, {}, nullptr, nullptr, 0, 1.0f, nullptr, d.op, nullptr};
        continue;
      } else if (d.kind == Deferred::Kind::kMarker) {
        d.op->pending = 0;
      } else if (!d.op->done()) {
        if (d.op->on_stream && depth < 8) {
          Flush(mu, d.op->marker_stream, blocking, depth + 1, d.op.get());
        }
        if (!d.op->done() &&
            (!blocking ||
             !mu.AwaitWithTimeout(absl::Condition(d.op.get(), &FakeOp::done), kFlushBound))) {
          return false;
        }
        // The lock was released while waiting: look at the queue again (now the op is done).
        it = deferred.find(stream);
        if (it == deferred.end()) return true;
        continue;
      }
      it->second.pop_front();
    }
    deferred.erase(it);
    return true;
  }
};

namespace {
FakeComm* Comm(NcclComm c) { return reinterpret_cast<FakeComm*>(c); }
}  // namespace

FakeNcclApi::FakeNcclApi(std::shared_ptr<FakeNcclWorld> world, FakeNcclFaults faults)
    : world_(std::move(world)), faults_(std::move(faults)), state_(std::make_unique<State>()) {}
FakeNcclApi::~FakeNcclApi() = default;

nccl::NcclCommConfig FakeNcclApi::last_config() const {
  absl::MutexLock lock(&world_->mu);
  return state_->last_config;
}
std::vector<NcclDataType> FakeNcclApi::dtypes_seen() const {
  absl::MutexLock lock(&world_->mu);
  return state_->dtypes;
}
std::vector<NcclRedOp> FakeNcclApi::ops_seen() const {
  absl::MutexLock lock(&world_->mu);
  return state_->ops;
}
void FakeNcclApi::MarkHost(const void* p, size_t bytes) {
  absl::MutexLock lock(&world_->mu);
  state_->host_ranges.push_back({reinterpret_cast<uintptr_t>(p), bytes});
}

int FakeNcclApi::GetDeviceCount(int* count) {
  *count = faults_.device_count_error == cuda::kCudaSuccess ? faults_.device_count : 0;
  return faults_.device_count_error;
}
namespace {
thread_local int current_device = 0;
}  // namespace
int FakeNcclApi::SetDevice(int device) {
  if (device < 0 || device >= faults_.device_count) return 101;  // cudaErrorInvalidDevice
  current_device = device;
  return cuda::kCudaSuccess;
}
int FakeNcclApi::GetDevice(int* device) {
  *device = current_device;
  return cuda::kCudaSuccess;
}
int FakeNcclApi::DriverVersion(int* version) {
  *version = 13000;
  return cuda::kCudaSuccess;
}
int FakeNcclApi::RuntimeVersion(int* version) {
  *version = 13000;
  return cuda::kCudaSuccess;
}
int FakeNcclApi::PointerGetAttributes(const void* ptr, cuda::PointerInfo* info) {
  pointer_queries_.fetch_add(1);
  absl::MutexLock lock(&world_->mu);
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  info->is_device = true;
  info->device = 0;
  for (const auto& [start, bytes] : state_->host_ranges) {
    if (p >= start && p < start + bytes) {
      info->is_device = false;
      info->device = -1;
    }
  }
  return cuda::kCudaSuccess;
}
int FakeNcclApi::StreamCreateNonBlocking(cuda::CudaStream* stream) {
  absl::MutexLock lock(&world_->mu);
  *stream = reinterpret_cast<void*>(state_->next_handle++);
  state_->stream_devices[*stream] = current_device;
  return cuda::kCudaSuccess;
}
int FakeNcclApi::StreamGetDevice(cuda::CudaStream stream, int* device) {
  absl::MutexLock lock(&world_->mu);
  auto it = state_->stream_devices.find(stream);
  if (it == state_->stream_devices.end()) return cuda::kCudaErrorNotSupported;  // a test's handle
  *device = it->second;
  return cuda::kCudaSuccess;
}
void FakeNcclApi::HoldStreams(bool hold) {
  absl::MutexLock lock(&world_->mu);
  state_->holding = hold;
}
int FakeNcclApi::StepHeldDevice() {
  absl::MutexLock lock(&world_->mu);
  State& st = *state_;
  const int before = st.collectives_started;
  std::vector<void*> streams;
  for (const auto& [stream, queue] : st.deferred) streams.push_back(stream);
  st.held_starts = 1;
  for (void* stream : streams) st.Flush(world_->mu, stream, /*blocking=*/false);
  st.held_starts = 0;
  return st.collectives_started - before;
}
int FakeNcclApi::collectives_started() const {
  absl::MutexLock lock(&world_->mu);
  return state_->collectives_started;
}
int FakeNcclApi::StreamDestroy(cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  state_->Flush(world_->mu, stream, /*blocking=*/false);
  state_->deferred.erase(stream);
  state_->stream_last.erase(stream);
  state_->stream_devices.erase(stream);
  return cuda::kCudaSuccess;
}
int FakeNcclApi::EventCreateDisableTiming(cuda::CudaEvent* event) {
  absl::MutexLock lock(&world_->mu);
  *event = reinterpret_cast<void*>(state_->next_handle++);
  state_->events[*event] = nullptr;
  return cuda::kCudaSuccess;
}
int FakeNcclApi::EventCreateWithTiming(cuda::CudaEvent* event) {
  if (faults_.timing_events_unsupported) return cuda::kCudaErrorNotSupported;
  timing_events_created_.fetch_add(1);
  absl::MutexLock lock(&world_->mu);
  *event = reinterpret_cast<void*>(state_->next_handle++);
  state_->events[*event] = nullptr;
  state_->timing_events.insert(*event);
  return cuda::kCudaSuccess;
}
int FakeNcclApi::EventElapsedTime(float* ms, cuda::CudaEvent start, cuda::CudaEvent end) {
  elapsed_calls_.fetch_add(1);
  absl::MutexLock lock(&world_->mu);
  State& st = *state_;
  st.Log("EventElapsedTime", nullptr, end);
  for (cuda::CudaEvent e : {start, end}) {
    if (st.events.count(e) == 0 || st.timing_events.count(e) == 0) return 400;
    if (st.captured_events.count(e) != 0) return cuda::kCudaErrorCapturedEvent;
  }
  for (cuda::CudaEvent e : {start, end}) {
    const std::shared_ptr<FakeOp>& op = st.events[e];
    if (op != nullptr && !op->done()) {
      elapsed_not_ready_.fetch_add(1);
      return cuda::kCudaErrorNotReady;
    }
  }
  *ms = faults_.event_elapsed_ms;
  return cuda::kCudaSuccess;
}
int FakeNcclApi::events_alive() const {
  absl::MutexLock lock(&world_->mu);
  return static_cast<int>(state_->events.size());
}
int FakeNcclApi::EventRecord(cuda::CudaEvent event, cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  State& st = *state_;
  st.Log("EventRecord", stream, event);
  if (auto c = st.capturing.find(stream); c != st.capturing.end()) {
    st.captured_events[event] = c->second;  // a node of the capture: never completes as such
    return cuda::kCudaSuccess;
  }
  st.captured_events.erase(event);
  auto it = st.stream_last.find(stream);
  std::shared_ptr<FakeOp> last = it == st.stream_last.end() ? nullptr : it->second;
  auto q = st.deferred.find(stream);
  if (q == st.deferred.end() || q->second.empty()) {
    st.events[event] = last;
    return cuda::kCudaSuccess;
  }
  // Behind deferred work: the event completes when the stream is forced up to here.
  if (last != nullptr && !last->done()) {
    q->second.push_back(
        Deferred{Deferred::Kind::kWait, {}, nullptr, nullptr, 0, 1.0f, nullptr, last, nullptr});
  }
  auto marker = std::make_shared<FakeOp>();
  marker->pending = 1;
  marker->marker_stream = stream;
  marker->on_stream = true;
  q->second.push_back(
      Deferred{Deferred::Kind::kMarker, {}, nullptr, nullptr, 0, 1.0f, nullptr, marker, nullptr});
  st.events[event] = marker;
  return cuda::kCudaSuccess;
}
int FakeNcclApi::EventQuery(cuda::CudaEvent event) {
  event_queries_.fetch_add(1);
  if (faults_.event_query_takes > absl::ZeroDuration()) absl::SleepFor(faults_.event_query_takes);
  absl::MutexLock lock(&world_->mu);
  auto it = state_->events.find(event);
  if (it == state_->events.end()) return 400;  // cudaErrorInvalidResourceHandle
  if (auto c = state_->captured_events.find(event); c != state_->captured_events.end()) {
    c->second->invalidated = true;
    return cuda::kCudaErrorCapturedEvent;
  }
  if (!state_->UnsafeCallAllowed()) return cuda::kCudaErrorStreamCaptureUnsupported;
  if (it->second != nullptr && !it->second->done() && it->second->on_stream) {
    std::shared_ptr<FakeOp> op = it->second;
    state_->Flush(world_->mu, op->marker_stream, /*blocking=*/false);
    return op->done() ? cuda::kCudaSuccess : cuda::kCudaErrorNotReady;
  }
  return it->second == nullptr || it->second->done() ? cuda::kCudaSuccess
                                                     : cuda::kCudaErrorNotReady;
}
int FakeNcclApi::EventDestroy(cuda::CudaEvent event) {
  absl::MutexLock lock(&world_->mu);
  state_->events.erase(event);
  state_->timing_events.erase(event);
  return cuda::kCudaSuccess;
}
int FakeNcclApi::MemcpyAsync(void* dst, const void* src, size_t bytes, cuda::MemcpyKind,
                             cuda::CudaStream stream) {
  memcpy_calls_.fetch_add(1);
  absl::MutexLock lock(&world_->mu);
  State& st = *state_;
  st.Log("MemcpyAsync", stream);
  if (st.CaptureOf(stream) != nullptr) return cuda::kCudaSuccess;  // captured, not run
  // Behind the collective launched last on the stream, as on a GPU: a copy into a buffer that
  // collective still reads (a reused staging buffer) waits for it.
  if (auto q = st.deferred.find(stream); q == st.deferred.end() || q->second.empty()) {
    auto last = st.stream_last.find(stream);
    if (last != st.stream_last.end() && last->second != nullptr && !last->second->done()) {
      st.deferred[stream].push_back(Deferred{
          Deferred::Kind::kWait, {}, nullptr, nullptr, 0, 1.0f, nullptr, last->second, nullptr});
    }
  }
  st.deferred[stream].push_back(
      Deferred{Deferred::Kind::kCopy, {}, src, dst, bytes, 1.0f, nullptr, nullptr, nullptr});
  return cuda::kCudaSuccess;
}
int FakeNcclApi::Malloc(void** ptr, size_t bytes) {
  malloc_calls_.fetch_add(1);
  {
    absl::MutexLock lock(&world_->mu);
    if (!state_->UnsafeCallAllowed()) {
      *ptr = nullptr;
      return cuda::kCudaErrorStreamCaptureUnsupported;
    }
  }
  // Uninitialised, as cudaMalloc's is. (calloc would be no better a model, and sanitizers clear
  // what it returns byte by byte: TSan took seconds for the retry records' 1 GiB slab.)
  *ptr = std::malloc(bytes);
  return *ptr != nullptr || bytes == 0 ? cuda::kCudaSuccess : 2;
}
int FakeNcclApi::Free(void* ptr) {
  std::free(ptr);
  return cuda::kCudaSuccess;
}
int FakeNcclApi::HostAlloc(void** ptr, size_t bytes) {
  if (faults_.host_alloc_fails) {
    *ptr = nullptr;
    return 2;  // cudaErrorMemoryAllocation
  }
  void* p = std::malloc(bytes);
  *ptr = p;
  absl::MutexLock lock(&world_->mu);
  state_->host_ranges.push_back({reinterpret_cast<uintptr_t>(p), bytes});
  return cuda::kCudaSuccess;
}
int FakeNcclApi::FreeHost(void* ptr) {
  {
    // Its range is no longer host memory of this runtime: a later Malloc may get the same address
    // (std::malloc), which PointerGetAttributes must then call device memory.
    absl::MutexLock lock(&world_->mu);
    auto& ranges = state_->host_ranges;
    ranges.erase(std::remove_if(
                     ranges.begin(), ranges.end(),
                     [ptr](const auto& r) { return r.first == reinterpret_cast<uintptr_t>(ptr); }),
                 ranges.end());
  }
  std::free(ptr);
  return cuda::kCudaSuccess;
}
int FakeNcclApi::LaunchHostFunc(cuda::CudaStream stream, void (*fn)(void*), void* arg) {
  {
    absl::MutexLock lock(&world_->mu);
    if (state_->CaptureOf(stream) != nullptr) return cuda::kCudaSuccess;  // captured, not run
    if (!state_->Flush(world_->mu, stream, /*blocking=*/true)) return 999;
  }
  fn(arg);  // the fake's streams have nothing else to wait for
  return cuda::kCudaSuccess;
}
std::string FakeNcclApi::ErrorString(int error) {
  if (error == cuda::kCudaErrorNoDevice) return "cudaErrorNoDevice: no CUDA-capable device";
  return absl::StrCat("fake cuda error ", error);
}
int FakeNcclApi::StreamWaitEvent(cuda::CudaStream stream, cuda::CudaEvent event) {
  absl::MutexLock lock(&world_->mu);
  State& st = *state_;
  st.Log("StreamWaitEvent", stream, event);
  auto it = st.events.find(event);
  if (it == st.events.end()) return 400;
  CaptureSeq* waiter = st.CaptureOf(stream);
  if (auto c = st.captured_events.find(event); c != st.captured_events.end()) {
    if (waiter == nullptr) {
      st.capturing[stream] = c->second;  // the waiting stream joins the capture
      return cuda::kCudaSuccess;
    }
    if (waiter == c->second.get()) return cuda::kCudaSuccess;
    waiter->invalidated = c->second->invalidated = true;
    return 902;  // cudaErrorStreamCaptureMerge
  }
  if (waiter != nullptr) {
    waiter->invalidated = true;
    return cuda::kCudaErrorStreamCaptureIsolation;
  }
  std::shared_ptr<FakeOp> op = it->second;
  if (op == nullptr || op->done()) return cuda::kCudaSuccess;
  // The waiting stream's later work needs the event's work: force that stream (casts run now).
  if (op->on_stream) st.Flush(world_->mu, op->marker_stream, /*blocking=*/false);
  if (!op->done()) {
    st.deferred[stream].push_back(
        Deferred{Deferred::Kind::kWait, {}, nullptr, nullptr, 0, 1.0f, nullptr, op, nullptr});
  }
  return cuda::kCudaSuccess;
}
int FakeNcclApi::StreamSynchronize(cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  State& st = *state_;
  st.Log("StreamSynchronize", stream);
  if (CaptureSeq* c = st.CaptureOf(stream); c != nullptr) {
    c->invalidated = true;
    return cuda::kCudaErrorStreamCaptureUnsupported;
  }
  if (!st.Flush(world_->mu, stream, /*blocking=*/true)) return 999;
  auto it = st.stream_last.find(stream);
  if (it == st.stream_last.end() || it->second == nullptr) return cuda::kCudaSuccess;
  std::shared_ptr<FakeOp> op = it->second;
  return world_->mu.AwaitWithTimeout(absl::Condition(op.get(), &FakeOp::done), kFlushBound)
             ? cuda::kCudaSuccess
             : 999;
}
int FakeNcclApi::MemsetAsync(void* ptr, int value, size_t bytes, cuda::CudaStream stream) {
  {
    absl::MutexLock lock(&world_->mu);
    state_->Log("MemsetAsync", stream);
    if (state_->CaptureOf(stream) != nullptr) return cuda::kCudaSuccess;  // captured, not run
    if (!state_->Flush(world_->mu, stream, /*blocking=*/true)) return 999;
  }
  std::memset(ptr, value, bytes);
  return cuda::kCudaSuccess;
}
int FakeNcclApi::LaunchCast(cuda::CastDirection direction, const void* src, void* dst, size_t count,
                            float scale, cuda::CudaStream stream,
                            cuda::DeviceCastCounters* counters) {
  cast_calls_.fetch_add(1);
  absl::MutexLock lock(&world_->mu);
  State& st = *state_;
  st.Log("LaunchCast", stream, nullptr, DirectionName(direction));
  if (faults_.launch_cast_error != cuda::kCudaSuccess) return faults_.launch_cast_error;
  const bool widen =
      direction == cuda::CastDirection::kBF16ToF32 || direction == cuda::CastDirection::kF16ToF32;
  if (count > 0 && (src == nullptr || (dst == nullptr && !widen))) return 1;  // InvalidValue
  if (st.CaptureOf(stream) != nullptr) return cuda::kCudaSuccess;             // captured, not run
  st.deferred[stream].push_back(Deferred{Deferred::Kind::kCast, direction, src, dst, count, scale,
                                         counters, nullptr, nullptr});
  return cuda::kCudaSuccess;
}
std::vector<FakeCall> FakeNcclApi::calls() const {
  absl::MutexLock lock(&world_->mu);
  return state_->calls;
}
void FakeNcclApi::ClearCalls() {
  absl::MutexLock lock(&world_->mu);
  state_->calls.clear();
}
int FakeNcclApi::StreamIsCapturing(cuda::CudaStream stream, cuda::CaptureStatus* status) {
  absl::MutexLock lock(&world_->mu);
  const CaptureSeq* c = state_->CaptureOf(stream);
  *status = c == nullptr     ? cuda::CaptureStatus::kNone
            : c->invalidated ? cuda::CaptureStatus::kInvalidated
                             : cuda::CaptureStatus::kActive;
  return cuda::kCudaSuccess;
}
int FakeNcclApi::ThreadExchangeStreamCaptureMode(cuda::CaptureMode* mode) {
  std::swap(*mode, thread_capture_mode);
  return cuda::kCudaSuccess;
}
void FakeNcclApi::BeginCapture(cuda::CudaStream stream, cuda::CaptureMode mode) {
  absl::MutexLock lock(&world_->mu);
  auto seq = std::make_shared<CaptureSeq>();
  seq->thread = std::this_thread::get_id();
  seq->mode = mode;
  state_->capturing[stream] = std::move(seq);
}
int FakeNcclApi::EndCapture(cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  auto it = state_->capturing.find(stream);
  if (it == state_->capturing.end()) return 903;  // cudaErrorStreamCaptureUnmatched
  const std::shared_ptr<CaptureSeq> seq = it->second;
  for (auto s = state_->capturing.begin(); s != state_->capturing.end();) {
    s = s->second == seq ? state_->capturing.erase(s) : std::next(s);
  }
  return seq->invalidated ? cuda::kCudaErrorStreamCaptureInvalidated : cuda::kCudaSuccess;
}

NcclResult FakeNcclApi::GetVersion(int* version) {
  *version = faults_.version;
  return NcclResult::kSuccess;
}
NcclResult FakeNcclApi::GetUniqueId(nccl::NcclUniqueId* id) {
  absl::MutexLock lock(&world_->mu);
  const std::string text = absl::StrCat("fake-uid-", world_->next_uid++);
  *id = nccl::NcclUniqueId{};
  std::memcpy(id->internal, text.data(), text.size());
  return NcclResult::kSuccess;
}
NcclResult FakeNcclApi::CommInitRankConfig(NcclComm* comm, int nranks, const nccl::NcclUniqueId& id,
                                           int rank, const nccl::NcclCommConfig& config) {
  const int call = init_calls_.fetch_add(1) + 1;
  absl::MutexLock lock(&world_->mu);
  state_->last_config = config;
  *comm = nullptr;
  if (faults_.init_invalid_usage) return NcclResult::kInvalidUsage;
  auto c = std::make_unique<FakeComm>();
  const std::string key(id.internal, strnlen(id.internal, sizeof(id.internal)));
  auto& g = world_->groups[key];
  if (g == nullptr) {
    g = std::make_shared<Group>();
    g->nranks = nranks;
  }
  c->group = g;
  c->rank = rank;
  c->nranks = nranks;
  c->init_failed = faults_.init_fails || call <= faults_.init_fails_first;
  c->init_never = faults_.init_never_finishes;
  if (!c->init_failed && !c->init_never) ++g->joined;
  *comm = reinterpret_cast<NcclComm>(c.get());
  c->index = static_cast<int>(state_->comms.size()) + 1;
  state_->comms.push_back(std::move(c));
  return NcclResult::kInProgress;
}
NcclResult FakeNcclApi::CommGetAsyncError(NcclComm comm, NcclResult* async_error) {
  absl::MutexLock lock(&world_->mu);
  FakeComm* c = Comm(comm);
  if (c->init_failed) {
    c->last_error = "fake: init failed (injected)";
    *async_error = NcclResult::kSystemError;
  } else if (c->group != nullptr && c->group->peer_failed) {
    c->last_error = "fake: a peer of this ncclCommSplit failed";
    *async_error = NcclResult::kRemoteError;
  } else if (c->init_never || c->group == nullptr || c->group->joined < c->nranks) {
    *async_error = NcclResult::kInProgress;
  } else {
    *async_error = c->async;
  }
  return NcclResult::kSuccess;
}
NcclResult FakeNcclApi::CommFinalize(NcclComm) {
  finalize_calls_.fetch_add(1);
  return NcclResult::kSuccess;
}
NcclResult FakeNcclApi::CommDestroy(NcclComm) {
  destroy_calls_.fetch_add(1);
  return NcclResult::kSuccess;
}
NcclResult FakeNcclApi::CommAbort(NcclComm comm) {
  abort_calls_.fetch_add(1);
  if (faults_.abort_hangs_for > absl::ZeroDuration()) absl::SleepFor(faults_.abort_hangs_for);
  absl::MutexLock lock(&world_->mu);
  if (comm == nullptr) return NcclResult::kSuccess;
  FakeComm* c = Comm(comm);
  c->aborted = true;
  for (const std::weak_ptr<FakeOp>& op : c->ops) {
    if (auto live = op.lock()) live->aborted = true;
  }
  return NcclResult::kSuccess;
}
std::vector<int> FakeNcclApi::last_shrink_flags() const {
  absl::MutexLock lock(&world_->mu);
  return state_->shrink_flags;
}
NcclResult FakeNcclApi::CommShrink(NcclComm comm, const std::vector<int>& exclude_ranks,
                                   NcclComm* newcomm, const nccl::NcclCommConfig* config,
                                   int shrink_flags) {
  *newcomm = nullptr;
  if (!faults_.has_comm_shrink) return NcclResult::kInvalidUsage;  // no such symbol
  shrink_calls_.fetch_add(1);
  absl::MutexLock lock(&world_->mu);
  state_->shrink_flags.push_back(shrink_flags);
  if (config != nullptr) state_->last_config = *config;
  FakeComm* parent = Comm(comm);
  if (parent == nullptr || parent->aborted) return NcclResult::kInvalidUsage;
  std::vector<int> excluded = exclude_ranks;
  std::sort(excluded.begin(), excluded.end());
  for (int r : excluded) {
    if (r < 0 || r >= parent->nranks || r == parent->rank) return NcclResult::kInvalidArgument;
  }
  if (shrink_flags == nccl::kShrinkAbort) {
    // The parent's ongoing operations end first (they would wait for the excluded ranks).
    for (const std::weak_ptr<FakeOp>& op : parent->ops) {
      if (auto live = op.lock()) live->aborted = true;
    }
  } else if (parent->async != NcclResult::kSuccess) {
    parent->last_error = "fake: ncclCommShrink of a communicator in error needs NCCL_SHRINK_ABORT";
    return NcclResult::kInvalidUsage;
  }
  auto& g = parent->group->shrunk[excluded];
  if (g == nullptr) {
    g = std::make_shared<Group>();
    g->nranks = parent->nranks - static_cast<int>(excluded.size());
  }
  auto c = std::make_unique<FakeComm>();
  c->group = g;
  c->nranks = g->nranks;
  c->rank =
      parent->rank - static_cast<int>(std::count_if(excluded.begin(), excluded.end(),
                                                    [parent](int r) { return r < parent->rank; }));
  c->init_failed = faults_.shrink_fails;
  if (!c->init_failed) ++g->joined;
  *newcomm = reinterpret_cast<NcclComm>(c.get());
  c->index = static_cast<int>(state_->comms.size()) + 1;
  state_->comms.push_back(std::move(c));
  return NcclResult::kInProgress;
}
std::vector<std::pair<int, int>> FakeNcclApi::split_args() const {
  absl::MutexLock lock(&world_->mu);
  return state_->split_args;
}
NcclResult FakeNcclApi::CommSplit(NcclComm comm, int color, int key, NcclComm* newcomm,
                                  const nccl::NcclCommConfig* config) {
  *newcomm = nullptr;
  if (!faults_.has_comm_split) return NcclResult::kInvalidUsage;  // no such symbol
  split_calls_.fetch_add(1);
  absl::MutexLock lock(&world_->mu);
  state_->split_args.emplace_back(color, key);
  if (config != nullptr) state_->last_config = *config;
  FakeComm* parent = Comm(comm);
  if (parent == nullptr || parent->aborted || parent->group == nullptr) {
    return NcclResult::kInvalidUsage;
  }
  if (color < nccl::kSplitNoColor) return NcclResult::kInvalidArgument;
  std::map<int, Group::SplitCall>& round = parent->group->splits[parent->splits++];
  FakeComm* child = nullptr;
  if (color != nccl::kSplitNoColor) {
    auto c = std::make_unique<FakeComm>();  // joins its group once every parent rank called
    c->init_failed = faults_.split_fails;
    c->index = static_cast<int>(state_->comms.size()) + 1;
    child = c.get();
    state_->comms.push_back(std::move(c));
    *newcomm = reinterpret_cast<NcclComm>(child);
  }
  round[parent->rank] = Group::SplitCall{color, key, child};
  // A rank without a color has nothing to wait for (its part is its call).
  const NcclResult returned =
      color == nccl::kSplitNoColor ? NcclResult::kSuccess : NcclResult::kInProgress;
  if (static_cast<int>(round.size()) < parent->nranks) return returned;
  // Every rank of the parent called: one group per color, ranked by key, then parent rank.
  std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, parent rank)
  for (const auto& [rank, call] : round) {
    if (call.color != nccl::kSplitNoColor) by_color[call.color].emplace_back(call.key, rank);
  }
  for (auto& [c, members] : by_color) {
    std::sort(members.begin(), members.end());
    auto g = std::make_shared<Group>();
    g->nranks = static_cast<int>(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      FakeComm* made = round[members[i].second].child;
      made->group = g;
      made->rank = static_cast<int>(i);
      made->nranks = g->nranks;
      if (!made->init_failed) ++g->joined;
      g->peer_failed = g->peer_failed || made->init_failed;
    }
  }
  return returned;
}
std::string FakeNcclApi::GetErrorString(NcclResult result) { return nccl::NcclResultName(result); }
std::string FakeNcclApi::GetLastError(NcclComm comm) {
  absl::MutexLock lock(&world_->mu);
  if (comm == nullptr) return faults_.init_invalid_usage ? "fake: invalid config (injected)" : "";
  return Comm(comm)->last_error;
}

NcclResult FakeNcclApi::GroupStart() {
  absl::MutexLock lock(&world_->mu);
  state_->in_group = true;
  return NcclResult::kSuccess;
}

namespace {

// One launch of `parts` and `p2p` on `c`: posts them to the world; returns the op to track.
std::shared_ptr<FakeOp> Launch(FakeComm* c, const FakeNcclFaults& faults, std::vector<Part> parts,
                               std::vector<std::pair<Message, std::pair<int, int>>> p2p,
                               std::shared_ptr<FakeOp> fop) {
  if (fop == nullptr) fop = std::make_shared<FakeOp>();
  c->ops.push_back(fop);
  ++c->launches;
  if (c->launches == faults.async_error_at_launch &&
      (faults.async_error_on_comm == 0 || faults.async_error_on_comm == c->index)) {
    c->async = faults.async_error;
    c->last_error = "fake: peer connection lost (injected)";
    fop->pending = 1;  // never completes
    return fop;
  }
  if (c->launches == faults.hang_at_launch) {
    fop->pending = 1;
    return fop;
  }
  fop->pending = static_cast<int>(parts.size() + p2p.size());
  if (c->index == 1 && c->launches == faults.completion_lost_at_launch) {
    ++fop->pending;  // one that never comes
  }
  Group& g = *c->group;
  for (Part& p : parts) {
    p.fop = fop;
    auto& slot = g.collectives[c->collective_index++];
    slot.resize(static_cast<size_t>(c->nranks));
    slot[static_cast<size_t>(c->rank)] = std::move(p);
    bool all = true;
    for (const auto& s : slot) all = all && s.has_value();
    if (all) Execute(slot);
  }
  for (auto& [m, peer_send] : p2p) {
    m.fop = fop;
    const auto [peer, is_send] = peer_send;
    const std::pair<int, int> key =
        is_send ? std::make_pair(c->rank, peer) : std::make_pair(peer, c->rank);
    auto& mine = is_send ? g.sends[key] : g.recvs[key];
    auto& theirs = is_send ? g.recvs[key] : g.sends[key];
    mine.push_back(m);
    while (!mine.empty() && !theirs.empty()) {
      Message a = mine.front(), b = theirs.front();
      mine.pop_front();
      theirs.pop_front();
      const Message& s = is_send ? a : b;
      const Message& r = is_send ? b : a;
      // A zero-byte message may carry null buffers, which memcpy must not be given.
      if (const size_t n = std::min(s.bytes, r.bytes); n > 0 && !r.fop->aborted) {
        std::memcpy(r.recv, s.send, n);
      }
      --a.fop->pending;
      --b.fop->pending;
    }
  }
  return fop;
}

}  // namespace

NcclResult FakeNcclApi::GroupEnd() {
  absl::MutexLock lock(&world_->mu);
  State& st = *state_;
  st.in_group = false;
  if (st.group_comm != nullptr && st.CaptureOf(st.group_stream) == nullptr) {
    if (st.holding) {
      // Queued on the stream as one launch, as a single collective is (Post).
      st.stream_last[st.group_stream] = st.DeferCollective(
          st.group_stream, HeldCollective{st.group_comm, std::move(st.group_collectives),
                                          std::move(st.group_p2p), &faults_});
    } else {
      st.Flush(world_->mu, st.group_stream, /*blocking=*/true);
      ++st.collectives_started;
      st.stream_last[st.group_stream] =
          Launch(st.group_comm, faults_, std::move(st.group_collectives), std::move(st.group_p2p));
    }
  }
  st.group_collectives.clear();
  st.group_p2p.clear();
  st.group_comm = nullptr;
  return NcclResult::kInProgress;
}

namespace {
NcclResult Post([[maybe_unused]] absl::Mutex& mu, FakeNcclApi::State& st,
                const FakeNcclFaults& faults, FakeComm* c, void* stream, const char* name,
                Part part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  st.Log(name, stream, nullptr, absl::StrCat(static_cast<int>(part.dtype)));
  if (c->aborted) return NcclResult::kInvalidUsage;
  if (!st.in_group && st.CaptureOf(stream) != nullptr) {
    return NcclResult::kSuccess;  // captured into the graph: launched only when it is replayed
  }
  if (st.in_group) {
    st.group_comm = c;
    st.group_stream = stream;
    st.group_collectives.push_back(std::move(part));
    return NcclResult::kSuccess;
  }
  if (st.holding || !st.deferred[stream].empty()) {
    // Behind deferred work (or while held): queued on the stream, as a GPU queues it, and
    // launched when the stream is forced. Enqueuing never waits for the stream.
    st.stream_last[stream] =
        st.DeferCollective(stream, HeldCollective{c, {std::move(part)}, {}, &faults});
    return NcclResult::kInProgress;
  }
  st.deferred.erase(stream);
  ++st.collectives_started;
  st.stream_last[stream] = Launch(c, faults, {std::move(part)}, {});
  return NcclResult::kInProgress;
}
}  // namespace

NcclResult FakeNcclApi::AllReduce(const void* send, void* recv, size_t count, NcclDataType dtype,
                                  NcclRedOp op, NcclComm comm, cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  state_->dtypes.push_back(dtype);
  state_->ops.push_back(op);
  return Post(world_->mu, *state_, faults_, Comm(comm), stream, "AllReduce",
              Part{Kind::kAllReduce, send, recv, count, dtype, op, 0, nullptr});
}
NcclResult FakeNcclApi::Broadcast(const void* send, void* recv, size_t count, NcclDataType dtype,
                                  int root, NcclComm comm, cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  state_->dtypes.push_back(dtype);
  return Post(world_->mu, *state_, faults_, Comm(comm), stream, "Broadcast",
              Part{Kind::kBroadcast, send, recv, count, dtype, NcclRedOp::kSum, root, nullptr});
}
NcclResult FakeNcclApi::Reduce(const void* send, void* recv, size_t count, NcclDataType dtype,
                               NcclRedOp op, int root, NcclComm comm, cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  state_->dtypes.push_back(dtype);
  state_->ops.push_back(op);
  return Post(world_->mu, *state_, faults_, Comm(comm), stream, "Reduce",
              Part{Kind::kReduce, send, recv, count, dtype, op, root, nullptr});
}
NcclResult FakeNcclApi::AllGather(const void* send, void* recv, size_t send_count,
                                  NcclDataType dtype, NcclComm comm, cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  state_->dtypes.push_back(dtype);
  return Post(world_->mu, *state_, faults_, Comm(comm), stream, "AllGather",
              Part{Kind::kAllGather, send, recv, send_count, dtype, NcclRedOp::kSum, 0, nullptr});
}
NcclResult FakeNcclApi::ReduceScatter(const void* send, void* recv, size_t recv_count,
                                      NcclDataType dtype, NcclRedOp op, NcclComm comm,
                                      cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  state_->dtypes.push_back(dtype);
  state_->ops.push_back(op);
  return Post(world_->mu, *state_, faults_, Comm(comm), stream, "ReduceScatter",
              Part{Kind::kReduceScatter, send, recv, recv_count, dtype, op, 0, nullptr});
}
NcclResult FakeNcclApi::AlltoAll(const void* send, void* recv, size_t count, NcclDataType dtype,
                                 NcclComm comm, cuda::CudaStream stream) {
  if (!faults_.has_alltoall) return NcclResult::kInvalidUsage;
  absl::MutexLock lock(&world_->mu);
  const size_t bytes = count * Size(dtype) * static_cast<size_t>(Comm(comm)->nranks);
  const auto* s = static_cast<const char*>(send);
  const auto* r = static_cast<const char*>(recv);
  if (bytes > 0 && s < r + bytes && r < s + bytes) {
    // NCCL documents in-place operation for its other collectives, not for ncclAlltoAll: the
    // fake refuses it rather than guess what a real one does.
    Comm(comm)->last_error = "fake: ncclAlltoAll with overlapping send and receive buffers";
    return NcclResult::kInvalidArgument;
  }
  state_->dtypes.push_back(dtype);
  return Post(world_->mu, *state_, faults_, Comm(comm), stream, "AlltoAll",
              Part{Kind::kAllToAll, send, recv, count, dtype, NcclRedOp::kSum, 0, nullptr});
}
NcclResult FakeNcclApi::Send(const void* send, size_t count, NcclDataType dtype, int peer,
                             NcclComm comm, cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  if (!state_->in_group) return NcclResult::kInvalidUsage;  // the backend always groups p2p
  state_->Log("Send", stream, nullptr, absl::StrCat(static_cast<int>(dtype)));
  state_->group_comm = Comm(comm);
  state_->group_stream = stream;
  state_->group_p2p.push_back(
      {Message{send, nullptr, count * Size(dtype), nullptr}, std::make_pair(peer, 1)});
  return NcclResult::kSuccess;
}
NcclResult FakeNcclApi::Recv(void* recv, size_t count, NcclDataType dtype, int peer, NcclComm comm,
                             cuda::CudaStream stream) {
  absl::MutexLock lock(&world_->mu);
  if (!state_->in_group) return NcclResult::kInvalidUsage;
  state_->Log("Recv", stream, nullptr, absl::StrCat(static_cast<int>(dtype)));
  state_->group_comm = Comm(comm);
  state_->group_stream = stream;
  state_->group_p2p.push_back(
      {Message{nullptr, recv, count * Size(dtype), nullptr}, std::make_pair(peer, 0)});
  return NcclResult::kSuccess;
}

}  // namespace adaptcomm::testing

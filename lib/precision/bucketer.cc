// GradientBucketer (adaptcomm/bucketer.h): buckets assigned once from the registration, launched
// strictly in bucket order, and one error exchange per step so that every rank fails alike.
#include "adaptcomm/bucketer.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "lib/cuda/cuda_api.h"
#include "lib/precision/bucketer_device.h"
#include "lib/precision/bucketer_registration.h"

namespace adaptcomm {
namespace {

using bucketer::CheckSameOnEveryRank;
using bucketer::DescribeTensor;
using bucketer::Gather;
using bucketer::TensorCode;
using bucketer::ValidateOptions;

// Bucketing errors, exchanged at every Wait (one int64 per rank: kind << 32 | tensor + 1).
enum ErrorKind : int64_t { kNoError = 0, kNeverReady = 1, kReadyTwice = 2, kBadView = 3 };

const char* ErrorText(int64_t kind) {
  switch (kind) {
    case kNeverReady:
      return "was never marked ready in this step";
    case kReadyTwice:
      return "was marked ready twice in this step";
    case kBadView:
      return "was marked ready with a view unlike its registration (or an unknown index)";
    default:
      return "had an unknown bucketing error";
  }
}

bool SameDevice(const Device& a, const Device& b) {
  return a.type == b.type && (a.type == DeviceType::kCpu || a.index == b.index);
}

}  // namespace

struct GradientBucketer::State {
  State(Communicator& c, std::vector<GradientSpec> t, const BucketerOptions& o)
      : comm(c), specs(std::move(t)), options(o) {}

  Communicator& comm;
  const std::vector<GradientSpec> specs;
  BucketerOptions options;
  std::vector<BucketInfo> buckets;
  std::vector<int> bucket_of;
  std::vector<size_t> offset;                         // byte offset of each tensor in its bucket
  std::vector<std::unique_ptr<std::byte[]>> buffers;  // per host bucket (null for CUDA)
  // Per fused CUDA bucket, in the scratch's device memory (null otherwise), and the event its
  // copy-back was recorded with; per fused CUDA tensor, the event of its MarkReady.
  std::vector<void*> device_buffers;
  std::vector<cuda::CudaEvent> copied_back;
  std::vector<cuda::CudaEvent> marked;
  std::unique_ptr<MixedPrecisionContext> mixed;  // wire != f32
  // The bookkeeping exchanges on a device-only backend, and zeros for unmarked CUDA tensors; null
  // where there is no CUDA runtime (a host backend without CUDA tensors needs none).
  std::unique_ptr<bucketer::DeviceScratch> scratch;
  bool host_exchange = true;  // the backend takes host memory
  absl::Duration op_timeout;

  absl::Mutex mu;
  // Per step.
  std::vector<uint8_t> claimed ABSL_GUARDED_BY(mu);     // MarkReady began for the tensor
  std::vector<uint8_t> recorded ABSL_GUARDED_BY(mu);    // its `marked` event was recorded
  absl::Status device_error ABSL_GUARDED_BY(mu);        // a failed CUDA call of this step
  std::vector<TensorView> dest ABSL_GUARDED_BY(mu);     // where Wait copies the result (or none)
  std::vector<int> missing ABSL_GUARDED_BY(mu);         // per bucket: tensors not ready yet
  std::vector<TensorView> reduced ABSL_GUARDED_BY(mu);  // per bucket: the view its allreduce ran on
  // Per bucket (plain wire); shared so that Wait() waits outside the lock while bucket_state()
  // still reads them.
  std::vector<std::shared_ptr<Work>> works ABSL_GUARDED_BY(mu);
  int next_launch ABSL_GUARDED_BY(mu) = 0;
  int launched_before_wait ABSL_GUARDED_BY(mu) = 0;
  int64_t error ABSL_GUARDED_BY(mu) = kNoError;  // this rank's first, encoded
  absl::Status broken ABSL_GUARDED_BY(mu);

  // Mixed wire: a thread runs the launched buckets in order (AllreduceMixed is synchronous).
  std::deque<int> queue ABSL_GUARDED_BY(mu);
  std::vector<uint8_t> done ABSL_GUARDED_BY(mu);  // per bucket, this step
  std::vector<absl::Status> done_status ABSL_GUARDED_BY(mu);
  size_t cast_overflow ABSL_GUARDED_BY(mu) = 0;
  bool resent ABSL_GUARDED_BY(mu) = false;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::thread worker;

  bool mixed_wire() const { return options.wire != DType::kF32; }
  bool host_bucket(int b) const { return buffers[b] != nullptr; }
  bool device_bucket(int b) const { return device_buffers[b] != nullptr; }

  TensorView Slot(int index) const {
    const int b = bucket_of[index];
    const GradientSpec& s = specs[index];
    if (device_bucket(b)) {
      return TensorView{static_cast<std::byte*>(device_buffers[b]) + offset[index], s.count,
                        s.dtype, s.device, scratch->stream()};
    }
    if (buffers[b] == nullptr) return TensorView{nullptr, 0, s.dtype, s.device, nullptr};
    return TensorView{buffers[b].get() + offset[index], s.count, s.dtype, Device::Cpu(), nullptr};
  }
  TensorView BucketView(int b) const {
    const size_t count = buckets[b].bytes / DTypeSize(buckets[b].dtype);
    if (device_bucket(b)) {
      return TensorView{device_buffers[b], count, buckets[b].dtype, buckets[b].device,
                        scratch->stream()};
    }
    return TensorView{buffers[b].get(), count, buckets[b].dtype, Device::Cpu(), nullptr};
  }

  void ResetStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const size_t n = specs.size(), nb = buckets.size();
    claimed.assign(n, 0);
    recorded.assign(n, 0);
    device_error = absl::OkStatus();
    dest.assign(n, TensorView{});
    missing.assign(nb, 0);
    for (size_t b = 0; b < nb; ++b) missing[b] = static_cast<int>(buckets[b].tensors.size());
    reduced.assign(nb, TensorView{});
    works.assign(nb, nullptr);
    done.assign(nb, 0);
    done_status.assign(nb, absl::OkStatus());
    next_launch = 0;
    launched_before_wait = 0;
    error = kNoError;
    cast_overflow = 0;
    resent = false;
  }

  void RecordError(int64_t kind, int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (error == kNoError) error = (kind << 32) | (static_cast<int64_t>(index + 1) & 0xffffffff);
  }

  // Launches every complete bucket that is next in line: the order is the bucket order on every
  // rank, whatever order the tensors became ready in.
  void LaunchReady(bool from_mark) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (next_launch < static_cast<int>(buckets.size()) && missing[next_launch] == 0) {
      const int b = next_launch++;
      const BucketInfo& info = buckets[b];
      const bool fused = host_bucket(b) || device_bucket(b);
      if (!fused || (info.tensors.size() == 1 && dest[info.tensors[0]].data != nullptr)) {
        // Alone in its bucket (or an unfused CUDA tensor): reduced in place, no copy.
        reduced[b] = dest[info.tensors[0]];
        if (reduced[b].data == nullptr) reduced[b] = BucketView(b);
        dest[info.tensors[0]] = TensorView{};
      } else {
        reduced[b] = BucketView(b);
      }
      if (device_bucket(b) && reduced[b].data == device_buffers[b]) {
        // The bucket's stream waits for every copy into it, each on its tensor's own stream.
        for (int i : info.tensors) {
          if (!recorded[i]) continue;
          if (absl::Status s = scratch->Await(scratch->stream(), marked[i]);
              !s.ok() && device_error.ok()) {
            device_error = s;  // reported by Wait(); the allreduce still runs for the peers
          }
        }
      }
      if (from_mark) ++launched_before_wait;
      if (reduced[b].data == nullptr) {
        done[b] = 1;  // an unmarked CUDA tensor: nothing to reduce (its error is recorded)
        continue;
      }
      if (mixed_wire()) {
        queue.push_back(b);
      } else {
        works[b] =
            std::make_shared<Work>(comm.Allreduce(reduced[b], {options.op, options.timeout}));
      }
    }
  }

  // Queued on the bucket's stream behind its allreduce; then each gradient's stream waits for
  // the copies.
  absl::Status CopyBackOnDevice(int b, const std::vector<TensorView>& to) {
    for (int i : buckets[b].tensors) {
      if (to[i].data == nullptr) continue;
      const TensorView slot = Slot(i);
      if (absl::Status s = scratch->Copy(to[i].data, slot.data, slot.bytes(), scratch->stream());
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = scratch->Record(copied_back[b], scratch->stream()); !s.ok()) return s;
    std::vector<void*> waited;
    for (int i : buckets[b].tensors) {
      if (to[i].data == nullptr ||
          std::find(waited.begin(), waited.end(), to[i].stream) != waited.end()) {
        continue;
      }
      waited.push_back(to[i].stream);
      if (absl::Status s = scratch->Await(to[i].stream, copied_back[b]); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Wait's steps. ClaimUnused: every tensor not marked this step is zeroed (or stood in for)
  // and counted, so that its bucket launches on every rank. AwaitMixedBucket: waits for bucket
  // `b` of a mixed-wire step (false: it never finished, the bucketer is broken; `*status` says
  // so). ExchangeErrors: every rank's first error of the step, max-reduced into `errors` (the
  // step is reset). ErrorOf: the error the exchanged errors name, if any.
  void ClaimUnused(BucketStepStats& stats) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool AwaitMixedBucket(int b, absl::Status* status);
  absl::Status ExchangeErrors(BucketStepStats& stats, std::vector<int64_t>& errors);
  absl::Status ErrorOf(const std::vector<int64_t>& errors) const;

  void RunMixed() {
    for (;;) {
      int b = -1;
      TensorView view;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](State* s)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->stop || !s->queue.empty(); },
            this));
        if (queue.empty()) return;
        b = queue.front();
        queue.pop_front();
        view = reduced[b];
      }
      absl::Status status;
      size_t overflow = 0;
      bool was_resent = false;
      if (view.dtype == DType::kF32) {
        MixedOptions m;
        m.wire = options.wire;
        m.op = options.op;
        m.overflow = options.overflow;
        m.timeout = options.timeout;
        m.context = mixed.get();
        absl::StatusOr<MixedStats> st = AllreduceMixed(comm, view, m);
        status = st.status();
        if (st.ok()) {
          overflow = st->cast_overflow;
          was_resent = st->resent;
        }
      } else {
        status = comm.Allreduce(view, {options.op, options.timeout}).Wait();
      }
      absl::MutexLock lock(&mu);
      done[b] = 1;
      done_status[b] = status;
      cast_overflow += overflow;
      resent = resent || was_resent;
    }
  }
};

absl::StatusOr<std::unique_ptr<GradientBucketer>> GradientBucketer::Create(
    Communicator& comm, std::vector<GradientSpec> tensors, const BucketerOptions& options) {
  if (absl::Status s = ValidateOptions(tensors, options, comm); !s.ok()) return s;
  auto state = std::make_unique<State>(comm, std::move(tensors), options);
  State& st = *state;
  const size_t cap =
      options.bucket_bytes.value_or(static_cast<size_t>(comm.config().buckets.bytes));
  st.op_timeout = options.timeout.value_or(comm.config().timeouts.collective);
  const Capabilities caps = comm.capabilities();
  st.host_exchange = caps.host_memory;
  const auto cuda_tensor = std::find_if(st.specs.begin(), st.specs.end(),
                                        [](const GradientSpec& s) { return s.device.is_cuda(); });
  if (!caps.host_memory || cuda_tensor != st.specs.end()) {
    const int device =
        cuda_tensor != st.specs.end() ? cuda_tensor->device.index : DefaultCudaDevice();
    absl::StatusOr<std::unique_ptr<bucketer::DeviceScratch>> scratch =
        bucketer::DeviceScratch::Create(comm, device, st.op_timeout);
    // A host backend staging CUDA tensors goes on without one (an unmarked CUDA tensor then
    // cannot be stood in for); a device-only backend cannot.
    if (scratch.ok()) {
      st.scratch = *std::move(scratch);
    } else if (!caps.host_memory) {
      return scratch.status();
    }
  }
  Gather gather = [&](const int64_t* mine, size_t count, int64_t* all) -> absl::Status {
    AllgatherOptions ao;
    ao.timeout = options.timeout;
    if (!st.host_exchange) return st.scratch->Allgather(mine, count, all, ao.timeout);
    return comm
        .Allgather(TensorView{const_cast<int64_t*>(mine), count, DType::kI64, Device::Cpu()},
                   HostView(all, count * static_cast<size_t>(comm.size())), ao)
        .Wait();
  };
  // CUDA tensors are fused where the bucketer has device scratch; every rank must, or their
  // buckets differ (the digest compares it).
  const bool fuse_cuda = st.scratch != nullptr && !st.mixed_wire();
  if (absl::Status s = CheckSameOnEveryRank(comm, st.specs, options, cap, fuse_cuda, gather);
      !s.ok()) {
    return s;
  }

  // Reverse registration order, one open bucket per (dtype, device); tensors of direct_bytes or
  // more alone, and CUDA tensors too unless they can be fused in device scratch.
  const int n = static_cast<int>(st.specs.size());
  st.bucket_of.assign(n, -1);
  st.offset.assign(n, 0);
  std::map<std::tuple<int, int, int>, int> open;
  for (int i = n - 1; i >= 0; --i) {
    const GradientSpec& s = st.specs[i];
    const auto key =
        std::make_tuple(static_cast<int>(s.dtype), static_cast<int>(s.device.type), s.device.index);
    auto it = open.find(key);
    const size_t bytes = s.count * DTypeSize(s.dtype);
    const bool alone = (s.device.is_cuda() && !fuse_cuda) ||
                       (options.direct_bytes != 0 && bytes >= options.direct_bytes);
    int b;
    if (it == open.end() || alone) {
      b = static_cast<int>(st.buckets.size());
      st.buckets.push_back(BucketInfo{{}, 0, s.dtype, s.device});
      if (!alone) open[key] = b;
    } else {
      b = it->second;
    }
    BucketInfo& info = st.buckets[b];
    st.bucket_of[i] = b;
    st.offset[i] = info.bytes;
    info.tensors.push_back(i);
    info.bytes += bytes;
    if (!alone && info.bytes >= cap) open.erase(key);
  }
  st.buffers.resize(st.buckets.size());
  st.device_buffers.assign(st.buckets.size(), nullptr);
  st.copied_back.assign(st.buckets.size(), nullptr);
  st.marked.assign(st.specs.size(), nullptr);
  for (size_t b = 0; b < st.buckets.size(); ++b) {
    const BucketInfo& info = st.buckets[b];
    if (!info.device.is_cuda()) {
      // Zeroed: first-touched here rather than inside the first step's backward.
      st.buffers[b].reset(new std::byte[info.bytes]());
      continue;
    }
    if (info.tensors.size() < 2) continue;  // reduced in place in the caller's view
    absl::StatusOr<void*> buffer = st.scratch->Buffer(info.bytes);
    if (!buffer.ok()) return buffer.status();
    st.device_buffers[b] = *buffer;
    absl::StatusOr<cuda::CudaEvent> event = st.scratch->NewEvent();
    if (!event.ok()) return event.status();
    st.copied_back[b] = *event;
    for (int i : info.tensors) {
      event = st.scratch->NewEvent();
      if (!event.ok()) return event.status();
      st.marked[i] = *event;
    }
  }
  if (st.mixed_wire()) {
    st.mixed = std::make_unique<MixedPrecisionContext>(comm);
    size_t largest = 0;
    for (const BucketInfo& info : st.buckets) {
      if (info.dtype == DType::kF32) largest = std::max(largest, info.bytes / sizeof(float));
    }
    st.mixed->Reserve(largest);
  }
  {
    absl::MutexLock lock(&st.mu);
    st.ResetStep();
  }
  if (st.mixed_wire()) st.worker = std::thread([&st] { st.RunMixed(); });
  return std::unique_ptr<GradientBucketer>(new GradientBucketer(std::move(state)));
}

GradientBucketer::GradientBucketer(std::unique_ptr<State> state) : state_(std::move(state)) {}

GradientBucketer::~GradientBucketer() {
  State& st = *state_;
  std::vector<std::shared_ptr<Work>> works;
  {
    absl::MutexLock lock(&st.mu);
    st.stop = true;
    st.queue.clear();
    works = st.works;
  }
  // The buffers must outlive the ops that read them; each wait is bounded by the op's timeout.
  for (const std::shared_ptr<Work>& w : works) {
    if (w != nullptr) (void)w->Wait();
  }
  if (st.worker.joinable()) st.worker.join();
}

int GradientBucketer::tensor_count() const { return static_cast<int>(state_->specs.size()); }
int GradientBucketer::bucket_count() const { return static_cast<int>(state_->buckets.size()); }
const BucketInfo& GradientBucketer::bucket(int b) const {
  static const BucketInfo* const kNone = new BucketInfo();
  return b >= 0 && b < bucket_count() ? state_->buckets[b] : *kNone;
}
int GradientBucketer::bucket_of(int index) const {
  return index >= 0 && index < tensor_count() ? state_->bucket_of[index] : -1;
}

TensorView GradientBucketer::Storage(int index) const {
  if (index < 0 || index >= tensor_count()) return TensorView{};
  return state_->Slot(index);
}

WorkState GradientBucketer::bucket_state(int b) const {
  State& st = *state_;
  absl::MutexLock lock(&st.mu);
  if (b < 0 || b >= st.next_launch) return WorkState::kPending;
  if (st.mixed_wire()) {
    if (!st.done[b]) return WorkState::kPending;
    return st.done_status[b].ok() ? WorkState::kDone : WorkState::kFailed;
  }
  return st.works[b] != nullptr ? st.works[b]->state() : WorkState::kDone;
}

absl::Status GradientBucketer::MarkReady(int index) { return MarkReady(index, Storage(index)); }

absl::Status GradientBucketer::MarkReady(int index, TensorView grad) {
  State& st = *state_;
  const int n = tensor_count();
  TensorView slot;
  {
    absl::MutexLock lock(&st.mu);
    if (!st.broken.ok()) return st.broken;
    if (index < 0 || index >= n) {
      st.RecordError(kBadView, index);
      return absl::InvalidArgumentError(
          absl::StrCat("gradient bucketer: no tensor ", index, " (", n, " registered)"));
    }
    const GradientSpec& s = st.specs[index];
    if (st.claimed[index]) {
      st.RecordError(kReadyTwice, index);
      return absl::FailedPreconditionError(absl::StrCat("gradient bucketer: tensor ", index, " (",
                                                        s.name, ") ", ErrorText(kReadyTwice)));
    }
    if (grad.data == nullptr || grad.count != s.count || grad.dtype != s.dtype ||
        !SameDevice(grad.device, s.device)) {
      st.RecordError(kBadView, index);
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient bucketer: tensor ", index, " (", s.name, ") is registered as ",
          DescribeTensor(static_cast<int64_t>(s.count), TensorCode(s)), " but marked ready with ",
          grad.data == nullptr
              ? "no data"
              : DescribeTensor(static_cast<int64_t>(grad.count),
                               TensorCode({"", grad.count, grad.dtype, grad.device}))));
    }
    st.claimed[index] = 1;
    slot = st.Slot(index);
  }
  // Outside the lock: other tensors are copied concurrently, each into its own slot.
  const int b = st.bucket_of[index];
  const bool alone = st.buckets[b].tensors.size() == 1;
  TensorView dest = grad;
  absl::Status device = absl::OkStatus();
  if (st.device_bucket(b)) {
    // Queued on the gradient's own stream, after the work that produced it; the bucket's stream
    // waits for the event before the allreduce.
    if (grad.data != slot.data)
      device = st.scratch->Copy(slot.data, grad.data, grad.bytes(), grad.stream);
    if (device.ok()) device = st.scratch->Record(st.marked[index], grad.stream);
    if (grad.data == slot.data) dest = TensorView{};
  } else if (slot.data != nullptr && grad.data != slot.data && !alone) {
    std::memcpy(slot.data, grad.data, grad.bytes());
  } else if (grad.data == slot.data) {
    dest = TensorView{};  // in place in the bucket: nothing to copy back
  }
  absl::MutexLock lock(&st.mu);
  if (!device.ok() && st.device_error.ok()) st.device_error = device;
  st.recorded[index] = st.device_bucket(b) && device.ok();
  st.dest[index] = dest;
  --st.missing[b];
  st.LaunchReady(/*from_mark=*/true);
  return absl::OkStatus();
}

void GradientBucketer::State::ClaimUnused(BucketStepStats& stats) {
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    if (claimed[i]) continue;
    // Never marked: its slot is zeroed and its bucket launched anyway, so that the peers'
    // allreduce of this bucket completes and the error exchange can tell them.
    if (options.unused == UnusedPolicy::kError) RecordError(kNeverReady, i);
    ++stats.unused_tensors;
    TensorView slot = Slot(i);
    if (slot.data != nullptr && slot.device.is_cuda()) {
      // On the bucket's own stream, ahead of its allreduce.
      if (absl::Status z = scratch->Zero(slot.data, slot.bytes(), scratch->stream());
          !z.ok() && device_error.ok()) {
        device_error = z;
      }
    } else if (slot.data != nullptr) {
      std::memset(slot.data, 0, slot.bytes());
    }
    claimed[i] = 1;
    dest[i] = TensorView{};
    if (slot.data == nullptr) {
      // A CUDA tensor has no slot: a zeroed device buffer stands in for it (its result is
      // dropped). Without a CUDA runtime there is nothing to reduce: the peers' op for this
      // bucket fails on its timeout, and this rank reports the error at once.
      const GradientSpec& spec = specs[i];
      absl::StatusOr<TensorView> zeros =
          scratch != nullptr
              ? scratch->Zeros(i, TensorView{nullptr, spec.count, spec.dtype, spec.device})
              : absl::StatusOr<TensorView>(absl::UnavailableError("no CUDA runtime"));
      if (zeros.ok()) {
        dest[i] = *zeros;
      } else {
        RecordError(kNeverReady, i);
      }
    }
    --missing[bucket_of[i]];
  }
}

bool GradientBucketer::State::AwaitMixedBucket(int b, absl::Status* status) {
  // Each bucket's collectives are bounded by their own timeouts; this bound only guards
  // against a bucketer thread that never gets to run.
  const absl::Duration bound = 4 * op_timeout + absl::Seconds(30);
  struct Arg {
    State* state;
    int bucket;
  } arg{this, b};
  absl::MutexLock lock(&mu);
  const bool finished = mu.AwaitWithTimeout(
      absl::Condition(
          +[](Arg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->state->done[a->bucket] != 0; },
          &arg),
      bound);
  if (!finished) {
    broken = absl::DeadlineExceededError(absl::StrCat(
        "gradient bucketer: bucket ", b, " did not finish within ", absl::FormatDuration(bound)));
    *status = broken;
    return false;
  }
  *status = done_status[b];
  return true;
}

absl::Status GradientBucketer::State::ExchangeErrors(BucketStepStats& stats,
                                                     std::vector<int64_t>& errors) {
  // Every rank issues the exchange, failed buckets or not, so that the op sequences stay alike.
  errors.assign(static_cast<size_t>(comm.size()), 0);
  {
    absl::MutexLock lock(&mu);
    errors[comm.rank()] = error;
    stats.cast_overflow = cast_overflow;
    stats.resent = resent;
    ResetStep();
  }
  return host_exchange ? comm.Allreduce(HostView(errors.data(), errors.size()),
                                        {ReduceOp::kMax, options.timeout})
                             .Wait()
                       : scratch->AllreduceMax(errors.data(), errors.size(), options.timeout);
}

absl::Status GradientBucketer::State::ErrorOf(const std::vector<int64_t>& errors) const {
  int erring = 0, first = -1;
  for (int r = 0; r < static_cast<int>(errors.size()); ++r) {
    if (errors[r] == kNoError) continue;
    ++erring;
    if (first < 0) first = r;
  }
  if (first < 0) return absl::OkStatus();
  const int64_t kind = errors[first] >> 32;
  const int64_t index = (errors[first] & 0xffffffff) - 1;
  const std::string name = index >= 0 && index < static_cast<int64_t>(specs.size())
                               ? absl::StrCat(" (", specs[index].name, ")")
                               : "";
  return absl::FailedPreconditionError(absl::StrCat(
      "gradient bucketer: rank ", first, ": tensor ", index, name, " ", ErrorText(kind),
      erring > 1 ? absl::StrCat(" (and errors on ", erring - 1, " other rank(s))") : ""));
}

absl::StatusOr<BucketStepStats> GradientBucketer::Wait() {
  State& st = *state_;
  const absl::Time start = absl::Now();
  BucketStepStats stats;
  std::vector<std::shared_ptr<Work>> works;
  std::vector<TensorView> dest;
  {
    absl::MutexLock lock(&st.mu);
    if (!st.broken.ok()) return st.broken;
    st.ClaimUnused(stats);
    const int before = st.launched_before_wait;
    st.LaunchReady(/*from_mark=*/false);
    if (st.next_launch < bucket_count()) {
      // A MarkReady still copying: the bucket cannot be launched, and the peers wait for it.
      st.broken = absl::FailedPreconditionError(
          "gradient bucketer: Wait() called while a MarkReady of the step was still running");
      return st.broken;
    }
    stats.launched_before_wait = before;
    stats.buckets = st.next_launch;
    works = st.works;
    dest = st.dest;
  }
  absl::Status first_failure;
  const int nb = bucket_count();
  for (int b = 0; b < nb; ++b) {
    absl::Status s;
    if (st.mixed_wire()) {
      if (!st.AwaitMixedBucket(b, &s)) return s;
    } else if (works[b] != nullptr) {
      s = works[b]->Wait();
    }
    if (!s.ok()) {
      if (first_failure.ok()) first_failure = s;
      continue;
    }
    const BucketInfo& info = st.buckets[b];
    stats.bytes += info.bytes;
    if (st.device_bucket(b)) {
      // Work the caller queues on a gradient's stream after Wait() sees the result, as with
      // Work::Wait on a stream-ordered backend.
      absl::Status c = st.CopyBackOnDevice(b, dest);
      if (!c.ok() && first_failure.ok()) first_failure = c;
      continue;
    }
    for (int i : info.tensors) {
      if (dest[i].data != nullptr && st.Slot(i).data != nullptr) {
        std::memcpy(dest[i].data, st.Slot(i).data, dest[i].bytes());
      }
    }
  }
  {
    absl::MutexLock lock(&st.mu);
    if (!st.device_error.ok() && first_failure.ok()) first_failure = st.device_error;
  }
  std::vector<int64_t> errors;
  absl::Status exchanged = st.ExchangeErrors(stats, errors);
  stats.wait_time = absl::Now() - start;
  if (!first_failure.ok()) return first_failure;
  if (!exchanged.ok()) {
    return absl::Status(exchanged.code(), absl::StrCat("gradient bucketer: exchanging errors: ",
                                                       exchanged.message()));
  }
  if (absl::Status e = st.ErrorOf(errors); !e.ok()) return e;
  return stats;
}

}  // namespace adaptcomm

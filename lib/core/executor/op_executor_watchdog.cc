// OpExecutor's watchdog (op_executor.h): bounds the running op, finishes the stream-ordered ops
// the device completed, and beats for the HeartbeatMonitor.
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/log.h"
#include "lib/base/wall_clock.h"
#include "lib/core/executor/op_executor.h"  // IWYU pragma: associated

namespace adaptcomm::internal {
namespace {

// The watchdog proves it is alive to the HeartbeatMonitor (which wants a beat a second) and looks
// at the running op at least this often.
constexpr absl::Duration kHalfBeat = absl::Milliseconds(500);
// How often the watchdog asks the device about the oldest op in flight.
constexpr absl::Duration kDevicePoll = absl::Milliseconds(1);
// ... while ops wait in the queue for it (BacklogLocked): a quarter of the last op's time on the
// device, within these bounds. A slot of the window freed on the device is then refilled within a
// fraction of an op's time, while the op behind it runs; at kDevicePoll the device idled between
// the ops of a full window (stream_order_bench --paced: 0.38 of its time busy at one op per
// 100 us, with coordinated retry on and a window of 2).
constexpr absl::Duration kBacklogPollMin = absl::Microseconds(10);
// How many of the oldest ops in flight the watchdog asks the device about per release of mu_.
constexpr size_t kPollBatch = 256;

}  // namespace

bool OpExecutor::WatchdogWakesLocked() const {
  // The watchdog wakes within half a beat of when it last looked (WatchdogLoop), and an op that
  // started since then with a timeout of at least that cannot be due earlier: most ops skip the
  // sum of times (out-of-line in absl) that every op's issue used to compute here.
  const WorkImpl* running = RunningLocked();
  const bool earlier_bound =
      running != watchdog_watched_ && running != nullptr && running->desc().timeout < kHalfBeat &&
      running_since_ + running->desc().timeout + options_.watchdog_grace < watchdog_next_;
  return earlier_bound || in_flight_.empty() != watchdog_idle_ ||
         BacklogLocked() != watchdog_backlog_ ||
         (stopping_ && queue_.empty() && !busy_ && !running_ && in_flight_.empty());
}

void OpExecutor::Beat() {
  if (heartbeat_) heartbeat_();
}

namespace {

// How many of `oldest` (the oldest ops in flight, oldest first) the device has finished; sets
// *failure when it reports one failed (the count then stops at it). Called without mu_.
size_t CountDone(const std::vector<DeviceCompletion*>& oldest, absl::Status* failure) {
  // Ops end in the order they were launched (StreamOrdered), so the done ones are a prefix, found
  // by asking the newest first (all done: one query), then by bisection: a handful of queries
  // where one per op kept the device busy answering the watchdog and, through the CUDA runtime's
  // and NCCL's own locks, held up the trainer's launches (sampled on an H200).
  size_t lo = 0, hi = oldest.size();  // [0, lo) done, [hi, size) not done
  while (lo < hi) {
    const size_t mid = hi == oldest.size() ? hi - 1 : lo + (hi - lo) / 2;
    absl::StatusOr<bool> finished = oldest[mid]->Poll();
    if (!finished.ok()) {
      // A failure names the oldest op that is not done, as it always has: asked in order.
      for (lo = 0; lo < oldest.size(); ++lo) {
        finished = oldest[lo]->Poll();
        if (!finished.ok()) *failure = finished.status();
        if (!finished.ok() || !*finished) break;
      }
      return lo;
    }
    if (*finished) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace

absl::Time OpExecutor::PollInFlightLocked() {
  std::vector<DeviceCompletion*> oldest;
  std::vector<std::shared_ptr<WorkImpl>> asked;  // keep oldest's completions while mu_ is released
  std::vector<std::shared_ptr<WorkImpl>> ended;
  while (!in_flight_.empty() && device_failure_.ok()) {
    absl::Status failure;
    // The device is asked without mu_: a cudaEventQuery takes about a microsecond, and while the
    // watchdog held mu_ through one per op, the trainer's thread, which takes mu_ twice per op it
    // issues, spent most of its time blocked on it (sampled on an H200: 60% of an 11 us op).
    // Ops end in the order they were launched (StreamOrdered): see CountDone.
    oldest.clear();
    asked.clear();
    for (const InFlight& f : in_flight_) {
      if (f.completion == nullptr || oldest.size() == kPollBatch) break;
      oldest.push_back(f.completion);
      asked.push_back(f.work);
    }
    if (oldest.empty()) break;  // a failed launch at the head: device_failure_ is set
    UnlockAndWake();
    const size_t done = CountDone(oldest, &failure);
    mu_.Lock();
    // Meanwhile an abort or a device failure may have taken them: only those still the oldest.
    // Their Works are finished after mu_ is released again, for the same reason.
    const absl::Time now = WallNow();  // head_since_ is an op time
    while (ended.size() < done && !in_flight_.empty() &&
           in_flight_.front().completion == oldest[ended.size()]) {
      ended.push_back(std::move(in_flight_.front().work));
      in_flight_.pop_front();
      last_completed_seq_ = std::max(last_completed_seq_, ended.back()->last_seq());
      last_head_time_ = now - head_since_;
      head_since_ = now;
    }
    const size_t retired = ended.size();
    if (retired > 0) {
      ending_ = retired;
      UnlockAndWake();
      // Completed in order by this thread alone (a device op is finished elsewhere only once it
      // has left in_flight_ through an abort or a device failure, which these left first).
      // ended[i] is oldest[i]'s op; a sampled one's device time is read here, off mu_ (a few
      // event queries, never a wait; kept alive by `asked`).
      for (size_t i = 0; i < ended.size(); ++i) {
        End(*ended[i], absl::OkStatus(), now, oldest[i]->DeviceTime());
      }
      ended.clear();
      mu_.Lock();
      ending_ = 0;
    }
    if (retired < done || done == oldest.size()) continue;  // changed meanwhile, or ask again
    if (in_flight_.empty() || in_flight_.front().completion != oldest[done]) continue;
    const OpDesc& desc = in_flight_.front().work->desc();
    // The oldest op's timeout runs from when the device could start it (the ones before it done).
    const absl::Time deadline = head_since_ + desc.timeout;
    if (failure.ok() && absl::Now() >= deadline) {
      failure = absl::DeadlineExceededError(
          absl::StrCat(OpKindName(desc.kind), " #", desc.seq, " on rank ", backend().rank(),
                       " did not complete on the device within its timeout of ",
                       absl::FormatDuration(desc.timeout), " (watchdog); aborting the ",
                       backend().name(), " backend"));
    }
    if (failure.ok()) {
      const absl::Duration period =
          BacklogLocked() ? std::clamp(last_head_time_ / 4, kBacklogPollMin, kDevicePoll)
                          : kDevicePoll;
      return std::min(absl::Now() + period, deadline);
    }
    ADAPTCOMM_LOG(kError, failure.message());
    device_failure_ = failure;
    UnlockAndWake();
    backend().Abort(failure);  // ends the ops queued behind it too
    mu_.Lock();
  }
  return absl::InfiniteFuture();
}

void OpExecutor::WatchdogLoop() {
  ExecutorLock lock(this);
  std::shared_ptr<WorkImpl> watched;  // the running op, as last seen
  absl::Time abort_sent = absl::InfiniteFuture();
  absl::Time last_beat = absl::Now();
  while (true) {
    if (stopping_ && queue_.empty() && !busy_ && !running_ && in_flight_.empty()) return;
    if (absl::Now() - last_beat >= kHalfBeat) {
      Beat();
      last_beat = absl::Now();
    }
    absl::Time next = last_beat + kHalfBeat;
    if (!in_flight_.empty()) next = std::min(next, PollInFlightLocked());
    if (RunningLocked() != watched.get()) {
      watched = running_ ? executing_ : nullptr;
      abort_sent = absl::InfiniteFuture();
    }
    if (watched != nullptr) {
      const OpDesc& desc = watched->desc();
      const absl::Time deadline = running_since_ + desc.timeout + options_.watchdog_grace;
      const absl::Time now = absl::Now();
      if (abort_sent == absl::InfiniteFuture() && now >= deadline) {
        absl::Status timeout = absl::DeadlineExceededError(
            absl::StrCat(OpKindName(desc.kind), " #", desc.seq, " on rank ", backend().rank(),
                         " exceeded its timeout of ", absl::FormatDuration(desc.timeout),
                         " (watchdog); aborting the ", backend().name(), " backend"));
        ADAPTCOMM_LOG(kError, timeout.message());
        abort_sent = now;
        UnlockAndWake();
        backend().Abort(timeout);
        mu_.Lock();
        continue;
      }
      if (abort_sent != absl::InfiniteFuture() && now >= abort_sent + options_.abort_bound) {
        // The backend ignored the abort: release every waiter anyway so the process can exit.
        absl::Status hung = absl::DeadlineExceededError(
            absl::StrCat(OpKindName(desc.kind), " #", desc.seq, " on rank ", backend().rank(),
                         " exceeded its timeout of ", absl::FormatDuration(desc.timeout),
                         "; the backend did not return within the abort bound of ",
                         absl::FormatDuration(options_.abort_bound)));
        ADAPTCOMM_LOG(kError, hung.message());
        watched->Finish(hung);
        aborted_ = hung;
        for (auto& queued : queue_) queued->Finish(hung);
        queue_.clear();
        for (InFlight& f : in_flight_) f.work->Finish(hung);
        if (break_hook_) {
          UnlockAndWake();
          break_hook_(hung);
          mu_.Lock();
        }
        return;  // the worker is stuck inside the backend; Shutdown() will not wait for it
      }
      next = std::min(next, abort_sent != absl::InfiniteFuture() ? abort_sent + options_.abort_bound
                                                                 : deadline);
    }
    // An op that starts (or ends) only matters before `next` if its own bound falls earlier: most
    // ops' bounds are minutes away, and waking for each one would cost every op a context switch
    // (a wake-up and a sleep of this thread) for nothing; a later wake-up sees the op anyway.
    watchdog_watched_ = watched.get();
    watchdog_idle_ = in_flight_.empty();
    watchdog_backlog_ = BacklogLocked();
    watchdog_next_ = next;
    SleepLocked(watchdog_cv_, &watchdog_sleeping_, &OpExecutor::WatchdogWakesLocked, next);
  }
}

}  // namespace adaptcomm::internal

// TSan builds only (see cmake/AdaptcommSanitizers.cmake): Debian's libabsl is not built with
// -fsanitize=thread, so TSan cannot see the happens-before edges that absl::Mutex, CondVar,
// Notification, BlockingCounter and Barrier create, and reports every ABSL_GUARDED_BY field as a
// race. We cannot rebuild abseil, so the link wraps absl's out-of-line synchronization entry points
// (-Wl,--wrap=<symbol>: our objects' calls go to __wrap_<symbol>, which calls __real_<symbol>) and
// tells TSan what the real call did, with the annotations that a TSan-built abseil would issue
// itself. The mutex annotations (not plain acquire/release) keep TSan's lock-order (deadlock)
// detector and the "mutex held" lines of its reports.
//
// Every annotation is issued while the real mutex is held (after a real lock returns, before a real
// unlock runs), outside of absl's own code: absl may evaluate a waiter's Condition inside
// Lock/Unlock of another thread, and TSan's pre_lock..post_lock window would hide those reads.
// Conditions are wrapped so that their evaluation, wherever absl runs it, first acquires the mutex.
//
// The symbol list must match ADAPTCOMM_TSAN_ABSL_WRAPPED in cmake/AdaptcommSanitizers.cmake.
// The mangled names carry Debian's inline namespace (absl::debian3); the static_assert below
// catches another abseil build.

#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstddef>
#include <cstring>

#include "absl/base/options.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define ADAPTCOMM_STR2(x) #x
#define ADAPTCOMM_STR(x) ADAPTCOMM_STR2(x)
constexpr bool InlineNamespaceIs(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}
static_assert(InlineNamespaceIs(ADAPTCOMM_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME), "debian3"),
              "tsan_absl_wrap.cc hard-codes abseil's inline namespace 'debian3' in mangled names");

// HasBeenNotified() is inline: it is an (instrumented) acquire load of Notification's private
// flag, so Notify() must also release on the flag's address. The layout mirror finds it.
struct NotificationLayout {
  absl::Mutex mutex;
  std::atomic<bool> notified_yet;
};
static_assert(sizeof(NotificationLayout) == sizeof(absl::Notification));
// ReleasableMutexLock's only member is the Mutex* it releases.
static_assert(sizeof(absl::ReleasableMutexLock) == sizeof(absl::Mutex*));

void* NotifiedFlag(const absl::Notification* n) {
  return const_cast<char*>(reinterpret_cast<const char*>(n)) +
         offsetof(NotificationLayout, notified_yet);
}

void AnnotateLock(absl::Mutex* mu, unsigned flags) {
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
}

void AnnotateUnlock(absl::Mutex* mu, unsigned flags) {
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
}

// A Condition that acquires `mu` before evaluating the caller's condition and releases it after:
// absl evaluates it with the real mutex held, in the waiter or in whichever thread is unlocking,
// at a point where TSan has been told that this thread does not hold the mutex.
struct WrappedCondition {
  WrappedCondition(absl::Mutex* mu, const absl::Condition& cond)
      : mu(mu), inner(&cond), outer(&WrappedCondition::Eval, this) {}
  static bool Eval(WrappedCondition* self) {
    __tsan_acquire(self->mu);
    const bool result = self->inner->Eval();
    // The condition's reads must also happen before the next holder's writes.
    __tsan_release(self->mu);
    return result;
  }
  absl::Mutex* mu;
  const absl::Condition* inner;
  absl::Condition outer;
};

}  // namespace

// Mangled names. `this` is the first argument of a member function in the Itanium ABI; absl::Time
// and absl::Duration are passed as in the original signatures, so the types are kept.
#define ABSL_SYM(name) _ZN4absl7debian3##name
#define ABSL_KSYM(name) _ZNK4absl7debian3##name

// clang-format off
#define MUTEX_LOCK           ABSL_SYM(5Mutex4LockEv)
#define MUTEX_UNLOCK         ABSL_SYM(5Mutex6UnlockEv)
#define MUTEX_TRYLOCK        ABSL_SYM(5Mutex7TryLockEv)
#define MUTEX_RLOCK          ABSL_SYM(5Mutex10ReaderLockEv)
#define MUTEX_RUNLOCK        ABSL_SYM(5Mutex12ReaderUnlockEv)
#define MUTEX_RTRYLOCK       ABSL_SYM(5Mutex13ReaderTryLockEv)
#define MUTEX_LOCKWHEN       ABSL_SYM(5Mutex8LockWhenERKNS0_9ConditionE)
#define MUTEX_LOCKWHEN_TO    ABSL_SYM(5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)
#define MUTEX_LOCKWHEN_DL    ABSL_SYM(5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)
#define MUTEX_RLOCKWHEN      ABSL_SYM(5Mutex14ReaderLockWhenERKNS0_9ConditionE)
#define MUTEX_RLOCKWHEN_TO   ABSL_SYM(5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)
#define MUTEX_RLOCKWHEN_DL   ABSL_SYM(5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)
#define MUTEX_AWAIT          ABSL_SYM(5Mutex5AwaitERKNS0_9ConditionE)
#define MUTEX_AWAIT_TO       ABSL_SYM(5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE)
#define MUTEX_AWAIT_DL       ABSL_SYM(5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE)
#define MUTEX_DTOR1          ABSL_SYM(5MutexD1Ev)
#define MUTEX_DTOR2          ABSL_SYM(5MutexD2Ev)
#define RML_RELEASE          ABSL_SYM(19ReleasableMutexLock7ReleaseEv)
#define CV_WAIT              ABSL_SYM(7CondVar4WaitEPNS0_5MutexE)
#define CV_WAIT_TO           ABSL_SYM(7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE)
#define CV_WAIT_DL           ABSL_SYM(7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE)
#define NOTE_NOTIFY          ABSL_SYM(12Notification6NotifyEv)
#define NOTE_WAIT            ABSL_KSYM(12Notification19WaitForNotificationEv)
#define NOTE_WAIT_TO         ABSL_KSYM(12Notification30WaitForNotificationWithTimeoutENS0_8DurationE)
#define NOTE_WAIT_DL         ABSL_KSYM(12Notification31WaitForNotificationWithDeadlineENS0_4TimeE)
#define BC_DECREMENT         ABSL_SYM(15BlockingCounter14DecrementCountEv)
#define BC_WAIT              ABSL_SYM(15BlockingCounter4WaitEv)
#define BARRIER_BLOCK        ABSL_SYM(7Barrier5BlockEv)
// clang-format on

// Token pasting through one more macro level so that the symbol macros expand first.
#define DECL2(ret, wrap, real, ...) \
  ret wrap(__VA_ARGS__);            \
  ret real(__VA_ARGS__)
#define DECL(ret, sym, ...) DECL2(ret, WRAP_X(sym), REAL_X(sym), __VA_ARGS__)
#define WRAP_X(sym) WRAP_Y(sym)
#define WRAP_Y(sym) __wrap_##sym
#define REAL_X(sym) REAL_Y(sym)
#define REAL_Y(sym) __real_##sym

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

extern "C" {
// The wrappers are exported from libadaptcomm.so: the tests, tools and benchmarks are linked with
// the same --wrap flags and resolve __wrap_* here.
#define EXPORT __attribute__((visibility("default")))

EXPORT DECL(void, MUTEX_LOCK, Mutex* mu);
EXPORT DECL(void, MUTEX_UNLOCK, Mutex* mu);
EXPORT DECL(bool, MUTEX_TRYLOCK, Mutex* mu);
EXPORT DECL(void, MUTEX_RLOCK, Mutex* mu);
EXPORT DECL(void, MUTEX_RUNLOCK, Mutex* mu);
EXPORT DECL(bool, MUTEX_RTRYLOCK, Mutex* mu);
EXPORT DECL(void, MUTEX_LOCKWHEN, Mutex* mu, const Condition& cond);
EXPORT DECL(bool, MUTEX_LOCKWHEN_TO, Mutex* mu, const Condition& cond, Duration timeout);
EXPORT DECL(bool, MUTEX_LOCKWHEN_DL, Mutex* mu, const Condition& cond, Time deadline);
EXPORT DECL(void, MUTEX_RLOCKWHEN, Mutex* mu, const Condition& cond);
EXPORT DECL(bool, MUTEX_RLOCKWHEN_TO, Mutex* mu, const Condition& cond, Duration timeout);
EXPORT DECL(bool, MUTEX_RLOCKWHEN_DL, Mutex* mu, const Condition& cond, Time deadline);
EXPORT DECL(void, MUTEX_AWAIT, Mutex* mu, const Condition& cond);
EXPORT DECL(bool, MUTEX_AWAIT_TO, Mutex* mu, const Condition& cond, Duration timeout);
EXPORT DECL(bool, MUTEX_AWAIT_DL, Mutex* mu, const Condition& cond, Time deadline);
EXPORT DECL(void, MUTEX_DTOR1, Mutex* mu);
EXPORT DECL(void, MUTEX_DTOR2, Mutex* mu);
EXPORT DECL(void, RML_RELEASE, absl::ReleasableMutexLock* lock);
EXPORT DECL(void, CV_WAIT, CondVar* cv, Mutex* mu);
EXPORT DECL(bool, CV_WAIT_TO, CondVar* cv, Mutex* mu, Duration timeout);
EXPORT DECL(bool, CV_WAIT_DL, CondVar* cv, Mutex* mu, Time deadline);
EXPORT DECL(void, NOTE_NOTIFY, Notification* n);
EXPORT DECL(void, NOTE_WAIT, const Notification* n);
EXPORT DECL(bool, NOTE_WAIT_TO, const Notification* n, Duration timeout);
EXPORT DECL(bool, NOTE_WAIT_DL, const Notification* n, Time deadline);
EXPORT DECL(bool, BC_DECREMENT, absl::BlockingCounter* bc);
EXPORT DECL(void, BC_WAIT, absl::BlockingCounter* bc);
EXPORT DECL(bool, BARRIER_BLOCK, absl::Barrier* b);

// --- Mutex: lock and unlock ---

void WRAP_X(MUTEX_LOCK)(Mutex* mu) {
  REAL_X(MUTEX_LOCK)(mu);
  AnnotateLock(mu, 0);
}

void WRAP_X(MUTEX_UNLOCK)(Mutex* mu) {
  AnnotateUnlock(mu, 0);
  REAL_X(MUTEX_UNLOCK)(mu);
}

bool WRAP_X(MUTEX_TRYLOCK)(Mutex* mu) {
  const bool locked = REAL_X(MUTEX_TRYLOCK)(mu);
  if (locked) AnnotateLock(mu, __tsan_mutex_try_lock);
  return locked;
}

void WRAP_X(MUTEX_RLOCK)(Mutex* mu) {
  REAL_X(MUTEX_RLOCK)(mu);
  AnnotateLock(mu, __tsan_mutex_read_lock);
}

void WRAP_X(MUTEX_RUNLOCK)(Mutex* mu) {
  AnnotateUnlock(mu, __tsan_mutex_read_lock);
  REAL_X(MUTEX_RUNLOCK)(mu);
}

bool WRAP_X(MUTEX_RTRYLOCK)(Mutex* mu) {
  const bool locked = REAL_X(MUTEX_RTRYLOCK)(mu);
  if (locked) AnnotateLock(mu, __tsan_mutex_read_lock | __tsan_mutex_try_lock);
  return locked;
}

// ~Mutex() is out of line; the inline constructor already told TSan about the mutex.
void WRAP_X(MUTEX_DTOR1)(Mutex* mu) {
  __tsan_mutex_destroy(mu, __tsan_mutex_not_static);
  REAL_X(MUTEX_DTOR1)(mu);
}

void WRAP_X(MUTEX_DTOR2)(Mutex* mu) {
  __tsan_mutex_destroy(mu, __tsan_mutex_not_static);
  REAL_X(MUTEX_DTOR2)(mu);
}

void WRAP_X(RML_RELEASE)(absl::ReleasableMutexLock* lock) {
  Mutex* mu = nullptr;
  std::memcpy(&mu, static_cast<const void*>(lock), sizeof(mu));
  if (mu != nullptr) AnnotateUnlock(mu, 0);
  REAL_X(RML_RELEASE)(lock);
}

// --- Mutex: conditional locking. LockWhen*WithTimeout/Deadline return with the lock held either
// way; only the return value says whether the condition held. ---

void WRAP_X(MUTEX_LOCKWHEN)(Mutex* mu, const Condition& cond) {
  WrappedCondition wrapped(mu, cond);
  REAL_X(MUTEX_LOCKWHEN)(mu, wrapped.outer);
  AnnotateLock(mu, 0);
}

bool WRAP_X(MUTEX_LOCKWHEN_TO)(Mutex* mu, const Condition& cond, Duration timeout) {
  WrappedCondition wrapped(mu, cond);
  const bool ok = REAL_X(MUTEX_LOCKWHEN_TO)(mu, wrapped.outer, timeout);
  AnnotateLock(mu, 0);
  return ok;
}

bool WRAP_X(MUTEX_LOCKWHEN_DL)(Mutex* mu, const Condition& cond, Time deadline) {
  WrappedCondition wrapped(mu, cond);
  const bool ok = REAL_X(MUTEX_LOCKWHEN_DL)(mu, wrapped.outer, deadline);
  AnnotateLock(mu, 0);
  return ok;
}

void WRAP_X(MUTEX_RLOCKWHEN)(Mutex* mu, const Condition& cond) {
  WrappedCondition wrapped(mu, cond);
  REAL_X(MUTEX_RLOCKWHEN)(mu, wrapped.outer);
  AnnotateLock(mu, __tsan_mutex_read_lock);
}

bool WRAP_X(MUTEX_RLOCKWHEN_TO)(Mutex* mu, const Condition& cond, Duration timeout) {
  WrappedCondition wrapped(mu, cond);
  const bool ok = REAL_X(MUTEX_RLOCKWHEN_TO)(mu, wrapped.outer, timeout);
  AnnotateLock(mu, __tsan_mutex_read_lock);
  return ok;
}

bool WRAP_X(MUTEX_RLOCKWHEN_DL)(Mutex* mu, const Condition& cond, Time deadline) {
  WrappedCondition wrapped(mu, cond);
  const bool ok = REAL_X(MUTEX_RLOCKWHEN_DL)(mu, wrapped.outer, deadline);
  AnnotateLock(mu, __tsan_mutex_read_lock);
  return ok;
}

// --- Await and CondVar: called with the lock held, they release and re-acquire it. Writer locks
// only (absl allows a reader-held Await, which adaptcomm does not use). ---

void WRAP_X(MUTEX_AWAIT)(Mutex* mu, const Condition& cond) {
  WrappedCondition wrapped(mu, cond);
  AnnotateUnlock(mu, 0);
  REAL_X(MUTEX_AWAIT)(mu, wrapped.outer);
  AnnotateLock(mu, 0);
}

bool WRAP_X(MUTEX_AWAIT_TO)(Mutex* mu, const Condition& cond, Duration timeout) {
  WrappedCondition wrapped(mu, cond);
  AnnotateUnlock(mu, 0);
  const bool ok = REAL_X(MUTEX_AWAIT_TO)(mu, wrapped.outer, timeout);
  AnnotateLock(mu, 0);
  return ok;
}

bool WRAP_X(MUTEX_AWAIT_DL)(Mutex* mu, const Condition& cond, Time deadline) {
  WrappedCondition wrapped(mu, cond);
  AnnotateUnlock(mu, 0);
  const bool ok = REAL_X(MUTEX_AWAIT_DL)(mu, wrapped.outer, deadline);
  AnnotateLock(mu, 0);
  return ok;
}

void WRAP_X(CV_WAIT)(CondVar* cv, Mutex* mu) {
  AnnotateUnlock(mu, 0);
  REAL_X(CV_WAIT)(cv, mu);
  AnnotateLock(mu, 0);
}

bool WRAP_X(CV_WAIT_TO)(CondVar* cv, Mutex* mu, Duration timeout) {
  AnnotateUnlock(mu, 0);
  const bool timed_out = REAL_X(CV_WAIT_TO)(cv, mu, timeout);
  AnnotateLock(mu, 0);
  return timed_out;
}

bool WRAP_X(CV_WAIT_DL)(CondVar* cv, Mutex* mu, Time deadline) {
  AnnotateUnlock(mu, 0);
  const bool timed_out = REAL_X(CV_WAIT_DL)(cv, mu, deadline);
  AnnotateLock(mu, 0);
  return timed_out;
}

// --- One-shot and counting primitives: release before signalling, acquire after a wait that saw
// the signal. ---

void WRAP_X(NOTE_NOTIFY)(Notification* n) {
  __tsan_release(n);
  __tsan_release(NotifiedFlag(n));
  REAL_X(NOTE_NOTIFY)(n);
}

void WRAP_X(NOTE_WAIT)(const Notification* n) {
  REAL_X(NOTE_WAIT)(n);
  __tsan_acquire(const_cast<Notification*>(n));
}

bool WRAP_X(NOTE_WAIT_TO)(const Notification* n, Duration timeout) {
  const bool notified = REAL_X(NOTE_WAIT_TO)(n, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(n));
  return notified;
}

bool WRAP_X(NOTE_WAIT_DL)(const Notification* n, Time deadline) {
  const bool notified = REAL_X(NOTE_WAIT_DL)(n, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(n));
  return notified;
}

bool WRAP_X(BC_DECREMENT)(absl::BlockingCounter* bc) {
  __tsan_release(bc);
  const bool zero = REAL_X(BC_DECREMENT)(bc);
  if (zero) __tsan_acquire(bc);
  return zero;
}

void WRAP_X(BC_WAIT)(absl::BlockingCounter* bc) {
  REAL_X(BC_WAIT)(bc);
  __tsan_acquire(bc);
}

bool WRAP_X(BARRIER_BLOCK)(absl::Barrier* b) {
  __tsan_release(b);
  const bool last = REAL_X(BARRIER_BLOCK)(b);
  __tsan_acquire(b);
  return last;
}

}  // extern "C"

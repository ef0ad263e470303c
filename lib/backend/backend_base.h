// BackendBase: what every Backend of this library inherits instead of writing it again. A backend
// derives from it, passes its identity and capabilities once, and writes only what is its own:
//   Supports(op)      refuse what it cannot run (InvalidArgument, with a reason)
//   Run(op)           RunFramed(op, body): body runs the op (OpDispatch for the kind's member)
//   RunGroup(ops)     RunGroupFramed(ops, body), where the backend runs groups
//   Interrupt(why)    make an op in flight return promptly (Abort() calls it once)
//   OnBroken(status)  optional: tell peers or inner backends that a failure broke this one
// and inherits name(), rank(), size(), capabilities(), health(), an idempotent Abort(), the
// refusal of every op once broken (BrokenBackendRefusal) and the rule that a failure other than
// InvalidArgument breaks the backend, with what the op reports after an Abort().
// Thread safety: as Backend's. The frames run on the Run() thread; Abort(), health() and the
// identity from any thread.
#ifndef ADAPTCOMM_LIB_BACKEND_BACKEND_BASE_H_
#define ADAPTCOMM_LIB_BACKEND_BACKEND_BASE_H_

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/ext/backend.h"

namespace adaptcomm {

// Who a backend is, fixed at construction.
struct BackendIdentity {
  std::string name{};  // Backend::name(): "gloo", "shm", "gloo+staged"
  int rank = 0;
  int size = 1;
  Capabilities capabilities{};
  // How messages name it: "<label> backend is broken; ...", "<label> backend aborted: ..." (the
  // name when empty).
  std::string label{};
};

class BackendBase : public Backend {
 public:
  const char* name() const final { return id_.name.c_str(); }
  int rank() const final { return id_.rank; }
  int size() const final { return id_.size; }
  Capabilities capabilities() const final { return id_.capabilities; }
  // OK, or the failure that broke the backend (the first; an Abort()'s when it came first).
  // Backends built on inner backends add theirs.
  absl::Status health() const override;
  // Marks the backend broken (it keeps an earlier failure: health() still says what happened
  // first, e.g. the timeout the communicator aborted after) and, the first time, Interrupt()s it.
  void Abort(const absl::Status& reason) final;

 protected:
  explicit BackendBase(BackendIdentity id);

  // Makes a Run() or RunGroup() in flight return promptly, called once by the first Abort()
  // (`reason` as given; health() is already the abort's status).
  virtual void Interrupt(const absl::Status& reason) = 0;
  // Called once, on the failing thread, when `failure` broke the backend (not after an Abort()).
  virtual void OnBroken(const absl::Status& /*failure*/) {}

  // Run()'s frame: refuses `op` once broken, checks Supports(op), runs body() (an absl::Status)
  // and breaks the backend when it fails with anything but InvalidArgument (bad input, refused
  // before any traffic, leaves it usable). Returns what the caller sees (Fail()).
  template <typename Body>
  absl::Status RunFramed(const OpDesc& op, Body&& body) {
    if (absl::Status s = Refused(op); !s.ok()) return s;
    if (absl::Status s = Supports(op); !s.ok()) return s;
    absl::Status s = body();
    return s.ok() ? s : Fail(std::move(s));
  }

  // RunGroup()'s frame: as Run's, for a whole group, which is refused as its first op; every op
  // is checked by Supports(). body(bound) gets the first op with the largest timeout of the group
  // (the group's bound, and its name in messages).
  template <typename Body>
  absl::Status RunGroupFramed(const std::vector<OpDesc>& ops, Body&& body) {
    if (ops.empty()) return absl::OkStatus();
    if (absl::Status s = Refused(ops.front()); !s.ok()) return s;
    OpDesc bound = ops.front();
    for (const OpDesc& op : ops) {
      if (absl::Status s = Supports(op); !s.ok()) return s;
      bound.timeout = std::max(bound.timeout, op.timeout);
    }
    absl::Status s = body(static_cast<const OpDesc&>(bound));
    return s.ok() ? s : Fail(std::move(s));
  }

  // OK while healthy, else the FailedPrecondition that refuses `op` (BrokenBackendRefusal).
  absl::Status Refused(const OpDesc& op) const;
  // What an op that failed with `failure` returns: after an Abort(), the abort's status naming
  // where it interrupted the op; InvalidArgument as it is; anything else breaks the backend
  // (the first failure stays its health; OnBroken() runs once) and is returned.
  absl::Status Fail(absl::Status failure);
  // Fail() for a failure that breaks the backend whatever its code: a transport whose call may
  // already have reached the peers (NCCL's invalid usage at a launch) cannot be used again.
  absl::Status Break(absl::Status failure);
  // True once Abort() was called. Sequentially consistent, with the store in Abort(): a backend
  // may pair it with a flag of its own (set "an op is running", then read aborted(); Abort() sets
  // this, then Interrupt() reads that flag) so that at least one of the two sees the other.
  bool aborted() const { return aborted_flag_.load(); }

  const BackendIdentity& identity() const { return id_; }

 private:
  const BackendIdentity id_;
  std::atomic<bool> broken_flag_{false};  // set with broken_: Refused() without the lock
  std::atomic<bool> aborted_flag_{false};
  mutable absl::Mutex mu_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BACKEND_BACKEND_BASE_H_

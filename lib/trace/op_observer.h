// OpObserver: what the executor tells about each operation's life (queued, started, ended), so
// that recorders (flight recorder, timeline trace) stay out of the executor's code.
// Thread safety: callbacks come from the executor's threads (worker, helping caller, watchdog);
// implementations synchronize themselves and must not block for long.
#ifndef ADAPTCOMM_LIB_TRACE_OP_OBSERVER_H_
#define ADAPTCOMM_LIB_TRACE_OP_OBSERVER_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "adaptcomm/ext/backend.h"

namespace adaptcomm::trace {

class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void OnEnqueue(const OpDesc& op, absl::Time when) = 0;
  virtual void OnStart(const OpDesc& op, absl::Time when) = 0;
  // Queued and started at once (an op the issuing thread launches itself): one call, so that a
  // recorder may take its lock once.
  virtual void OnEnqueueAndStart(const OpDesc& op, absl::Time when) {
    OnEnqueue(op, when);
    OnStart(op, when);
  }
  virtual void OnEnd(const OpDesc& op, const absl::Status& status, absl::Time when) = 0;
  // Right before OnEnd of a device op that completed and that its backend timed on the device
  // (DeviceCompletion::DeviceTime): how long the device executed it. The host times above say when
  // the op was launched and when the watchdog found it done, which includes the time it waited on
  // its stream behind earlier work.
  virtual void OnDeviceTime(const OpDesc& op, absl::Duration executed) {
    (void)op;
    (void)executed;
  }
};

}  // namespace adaptcomm::trace

#endif  // ADAPTCOMM_LIB_TRACE_OP_OBSERVER_H_

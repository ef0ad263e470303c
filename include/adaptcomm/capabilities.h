// Capabilities: what the backend under a communicator can do (Communicator::capabilities()), e.g.
// whether it takes CUDA buffers without staging. A backend reports them (adaptcomm/ext/backend.h).
//
// Compiles as C++17: trainers include it.
#ifndef ADAPTCOMM_CAPABILITIES_H_
#define ADAPTCOMM_CAPABILITIES_H_

namespace adaptcomm {

struct Capabilities {
  bool host_memory = true;     // accepts CPU buffers
  bool device_memory = false;  // accepts CUDA buffers without staging
  bool native_bf16 = false;    // bf16 reduced by the transport itself (else emulated)
  bool native_avg = false;     // avg reduced by the transport itself (else sum + scale)
  bool send_recv = true;
  bool abortable = true;  // Abort() interrupts an op in flight
  // Device ops are queued on the device in issue order and complete later (stream_ordered()).
  bool stream_ordered = false;
  // Run() on host views may execute on any thread, a trainer's included: it leaves no state on the
  // thread (signal mask, CUDA device, thread-locals) and Abort() from another thread ends it. The
  // executor then lets a caller that waits without a bound run its own op (see Work::Wait()).
  bool runs_on_any_thread = false;
  // Runs OpDesc::wire allreduces (the casts are the transport's copies).
  bool wire_cast = false;
  // The knob space whose OpDesc::knobs Run() applies ("shm", "gloo": the tuned table names
  // them), null when it applies none. Online tuning tries their values on live traffic; a value
  // that may change a float result (another reduction order) is tried only where the profile
  // allows it (tuning.online.allow_reorder).
  const char* per_op_knobs = nullptr;
};

}  // namespace adaptcomm

#endif  // ADAPTCOMM_CAPABILITIES_H_

// Names of the mixed-precision enums, hook handles and the context (adaptcomm/precision.h), and
// the helpers both mixed paths share (mixed_internal.h).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "adaptcomm/precision.h"
#include "lib/precision/mixed_internal.h"

namespace adaptcomm {

// ---- names ----

const char* BarrierLevelName(BarrierLevel level) {
  switch (level) {
    case BarrierLevel::kHost:
      return "host";
    case BarrierLevel::kGlobal:
      return "global";
    case BarrierLevel::kStream:
      return "stream";
  }
  return "unknown-barrier";
}

const char* OverflowPolicyName(OverflowPolicy policy) {
  switch (policy) {
    case OverflowPolicy::kReport:
      return "report";
    case OverflowPolicy::kFail:
      return "fail";
    case OverflowPolicy::kResendBF16:
      return "resend_bf16";
    case OverflowPolicy::kResendF32:
      return "resend_f32";
    case OverflowPolicy::kFromProfile:
      return "from_profile";
  }
  return "unknown-policy";
}

Work IssueWireCollective(Communicator& comm, OpKind kind, const MixedOptions& opts, TensorView in,
                         TensorView out) {
  const ReduceOp wire_op = opts.op == ReduceOp::kAvg ? ReduceOp::kSum : opts.op;
  switch (kind) {
    case OpKind::kAllreduce: {
      AllreduceOptions o;
      o.op = wire_op;
      o.timeout = opts.timeout;
      return comm.Allreduce(in, o);
    }
    case OpKind::kReduceScatter: {
      ReduceScatterOptions o;
      o.op = wire_op;
      o.timeout = opts.timeout;
      return comm.ReduceScatter(in, out, o);
    }
    default: {
      AllgatherOptions o;
      o.timeout = opts.timeout;
      return comm.Allgather(in, out, o);
    }
  }
}

float MixedFactor(OpKind kind, const MixedOptions& opts, int world_size) {
  if (kind == OpKind::kAllgather) return 1.0f;
  return opts.op == ReduceOp::kAvg ? opts.scale / static_cast<float>(world_size) : opts.scale;
}

OverflowPolicy ResolveOverflowPolicy(OverflowPolicy requested, const Communicator& comm) {
  if (requested != OverflowPolicy::kFromProfile) return requested;
  const std::string& name = comm.config().precision.fp16_overflow;
  for (OverflowPolicy p :
       {OverflowPolicy::kFail, OverflowPolicy::kResendBF16, OverflowPolicy::kResendF32}) {
    if (name == OverflowPolicyName(p)) return p;
  }
  return OverflowPolicy::kReport;
}

const char* HookPointName(HookPoint point) {
  switch (point) {
    case HookPoint::kBeforeCast:
      return "before_cast";
    case HookPoint::kAfterCast:
      return "after_cast";
    case HookPoint::kBeforeCollective:
      return "before_collective";
    case HookPoint::kAfterCollective:
      return "after_collective";
  }
  return "unknown-hook-point";
}

// ---- hooks ----

HookHandle::HookHandle(std::weak_ptr<Registry> registry, uint64_t id)
    : registry_(std::move(registry)), id_(id) {}
HookHandle::HookHandle(HookHandle&& other) noexcept
    : registry_(std::move(other.registry_)), id_(other.id_) {
  other.id_ = 0;
}
HookHandle& HookHandle::operator=(HookHandle&& other) noexcept {
  if (this != &other) {
    Remove();
    registry_ = std::move(other.registry_);
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}
HookHandle::~HookHandle() { Remove(); }

void HookHandle::Remove() {
  if (id_ == 0) return;
  if (std::shared_ptr<Registry> reg = registry_.lock()) {
    absl::MutexLock lock(&reg->mu);
    reg->entries.erase(std::remove_if(reg->entries.begin(), reg->entries.end(),
                                      [this](const Registry::Entry& e) { return e.id == id_; }),
                       reg->entries.end());
  }
  id_ = 0;
  registry_.reset();
}

bool HookHandle::active() const { return id_ != 0 && !registry_.expired(); }

// ---- context ----

MixedPrecisionContext::MixedPrecisionContext(Communicator& comm)
    : state_(std::make_unique<State>()) {
  state_->comm = &comm;
}
MixedPrecisionContext::~MixedPrecisionContext() = default;

Communicator& MixedPrecisionContext::communicator() const { return *state_->comm; }

HookHandle MixedPrecisionContext::AddHook(HookPoint point, std::string name, MixedHook hook) {
  HookHandle::Registry& reg = *state_->hooks;
  absl::MutexLock lock(&reg.mu);
  const uint64_t id = reg.next_id++;
  reg.entries.push_back(
      {id, point, std::move(name), std::make_shared<const MixedHook>(std::move(hook))});
  return HookHandle(state_->hooks, id);
}

void MixedPrecisionContext::Reserve(size_t max_count) {
  State& st = *state_;
  absl::MutexLock lock(&st.call_mu);
  // resize() value-initializes: the pages are touched now, not inside the first timed op. Sizes
  // cover the zero padding of the allreduce paths (up to size() - 1 elements).
  const size_t n = static_cast<size_t>(std::max(1, st.comm->size()));
  const size_t padded = max_count + n - 1;
  if (st.wire_in.size() < padded) st.wire_in.resize(padded);
  if (st.wire_out.size() < padded) st.wire_out.resize(padded);
  if (st.wire_block.size() < padded / n) st.wire_block.resize(padded / n);
}

}  // namespace adaptcomm

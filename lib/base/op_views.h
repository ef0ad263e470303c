// Which views of an OpDesc an op reads and writes (adaptcomm/ext/backend.h states the contract):
// every backend validates and moves exactly these.
#ifndef ADAPTCOMM_LIB_BASE_OP_VIEWS_H_
#define ADAPTCOMM_LIB_BASE_OP_VIEWS_H_

#include "adaptcomm/ext/backend.h"

namespace adaptcomm {

// One of the ops of the Backend interface (a cast from a bad integer is not).
inline bool IsKnownOpKind(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce:
    case OpKind::kBroadcast:
    case OpKind::kReduce:
    case OpKind::kAllgather:
    case OpKind::kReduceScatter:
    case OpKind::kAlltoall:
    case OpKind::kBarrier:
    case OpKind::kSend:
    case OpKind::kRecv:
      return true;
  }
  return false;
}
// Reduces with OpDesc::reduce.
inline bool IsReduction(OpKind kind) {
  return kind == OpKind::kAllreduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter;
}
// Reads OpDesc::input as a view of its own (in-place ops read `output`).
inline bool UsesInput(OpKind kind) {
  return kind == OpKind::kAllgather || kind == OpKind::kReduceScatter ||
         kind == OpKind::kAlltoall || kind == OpKind::kSend;
}
// Reads or writes OpDesc::output.
inline bool UsesOutput(OpKind kind) { return kind != OpKind::kBarrier && kind != OpKind::kSend; }
// On `rank`, reads OpDesc::output as its input (the in-place ops; broadcast on its root only).
inline bool ReadsOutputOn(const OpDesc& op, int rank) {
  if (op.kind == OpKind::kBroadcast) return op.root == rank;
  return op.kind == OpKind::kAllreduce || op.kind == OpKind::kReduce;
}
// On `rank`, writes OpDesc::output (reduce on its root only: other ranks' data is unspecified
// afterwards).
inline bool WritesOutputOn(const OpDesc& op, int rank) {
  return UsesOutput(op.kind) && (op.kind != OpKind::kReduce || op.root == rank);
}

// Bus bandwidth over algorithm bandwidth of `kind` on `world_size` ranks (nccl-tests'
// PERFORMANCE.md): 2(n-1)/n for allreduce, (n-1)/n for allgather, reduce_scatter and alltoall, 1
// for the others; 0 for a barrier (it moves no data) and for an empty world.
inline double BusBandwidthFactor(OpKind kind, int world_size) {
  if (world_size < 1 || kind == OpKind::kBarrier) return 0;
  const double n = world_size;
  if (kind == OpKind::kAllreduce) return 2 * (n - 1) / n;
  const bool spread =
      kind == OpKind::kAllgather || kind == OpKind::kReduceScatter || kind == OpKind::kAlltoall;
  return spread ? (n - 1) / n : 1;
}

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_OP_VIEWS_H_

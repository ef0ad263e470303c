// Which views of an OpDesc an op reads and writes (adaptcomm/backend.h states the contract):
// every backend validates and moves exactly these.
#ifndef ADAPTCOMM_LIB_BASE_OP_VIEWS_H_
#define ADAPTCOMM_LIB_BASE_OP_VIEWS_H_

#include "adaptcomm/backend.h"

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

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_OP_VIEWS_H_

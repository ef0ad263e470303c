// Which views of an OpDesc an op reads and writes (adaptcomm/backend.h states the contract):
// every backend validates and moves exactly these.
#ifndef ADAPTCOMM_LIB_BASE_OP_VIEWS_H_
#define ADAPTCOMM_LIB_BASE_OP_VIEWS_H_

#include "adaptcomm/backend.h"

namespace adaptcomm {

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

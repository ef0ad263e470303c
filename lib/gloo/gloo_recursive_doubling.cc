#include "lib/gloo/gloo_recursive_doubling.h"

#include <cstring>

#include "gloo/transport/unbound_buffer.h"
#include "lib/gloo/gloo_peers.h"
#include "lib/gloo/gloo_wait.h"

namespace adaptcomm::gloo_backend {

void RecursiveDoublingAllreduce(::gloo::Context& context, void* data, size_t count, size_t bytes,
                                ReduceFn fn, void* scratch, uint64_t slot_base,
                                std::chrono::steady_clock::time_point deadline) {
  const RecursiveDoublingPlan plan = PlanRecursiveDoubling(context.rank, context.size);
  // Step slots: 0 the fold, 1..k the exchanges, kResult the folded rank's result.
  constexpr uint64_t kResult = 0xff;
  auto mine = context.createUnboundBuffer(data, bytes);
  auto theirs = context.createUnboundBuffer(scratch, bytes);
  auto wait_send = [&] {
    WaitUntil(deadline, [&](std::chrono::milliseconds t) { return mine->waitSend(t); });
  };
  auto wait_recv = [&] {
    WaitUntil(deadline, [&](std::chrono::milliseconds t) { return theirs->waitRecv(t); });
  };
  // Both ranks of an exchange hold both vectors: each forms fn(lower's, higher's), in place in the
  // lower's (the kernels take an output equal to their second operand as leave to swap them).
  auto combine = [&](int peer) {
    if (peer < context.rank) {
      fn(scratch, scratch, data, count);
      std::memcpy(data, scratch, bytes);
    } else {
      fn(data, data, scratch, count);
    }
  };
  if (plan.folds_out) {
    mine->send(plan.fold_peer, slot_base, 0, bytes);
    wait_send();
    mine->recv(plan.fold_peer, slot_base | kResult, 0, bytes);
    WaitUntil(deadline, [&](std::chrono::milliseconds t) { return mine->waitRecv(t); });
    return;
  }
  if (plan.fold_peer >= 0) {
    theirs->recv(plan.fold_peer, slot_base, 0, bytes);
    wait_recv();
    combine(plan.fold_peer);
  }
  uint64_t step = 1;
  for (const int partner : plan.partners) {
    // The receive is posted before the send on both ranks; `data` is rewritten only once the
    // send of it has completed.
    theirs->recv(partner, slot_base | step, 0, bytes);
    mine->send(partner, slot_base | step, 0, bytes);
    wait_recv();
    wait_send();
    combine(partner);
    ++step;
  }
  if (plan.fold_peer >= 0) {
    mine->send(plan.fold_peer, slot_base | kResult, 0, bytes);
    wait_send();
  }
}

}  // namespace adaptcomm::gloo_backend

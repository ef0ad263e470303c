// The Gloo backend's collectives and point-to-point ops (gloo_backend_impl.h): each throws what
// Gloo throws, and GlooBackend::Run() translates at the edge.
#include "lib/gloo/gloo_backend_impl.h"

namespace adaptcomm::gloo_backend {

void GlooBackend::Allreduce(const OpDesc& op) {
  const TensorView& v = op.output;
  if (v.count == 0 || size() == 1) return;  // avg over one rank is the identity
  const uint64_t bytes = v.bytes();
  const Algorithm algorithm = AllreduceAlgorithm(op, bytes);
  if (algorithm == Algorithm::kRecursiveDoubling) {
    gloo_backend::RecursiveDoublingAllreduce(
        *context_, v.data, v.count, bytes, GetReduceFn(v.dtype, op.reduce), Scratch(bytes),
        kRecursiveDoublingSlotBase | ((op.seq & 0xffffffffu) << 8), DeadlineOf(op));
  } else {
    GlooAllreduce(op, v.data, algorithm == Algorithm::kBcube, MaxSegmentFor(op, bytes));
  }
  if (op.reduce == ReduceOp::kAvg) elementwise::DivideInPlace(v.dtype, v.data, v.count, size());
}

void GlooBackend::GlooAllreduce(const OpDesc& op, void* data, bool bcube, uint64_t segment) {
  const TensorView& v = op.output;
  const ReduceFn fn = GetReduceFn(v.dtype, op.reduce);
  WithElementType(v.dtype, [&](auto t) {
    using T = decltype(t);
    ::gloo::AllreduceOptions opts(gloo_context_);
    opts.setOutput(static_cast<T*>(data), v.count);
    opts.setReduceFunction(fn);
    opts.setTag(static_cast<uint32_t>(op.seq));
    opts.setTimeout(ToMs(op.timeout));
    if (bcube) opts.setAlgorithm(::gloo::AllreduceOptions::Algorithm::BCUBE);
    if (segment > 0) opts.setMaxSegmentSize(static_cast<size_t>(segment));
    ::gloo::allreduce(opts);
  });
}

void GlooBackend::Broadcast(const OpDesc& op) {
  const TensorView& v = op.output;
  if (v.count == 0 || size() == 1) return;
  WithElementType(v.dtype, [&](auto t) {
    using T = decltype(t);
    ::gloo::BroadcastOptions opts(gloo_context_);
    opts.setOutput(static_cast<T*>(v.data), v.count);  // in place: no input on any rank
    opts.setRoot(op.root);
    opts.setTag(static_cast<uint32_t>(op.seq));
    opts.setTimeout(ToMs(op.timeout));
    ::gloo::broadcast(opts);
  });
}

void GlooBackend::Reduce(const OpDesc& op) {
  const TensorView& v = op.output;
  if (v.count == 0 || size() == 1) return;
  const ReduceFn fn = GetReduceFn(v.dtype, op.reduce);
  const bool root = rank() == op.root;
  // Gloo's reduce is a ring reduce-scatter that writes partial sums into every rank's output;
  // non-roots get scratch as output so their buffer stays as the caller left it (as with NCCL).
  void* out = root ? v.data : Scratch(v.bytes());
  if (!direct_reduce_) {
    // The same bytes through the root's link as gloo::reduce's gather, over the ring's pairs.
    if (!root) std::memcpy(out, v.data, v.bytes());
    GlooAllreduce(op, out, false, MaxSegmentFor(op, v.bytes()));
  } else {
    WithElementType(v.dtype, [&](auto t) {
      using T = decltype(t);
      ::gloo::ReduceOptions opts(gloo_context_);
      if (!root) opts.setInput(static_cast<T*>(v.data), v.count);
      opts.setOutput(static_cast<T*>(out), v.count);
      opts.setRoot(op.root);
      opts.setReduceFunction(fn);
      opts.setTag(static_cast<uint32_t>(op.seq));
      opts.setTimeout(ToMs(op.timeout));
      ::gloo::reduce(opts);
    });
  }
  if (root && op.reduce == ReduceOp::kAvg) {
    elementwise::DivideInPlace(v.dtype, v.data, v.count, size());
  }
}

void GlooBackend::Allgather(const OpDesc& op) {
  const size_t block = op.input.bytes();
  if (block == 0) return;
  auto* out = static_cast<uint8_t*>(op.output.data);
  const void* in = op.input.data;
  uint8_t* own = out + static_cast<size_t>(rank()) * block;
  if (size() == 1) {
    std::memmove(out, in, block);
    return;
  }
  // In place (input is this rank's block of the output): Gloo allgathers without an input.
  const bool in_place = in == own;
  if (!in_place && Overlaps(in, block, out, op.output.bytes())) {
    uint8_t* staged = Scratch(block);
    std::memcpy(staged, in, block);
    in = staged;
  }
  WithElementType(op.output.dtype, [&](auto t) {
    using T = decltype(t);
    ::gloo::AllgatherOptions opts(gloo_context_);
    if (!in_place) opts.setInput(static_cast<T*>(const_cast<void*>(in)), op.input.count);
    opts.setOutput(reinterpret_cast<T*>(out), op.output.count);
    opts.setTag(static_cast<uint32_t>(op.seq));
    opts.setTimeout(ToMs(op.timeout));
    ::gloo::allgather(opts);
  });
}

void GlooBackend::Alltoall(const OpDesc& op) {
  const size_t bytes = op.input.bytes();
  if (bytes == 0) return;
  const void* in = op.input.data;
  void* out = op.output.data;
  if (size() == 1) {
    std::memmove(out, in, bytes);
    return;
  }
  // Gloo copies this rank's own block locally while other blocks are still being sent from the
  // input: an input overlapping the output is staged first.
  if (Overlaps(in, bytes, out, bytes)) {
    uint8_t* staged = Scratch(bytes);
    std::memcpy(staged, in, bytes);
    in = staged;
  }
  WithElementType(op.output.dtype, [&](auto t) {
    using T = decltype(t);
    ::gloo::AlltoallOptions opts(gloo_context_);
    opts.setInput(static_cast<T*>(const_cast<void*>(in)), op.input.count);
    opts.setOutput(static_cast<T*>(out), op.output.count);
    opts.setTag(static_cast<uint32_t>(op.seq));
    opts.setTimeout(ToMs(op.timeout));
    ::gloo::alltoall(opts);
  });
}

void GlooBackend::Barrier(const OpDesc& op) {
  if (size() == 1) return;
  ::gloo::BarrierOptions opts(gloo_context_);
  opts.setTag(static_cast<uint32_t>(op.seq));
  opts.setTimeout(ToMs(op.timeout));
  ::gloo::barrier(opts);
}

void GlooBackend::Send(const OpDesc& op) {
  const Clock::time_point deadline = DeadlineOf(op);
  auto buf = context_->createUnboundBuffer(op.input.data, op.input.bytes());
  buf->send(op.peer, kSendRecvSlotBase | op.tag, 0, op.input.bytes());
  WaitUntil(deadline, [&](std::chrono::milliseconds t) { return buf->waitSend(t); });
}

void GlooBackend::Recv(const OpDesc& op) {
  const Clock::time_point deadline = DeadlineOf(op);
  auto buf = context_->createUnboundBuffer(op.output.data, op.output.bytes());
  buf->recv(op.peer, kSendRecvSlotBase | op.tag, 0, op.output.bytes());
  WaitUntil(deadline, [&](std::chrono::milliseconds t) { return buf->waitRecv(t); });
}

// Ring reduce-scatter over unbound buffers: n-1 steps, each sending one block to the right
// neighbour and reducing the block received from the left with this rank's input block, so
// every rank moves (n-1)/n of the input. At step s rank r sends the partial sum of block
// (r-1-s) mod n and receives that of block (r-2-s) mod n; the last step yields block r.
void GlooBackend::ReduceScatter(const OpDesc& op) {
  const size_t n = static_cast<size_t>(size());
  const size_t r = static_cast<size_t>(rank());
  const size_t count = op.output.count;
  const size_t block = op.output.bytes();
  if (block == 0) return;
  const Clock::time_point deadline = DeadlineOf(op);
  const auto* in = static_cast<const uint8_t*>(op.input.data);
  auto* out = static_cast<uint8_t*>(op.output.data);
  if (n == 1) {
    std::memmove(out, in, block);
    return;
  }
  // Output written only at the last step, from block r of the input: the output may be exactly
  // that block (in place); any other overlap with the input is staged first.
  const bool stage = out != in + r * block && Overlaps(in, block * n, out, block);
  uint8_t* scratch = Scratch(block * 3 + (stage ? block * n : 0));
  uint8_t* recv_block = scratch;
  uint8_t* acc[2] = {scratch + block, scratch + 2 * block};
  if (stage) {
    std::memcpy(scratch + 3 * block, in, block * n);
    in = scratch + 3 * block;
  }
  const ReduceFn fn = GetReduceFn(op.output.dtype, op.reduce);
  const size_t right = (r + 1) % n;
  const size_t left = (r + n - 1) % n;
  const uint64_t slot_base = kReduceScatterSlotBase | ((op.seq & 0xffffffffu) << 16);

  auto recv_buf = context_->createUnboundBuffer(recv_block, block);
  const uint8_t* send_ptr = in + ((r + n - 1) % n) * block;
  for (size_t s = 0; s + 1 < n; ++s) {
    const uint64_t slot = slot_base | s;
    recv_buf->recv(static_cast<int>(left), slot, 0, block);
    auto send_buf = context_->createUnboundBuffer(const_cast<uint8_t*>(send_ptr), block);
    send_buf->send(static_cast<int>(right), slot, 0, block);
    WaitUntil(deadline, [&](std::chrono::milliseconds t) { return recv_buf->waitRecv(t); });
    const size_t blk = (r + 2 * n - 2 - s) % n;
    uint8_t* dst = s + 2 == n ? out : acc[s & 1];
    fn(dst, recv_block, in + blk * block, count);
    WaitUntil(deadline, [&](std::chrono::milliseconds t) { return send_buf->waitSend(t); });
    send_ptr = dst;
  }
  if (op.reduce == ReduceOp::kAvg) {
    elementwise::DivideInPlace(op.output.dtype, out, count, size());
  }
}

}  // namespace adaptcomm::gloo_backend

// GPU check of the NCCL backend (run by bench/gpu_check.sh on a machine with NVIDIA GPUs):
//   1. every collective x every dtype on the NCCL backend, values checked element by element:
//      world = number of GPUs, one process per GPU (this program re-executes itself per rank);
//      with one GPU: world 1, with two communicators interleaved in one process;
//   2. a stalled stream makes an op time out: without coordinated retry DeadlineExceeded and
//      ncclCommAbort, bounded; with it the communicator is rebuilt and the op completes;
//   3. allreduce f32 busbw 1 MiB .. 1 GiB (nccl-tests: busbw = algbw x 2(n-1)/n), NCCL and the
//      Gloo-staged path (device buffers through pinned host memory) for comparison;
//   4. the CUDA cast kernels (lib/cuda/cast_kernels.cu) bit for bit against lib/precision's CPU
//      reference: all 65536 bf16 and fp16 patterns widened (scale 1 and not), ~4.6M fp32 patterns
//      (every bf16 neighbourhood, fp16 rounding ties and limits, NaN payloads, random) narrowed,
//      the overflow/NaN counters, aligned and unaligned buffers;
//   5. the device AllreduceMixed (bf16 wire, stream and host barrier) checked and timed against
//      the plain fp32 allreduce;
//   6. host overhead of a stream-ordered allreduce (issue + Wait) against ncclAllReduce called
//      directly on a communicator of our own: 8 bytes (target <= 5 us more per op, coordinated
//      retry off as in a hand-written loop; with retry on, each op's input copy is reported) and
//      the time to completion of back-to-back ops 1 MiB .. 1 GiB (target <= 2% slower; with one
//      GPU NCCL's in-place allreduce moves nothing, so this measures host cost only); then where
//      an 8-byte op's host time goes: every CUDA/NCCL call counted and timed per thread
//      (bench/timed_seams.h), and with GPU_CHECK_PROFILE=path the issuing thread's stacks sampled
//      every 50 us (bench/stack_sampler.h; bench/symbolize_stacks.py summarizes them);
//   7. overlap: a stream held busy by "compute" (a 300 ms host function) does not delay a
//      collective issued on another stream.
// Without a GPU it prints "no GPU: <reason>" and exits 0. Uses only adaptcomm's CUDA seam (no CUDA
// header here).
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/precision.h"
#include "bench/gpu_check_common.h"
#include "lib/base/cast_kernels.h"
#include "lib/cuda/cuda_api.h"
#include "lib/nccl/nccl_api.h"
#include "tests/dtype_values.h"

extern char** environ;

namespace adaptcomm::gpu_check {

int failures = 0;
std::shared_ptr<cuda::CudaApi> g_cuda;

void Sync(void* stream) {
  void* ev = nullptr;
  g_cuda->EventCreateDisableTiming(&ev);
  g_cuda->EventRecord(ev, stream);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (g_cuda->EventQuery(ev) == cuda::kCudaErrorNotReady && absl::Now() < deadline) {
  }
  g_cuda->EventDestroy(ev);
}

CommunicatorOptions Options(const std::string& name, BackendChoice b, int rank, int world, int port,
                            std::shared_ptr<Store> store, std::optional<int> retry_attempts) {
  CommunicatorOptions o;
  o.rank = rank;
  o.world_size = world;
  o.name = name;
  o.backend = b;
  o.fallback = Fallback::kDeny;
  o.timeout = absl::Seconds(120);
  o.init_timeout = absl::Seconds(120);
  o.store = std::move(store);
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.max_retry_attempts = retry_attempts;  // unset: the profile's
  return o;
}

namespace {

// Host <-> device copies of small test vectors, encoded in `t` from doubles.
std::vector<char> Encode(DType t, const std::vector<double>& v) {
  std::vector<char> out(v.size() * DTypeSize(t));
  for (size_t i = 0; i < v.size(); ++i)
    adaptcomm::testing::StoreAs(t, v[i], out.data() + i * DTypeSize(t));
  return out;
}
double DecodeAt(DType t, const std::vector<char>& b, size_t i) {
  return adaptcomm::testing::LoadAs(t, b.data() + i * DTypeSize(t));
}

void Expect(const std::string& what, DType t, const std::vector<char>& got,
            const std::vector<double>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = DecodeAt(t, got, i);
    if (std::fabs(g - want[i]) > 1e-3 * std::max(1.0, std::fabs(want[i]))) {
      ++failures;
      std::printf("  FAIL %s %s: element %zu is %g, expected %g\n", what.c_str(), DTypeName(t), i,
                  g, want[i]);
      return;
    }
  }
}

// Every collective x dtype on `comm` (rank r of n on `device`); values checked.
void Functional(Communicator& comm, int device, void* stream) {
  const int n = comm.size(), r = comm.rank();
  const size_t k = 5;
  for (DType t : kAllDTypes) {
    const std::string tag = absl::StrCat(comm.backend_name(), " r", r, " ");
    // allreduce sum: (r+1) + i
    std::vector<double> in(k), want(k);
    for (size_t i = 0; i < k; ++i) {
      in[i] = r + 1 + static_cast<double>(i);
      want[i] = n * (n + 1) / 2.0 + n * static_cast<double>(i);
    }
    DevBuf a(k * DTypeSize(t));
    a.Put(Encode(t, in), stream);
    CHECK_OK(comm.Allreduce(a.View(t, device, stream)).Synchronize(), tag + "allreduce");
    Expect(tag + "allreduce sum", t, a.Get(stream), want);
    if (IsFloatingPoint(t)) {
      a.Put(Encode(t, in), stream);
      CHECK_OK(comm.Allreduce(a.View(t, device, stream), {.op = ReduceOp::kAvg}).Synchronize(),
               tag + "allreduce avg");
      for (size_t i = 0; i < k; ++i) want[i] = (n + 1) / 2.0 + static_cast<double>(i);
      Expect(tag + "allreduce avg", t, a.Get(stream), want);
    }
    a.Put(Encode(t, in), stream);
    CHECK_OK(comm.Allreduce(a.View(t, device, stream), {.op = ReduceOp::kMax}).Synchronize(),
             tag + "allreduce max");
    for (size_t i = 0; i < k; ++i) want[i] = n + static_cast<double>(i);
    Expect(tag + "allreduce max", t, a.Get(stream), want);
    // broadcast from the last rank
    a.Put(Encode(t, in), stream);
    CHECK_OK(comm.Broadcast(a.View(t, device, stream), {.root = n - 1}).Synchronize(),
             tag + "broadcast");
    for (size_t i = 0; i < k; ++i) want[i] = n + static_cast<double>(i);
    Expect(tag + "broadcast", t, a.Get(stream), want);
    // reduce sum to rank 0
    a.Put(Encode(t, in), stream);
    CHECK_OK(comm.Reduce(a.View(t, device, stream), {.root = 0}).Synchronize(), tag + "reduce");
    if (r == 0) {
      for (size_t i = 0; i < k; ++i) want[i] = n * (n + 1) / 2.0 + n * static_cast<double>(i);
      Expect(tag + "reduce", t, a.Get(stream), want);
    }
    // allgather: block j = (j+1) + i
    DevBuf g(k * n * DTypeSize(t));
    a.Put(Encode(t, in), stream);
    CHECK_OK(comm.Allgather(a.View(t, device, stream), g.View(t, device, stream)).Synchronize(),
             tag + "allgather");
    std::vector<double> gw(k * n);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < k; ++i) gw[j * k + i] = j + 1 + static_cast<double>(i);
    }
    Expect(tag + "allgather", t, g.Get(stream), gw);
    // reduce_scatter of the gathered blocks: block r summed n times
    DevBuf rs(k * DTypeSize(t));
    CHECK_OK(
        comm.ReduceScatter(g.View(t, device, stream), rs.View(t, device, stream)).Synchronize(),
        tag + "reduce_scatter");
    for (size_t i = 0; i < k; ++i) want[i] = n * (r + 1 + static_cast<double>(i));
    Expect(tag + "reduce_scatter", t, rs.Get(stream), want);
    // alltoall: block j of rank r = 10r + j; received block j = 10j + r
    std::vector<double> ain(n), aw(n);
    for (int j = 0; j < n; ++j) {
      ain[j] = 10.0 * r + j;
      aw[j] = 10.0 * j + r;
    }
    DevBuf ai(n * DTypeSize(t)), ao(n * DTypeSize(t));
    ai.Put(Encode(t, ain), stream);
    CHECK_OK(comm.Alltoall(ai.View(t, device, stream), ao.View(t, device, stream)).Synchronize(),
             tag + "alltoall");
    Expect(tag + "alltoall", t, ao.Get(stream), aw);
    // send/recv around a ring (even ranks send first)
    if (n > 1) {
      DevBuf s(k * DTypeSize(t)), v(k * DTypeSize(t));
      s.Put(Encode(t, in), stream);
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      if (r % 2 == 0) {
        CHECK_OK(comm.Send(s.View(t, device, stream), next).Synchronize(), tag + "send");
        CHECK_OK(comm.Recv(v.View(t, device, stream), prev).Synchronize(), tag + "recv");
      } else {
        CHECK_OK(comm.Recv(v.View(t, device, stream), prev).Synchronize(), tag + "recv");
        CHECK_OK(comm.Send(s.View(t, device, stream), next).Synchronize(), tag + "send");
      }
      for (size_t i = 0; i < k; ++i) want[i] = prev + 1 + static_cast<double>(i);
      Expect(tag + "send/recv", t, v.Get(stream), want);
    }
  }
  CHECK_OK(comm.Barrier().Synchronize(), "barrier");
  // A host view on NCCL is refused, naming the view.
  std::vector<float> host(4);
  absl::Status s = comm.Allreduce(HostView(host.data(), 4)).Wait();
  if (std::string(comm.backend_name()) == "nccl" &&
      (s.code() != absl::StatusCode::kInvalidArgument ||
       s.message().find("host (cpu) buffer") == absl::string_view::npos)) {
    ++failures;
    std::printf("  FAIL host view on nccl: %s\n", s.ToString().c_str());
  }
}

absl::StatusOr<std::unique_ptr<Communicator>> Make(const std::string& name, BackendChoice b,
                                                   int rank, int world, int port,
                                                   std::shared_ptr<Store> store,
                                                   std::optional<int> retry_attempts = {}) {
  return Communicator::Create(
      Options(name, b, rank, world, port, std::move(store), retry_attempts));
}

void StallStream(void* arg) { absl::SleepFor(*static_cast<absl::Duration*>(arg)); }

void TimeoutCheck(Communicator& comm, int device, void* stream, bool retry) {
  // The host function holds the stream for 4 s; the op's 500 ms bound fires first.
  static absl::Duration stall = absl::Seconds(4);
  DevBuf a(1 << 20);
  if (comm.rank() == 0) g_cuda->LaunchHostFunc(stream, StallStream, &stall);
  const absl::Time start = absl::Now();
  // Stream-ordered: the op queues behind the stall at once; the watchdog polling its completion
  // event fails it 500 ms after it became the oldest op in flight. Without retry that is the
  // op's status (DeadlineExceeded, or Aborted on a rank whose peer aborted first); with retry the
  // ranks rebuild the communicator and re-run the op, which completes once the stall ends.
  absl::Status s =
      comm.Allreduce(a.View(DType::kF32, device, stream), {.timeout = absl::Milliseconds(500)})
          .Synchronize();
  const absl::Duration took = absl::Now() - start;
  std::printf("  %s r%d: %s after %s; generation %d; health: %s\n",
              retry ? "with retry" : "without retry", comm.rank(), s.ToString().c_str(),
              absl::FormatDuration(took).c_str(), comm.membership().generation,
              comm.health().ToString().c_str());
  if (retry && (!s.ok() || comm.membership().generation < 1)) {
    ++failures;
    std::printf("  FAIL timeout with retry: expected OK from a rebuilt communicator\n");
  }
  if (!retry && comm.rank() == 0 && s.code() != absl::StatusCode::kDeadlineExceeded &&
      s.code() != absl::StatusCode::kAborted) {
    ++failures;
    std::printf("  FAIL timeout check: expected DeadlineExceeded\n");
  }
  if (took > absl::Seconds(12)) {
    ++failures;
    std::printf("  FAIL timeout check: took %s (op 500 ms + abort bound)\n",
                absl::FormatDuration(took).c_str());
  }
  Sync(stream);  // let the stalled host function finish before the buffer is freed
}

void Busbw(Communicator& comm, int device, void* stream, size_t max_bytes) {
  const int n = comm.size();
  const double factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  DevBuf buf(max_bytes);
  if (buf.p == nullptr) {
    std::printf("  cannot allocate %zu bytes\n", max_bytes);
    return;
  }
  if (comm.rank() == 0) {
    std::printf("  %-8s %12s %12s %10s %10s\n", comm.backend_name(), "bytes", "time_us",
                "algbw_GB/s", "busbw_GB/s");
  }
  for (size_t bytes = 1 << 20; bytes <= max_bytes; bytes *= 2) {
    TensorView v{buf.p, bytes / 4, DType::kF32, Device::Cuda(device), stream};
    const int iters = static_cast<int>(std::clamp<size_t>((size_t{4} << 30) / bytes, 5, 50));
    for (int i = 0; i < 3; ++i) CHECK_OK(comm.Allreduce(v).Synchronize(), "busbw warmup");
    CHECK_OK(comm.Barrier().Synchronize(), "busbw barrier");
    const absl::Time start = absl::Now();
    // Back to back on the device (each Wait only orders the stream), one host wait at the end.
    Work last;
    for (int i = 0; i < iters; ++i) {
      last = comm.Allreduce(v);
      CHECK_OK(last.Wait(), "busbw");
    }
    CHECK_OK(last.Synchronize(), "busbw");
    const double us = absl::ToDoubleMicroseconds(absl::Now() - start) / iters;
    const double algbw = static_cast<double>(bytes) / (us * 1e3);  // GB/s
    if (comm.rank() == 0) {
      std::printf("  %-8s %12zu %12.1f %10.2f %10.2f\n", comm.backend_name(), bytes, us, algbw,
                  algbw * factor);
    }
  }
}

// ---- [4] cast kernels vs the CPU reference ----

// Runs one device cast of host `src` (`in_bytes`) into `out_bytes`, `offset` bytes into both
// device buffers (offset 0: the vectorized path; 2 or 4: the scalar one). Returns the output and
// the two counters.
std::vector<char> DeviceCast(cuda::CastDirection dir, const void* src, size_t in_bytes,
                             size_t out_bytes, size_t count, float scale, size_t offset,
                             void* stream, cuda::DeviceCastCounters* counts) {
  DevBuf in(in_bytes + offset), out(out_bytes + offset), ctr(sizeof(cuda::DeviceCastCounters));
  std::vector<char> h(static_cast<const char*>(src), static_cast<const char*>(src) + in_bytes);
  g_cuda->MemcpyAsync(static_cast<char*>(in.p) + offset, h.data(), in_bytes,
                      cuda::MemcpyKind::kHostToDevice, stream);
  g_cuda->MemsetAsync(ctr.p, 0, sizeof(cuda::DeviceCastCounters), stream);
  void* dst = static_cast<char*>(out.p) + offset;
  const int e = g_cuda->LaunchCast(dir, static_cast<char*>(in.p) + offset, dst, count, scale,
                                   stream, static_cast<cuda::DeviceCastCounters*>(ctr.p));
  if (e != cuda::kCudaSuccess) {
    ++failures;
    std::printf("  FAIL LaunchCast: %s\n", g_cuda->ErrorString(e).c_str());
  }
  std::vector<char> got(out_bytes);
  g_cuda->MemcpyAsync(got.data(), dst, out_bytes, cuda::MemcpyKind::kDeviceToHost, stream);
  g_cuda->MemcpyAsync(counts, ctr.p, sizeof(*counts), cuda::MemcpyKind::kDeviceToHost, stream);
  Sync(stream);
  return got;
}

template <typename T>
void CompareBits(const std::string& what, const std::vector<char>& got, const T* want, size_t n,
                 const void* input, size_t in_size) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    T g;
    std::memcpy(&g, got.data() + i * sizeof(T), sizeof(T));
    if (g != want[i]) {
      if (bad++ < 3) {
        uint32_t x = 0;
        std::memcpy(&x, static_cast<const char*>(input) + i * in_size, in_size);
        std::printf("  FAIL %s: input 0x%x -> gpu 0x%x, cpu 0x%x\n", what.c_str(), x,
                    static_cast<unsigned>(g), static_cast<unsigned>(want[i]));
      }
    }
  }
  if (bad > 0) {
    ++failures;
    std::printf("  FAIL %s: %zu of %zu elements differ\n", what.c_str(), bad, n);
  }
}

void CheckCounts(const std::string& what, const cuda::DeviceCastCounters& got,
                 const CastStats& want) {
  if (got.overflow != want.overflow || got.nonfinite != want.nonfinite_inputs) {
    ++failures;
    std::printf("  FAIL %s counters: gpu overflow %llu nonfinite %llu, cpu %zu %zu\n", what.c_str(),
                got.overflow, got.nonfinite, want.overflow, want.nonfinite_inputs);
  }
}

void CastKernelCheck(void* stream) {
  namespace p = precision;
  const int failures_before = failures;
  if (!cuda::CastKernelsBuiltIn()) {
    ++failures;
    std::printf("  FAIL: this build has no CUDA cast kernels (nvcc did not work at build time)\n");
    return;
  }
  // Widening: every 16-bit pattern, scale 1 (exact, NaN payloads kept) and two others.
  std::vector<uint16_t> halves(65536);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  for (bool f16 : {false, true}) {
    for (float scale : {1.0f, 0.5f, 3.0f}) {
      for (size_t offset : {size_t{0}, size_t{4}}) {
        std::vector<float> want(halves.size());
        const CastStats cs =
            f16 ? p::F16ToF32Scalar(halves.data(), want.data(), halves.size(), scale)
                : p::BF16ToF32Scalar(halves.data(), want.data(), halves.size(), scale);
        cuda::DeviceCastCounters counts{};
        const std::vector<char> got = DeviceCast(
            f16 ? cuda::CastDirection::kF16ToF32 : cuda::CastDirection::kBF16ToF32, halves.data(),
            halves.size() * 2, halves.size() * 4, halves.size(), scale, offset, stream, &counts);
        std::vector<uint32_t> want_bits(want.size());
        std::memcpy(want_bits.data(), want.data(), want.size() * 4);
        const std::string what =
            absl::StrCat(f16 ? "f16" : "bf16", "->f32 x", scale, offset ? " unaligned" : "");
        CompareBits(what, got, want_bits.data(), want.size(), halves.data(), 2);
        CheckCounts(what, counts, cs);
      }
    }
  }
  // Narrowing: each bf16 pattern with low halves at and around the rounding tie, the fp16 ties
  // and limits, NaN payloads in the low bits, and random patterns.
  std::vector<uint32_t> bits;
  for (uint32_t h = 0; h < 65536; ++h) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      bits.push_back(h << 16 | low);
    }
  }
  for (uint32_t a = 0x33000000u; a <= 0x47800000u; a += 0x1000u) {  // 2^-25 .. 65536
    for (uint32_t d : {0x0u, 0x1u, 0xfffu}) {
      bits.push_back(a + d);
      bits.push_back((a + d) | 0x80000000u);
    }
  }
  for (uint32_t x :
       {0x477fe000u, 0x477fefffu, 0x477ff000u, 0x7f7f7fffu, 0x7f7f8000u, 0x7f800001u, 0x7fbfffffu,
        0xff800001u, 0x00000001u, 0x80000001u, 0x33000000u, 0x33000001u}) {
    bits.push_back(x);
  }
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < (1 << 22); ++i) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    bits.push_back(static_cast<uint32_t>(rng));
  }
  std::vector<float> f32(bits.size());
  std::memcpy(f32.data(), bits.data(), bits.size() * 4);
  for (bool f16 : {false, true}) {
    for (size_t offset : {size_t{0}, size_t{2}}) {
      std::vector<uint16_t> want(f32.size());
      const CastStats cs = f16 ? p::F32ToF16Scalar(f32.data(), want.data(), f32.size())
                               : p::F32ToBF16Scalar(f32.data(), want.data(), f32.size());
      cuda::DeviceCastCounters counts{};
      const std::vector<char> got = DeviceCast(
          f16 ? cuda::CastDirection::kF32ToF16 : cuda::CastDirection::kF32ToBF16, f32.data(),
          f32.size() * 4, f32.size() * 2, f32.size(), 1.0f, offset * 2, stream, &counts);
      const std::string what =
          absl::StrCat("f32->", f16 ? "f16" : "bf16", offset ? " unaligned" : "");
      CompareBits(what, got, want.data(), want.size(), f32.data(), 4);
      CheckCounts(what, counts, cs);
    }
  }
  // The fp32 scale (plain fp32 wire): x86's NaN results.
  {
    const float scale = 0.37f;
    std::vector<uint32_t> want(f32.size());
    for (size_t i = 0; i < f32.size(); ++i) {
      const float r = f32[i] * scale;
      std::memcpy(&want[i], &r, 4);
    }
    cuda::DeviceCastCounters counts{};
    const std::vector<char> got =
        DeviceCast(cuda::CastDirection::kF32ToF32, f32.data(), f32.size() * 4, f32.size() * 4,
                   f32.size(), scale, 0, stream, &counts);
    CompareBits("f32 x 0.37", got, want.data(), want.size(), f32.data(), 4);
  }
  std::printf("  %zu fp32 and 2 x 65536 half patterns checked: %s\n", f32.size(),
              failures == failures_before ? "bit-identical" : "see failures");
}

// ---- [5] the device AllreduceMixed ----

void MixedCheck(Communicator& comm, int device, void* stream) {
  const size_t n = size_t{16} << 20;  // 64 MiB of fp32
  const int world = comm.size();
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>((i % 1999) - 999) / 256.0f;
  DevBuf data(n * 4);
  const std::vector<char> bytes(reinterpret_cast<const char*>(host.data()),
                                reinterpret_cast<const char*>(host.data()) + n * 4);
  MixedPrecisionContext ctx(comm);
  for (BarrierLevel level : {BarrierLevel::kStream, BarrierLevel::kHost}) {
    MixedOptions mo;
    mo.wire = DType::kBF16;
    mo.barrier = level;
    mo.context = &ctx;
    data.Put(bytes, stream);
    auto st = AllreduceMixed(comm, data.View(DType::kF32, device, stream), mo);
    if (!st.ok()) {
      ++failures;
      std::printf("  FAIL mixed allreduce (%s): %s\n", BarrierLevelName(level),
                  st.status().ToString().c_str());
      continue;
    }
    // Every rank holds the same data: the result is world x bf16(x), rounded to bf16 (exact for
    // 1, 2 and 4 ranks: these inputs have few significant bits).
    const std::vector<char> got = data.Get(stream);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      float g;
      std::memcpy(&g, got.data() + i * 4, 4);
      const float w = host[i] * static_cast<float>(world);
      if (std::fabs(g - w) > std::ldexp(std::fabs(w), -7) * world) ++bad;
    }
    if (bad > 0) {
      ++failures;
      std::printf("  FAIL mixed allreduce (%s): %zu of %zu elements off\n", BarrierLevelName(level),
                  bad, n);
    }
    // Timing: 20 calls after the warm-up above.
    const absl::Time t0 = absl::Now();
    for (int k = 0; k < 20; ++k) {
      if (!AllreduceMixed(comm, data.View(DType::kF32, device, stream), mo).ok()) ++failures;
    }
    const double us = absl::ToDoubleMicroseconds(absl::Now() - t0) / 20;
    std::printf(
        "  mixed bf16 (%s barrier) 64 MiB: %.1f us/call (cast %.1f us, collective %.1f us, "
        "cast back %.1f us in the first call)\n",
        BarrierLevelName(level), us, absl::ToDoubleMicroseconds(st->cast_time),
        absl::ToDoubleMicroseconds(st->collective_time),
        absl::ToDoubleMicroseconds(st->cast_back_time));
  }
  data.Put(bytes, stream);
  const absl::Time t0 = absl::Now();
  for (int k = 0; k < 20; ++k)
    CHECK_OK(comm.Allreduce(data.View(DType::kF32, device, stream)).Synchronize(), "f32 allreduce");
  std::printf("  plain f32 allreduce 64 MiB: %.1f us/call\n",
              absl::ToDoubleMicroseconds(absl::Now() - t0) / 20);
}

// ---- [7] overlap with compute on another stream ----

void OverlapCheck(Communicator& comm, int device, void* stream) {
  void* compute = nullptr;
  if (g_cuda->StreamCreateNonBlocking(&compute) != cuda::kCudaSuccess) {
    ++failures;
    std::printf("  FAIL creating the compute stream\n");
    return;
  }
  static absl::Duration busy = absl::Milliseconds(300);
  DevBuf a(size_t{4} << 20);
  g_cuda->LaunchHostFunc(compute, StallStream, &busy);  // "compute" holds its own stream
  const absl::Time start = absl::Now();
  absl::Status s =
      comm.Allreduce(a.View(DType::kF32, device, stream)).Synchronize(absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  CHECK_OK(s, "overlap allreduce");
  std::printf("  4 MiB allreduce beside a 300 ms busy stream: done after %s\n",
              absl::FormatDuration(took).c_str());
  if (took >= absl::Milliseconds(250)) {
    ++failures;
    std::printf("  FAIL the collective waited for the other stream\n");
  }
  Sync(compute);
  g_cuda->StreamDestroy(compute);
}

int RunRank(int rank, int world, int port) {
  setenv("ADAPTCOMM_CUDA_DEVICE", std::to_string(rank).c_str(), 1);
  const int device = rank;
  g_cuda->SetDevice(device);
  void* stream = nullptr;
  g_cuda->StreamCreateNonBlocking(&stream);
  // One job store for all the communicators below (each Create would otherwise serve its own).
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Store> store = CreateHashStore();
  if (world > 1) {
    TcpStoreOptions so;
    so.port = port;
    if (rank == 0) {
      auto srv = StartTcpStoreServer(so);
      if (!srv.ok()) {
        std::printf("FAIL store server: %s\n", srv.status().ToString().c_str());
        return 1;
      }
      server = std::move(*srv);
    }
    auto client = ConnectTcpStore(so);
    if (!client.ok()) {
      std::printf("FAIL store client: %s\n", client.status().ToString().c_str());
      return 1;
    }
    store = *client;
  }
  auto a = Make("check_a", BackendChoice::kNccl, rank, world, port, store);
  if (!a.ok()) {
    std::printf("rank %d: FAIL creating the NCCL communicator: %s\n", rank,
                a.status().ToString().c_str());
    return 1;
  }
  std::printf("rank %d: %s (%s)\n", rank, (*a)->backend_name(), (*a)->selection_reason().c_str());
  std::printf("[1] every collective x dtype, rank %d of %d\n", rank, world);
  Functional(**a, device, stream);
  if (world == 1) {
    // Two communicators in one process, interleaved.
    auto b = Make("check_b", BackendChoice::kNccl, rank, world, port, store);
    if (!b.ok()) {
      std::printf("FAIL second communicator: %s\n", b.status().ToString().c_str());
      return 1;
    }
    Functional(**b, device, stream);
    Functional(**a, device, stream);
  }
  // The stream-ordered engine's GPU targets first ([6], [7], [2]): a run cut short by its bound
  // still has them. [2] syncs its stalled stream before the next check.
  std::printf("[6] host overhead against ncclAllReduce (world %d)\n", world);
  {
    auto lean = Make("check_lean", BackendChoice::kNccl, rank, world, port, store, 1);
    if (lean.ok()) {
      OverheadCheck(**a, **lean, *store, device, stream);
      BreakdownCheck(rank, world, port, store, device, stream);
    } else {
      ++failures;
      std::printf("FAIL communicator without retry: %s\n", lean.status().ToString().c_str());
    }
  }
  std::printf("[7] a collective overlaps compute on another stream\n");
  OverlapCheck(**a, device, stream);
  std::printf("[2] a stalled stream times out: aborts without retry, recovers with it\n");
  for (int attempts : {1, 2}) {
    auto t = Make(attempts == 1 ? "check_timeout" : "check_timeout_retry", BackendChoice::kNccl,
                  rank, world, port, store, attempts);
    if (t.ok()) {
      TimeoutCheck(**t, device, stream, attempts > 1);
    } else {
      ++failures;
      std::printf("FAIL timeout communicator: %s\n", t.status().ToString().c_str());
    }
  }
  std::printf("[4] CUDA cast kernels vs the CPU reference\n");
  CastKernelCheck(stream);
  std::printf("[5] device mixed-precision allreduce (world %d)\n", world);
  MixedCheck(**a, device, stream);
  std::printf("[3] allreduce f32 busbw, NCCL (world %d)\n", world);
  Busbw(**a, device, stream, size_t{1} << 30);
  std::printf("[3] allreduce f32 busbw, Gloo staged through pinned host memory (world %d)\n",
              world);
  {
    auto g = Make("check_gloo", BackendChoice::kGloo, rank, world, port, store);
    if (!g.ok()) {
      std::printf("FAIL gloo communicator: %s\n", g.status().ToString().c_str());
      ++failures;
    } else {
      std::printf("rank %d: %s (%s)\n", rank, (*g)->backend_name(),
                  (*g)->selection_reason().c_str());
      Functional(**g, device, stream);
      Busbw(**g, device, stream, size_t{256} << 20);
    }
  }
  CHECK_OK((*a)->Barrier().Synchronize(),
           "final barrier");  // rank 0 serves the store: leave together
  std::printf("rank %d: %s (%d failures)\n", rank, failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace
}  // namespace adaptcomm::gpu_check

int main(int argc, char** argv) {
  using namespace adaptcomm;
  using namespace adaptcomm::gpu_check;
  auto c = cuda::LoadCudaApi();
  if (!c.ok()) {
    std::printf("no GPU: %s\n", std::string(c.status().message()).c_str());
    return 0;
  }
  g_cuda = *c;
  if (argc == 4 && std::string(argv[1]) == "--rank") {
    return RunRank(std::atoi(argv[2]), std::atoi(argv[3]),
                   std::atoi(std::getenv("GPU_CHECK_PORT")));
  }
  int devices = 0;
  if (int e = g_cuda->GetDeviceCount(&devices); e != cuda::kCudaSuccess || devices == 0) {
    std::printf("no GPU: no CUDA device visible (%s); nothing to check\n",
                e != cuda::kCudaSuccess ? g_cuda->ErrorString(e).c_str() : "0 devices");
    return 0;
  }
  auto api = nccl::LoadNcclApi();
  if (!api.ok()) {
    std::printf("FAIL: %d GPU(s) but NCCL does not load: %s\n", devices,
                std::string(api.status().message()).c_str());
    return 1;
  }
  int version = 0, driver = 0, runtime = 0;
  (*api)->GetVersion(&version);
  g_cuda->DriverVersion(&driver);
  g_cuda->RuntimeVersion(&runtime);
  std::printf("%d GPU(s); NCCL %s from %s; CUDA driver %d, runtime %d\n", devices,
              nccl::NcclVersionString(version).c_str(), (*api)->library_path().c_str(), driver,
              runtime);
  if (devices == 1) return RunRank(0, 1, 0);
  // One process per GPU: re-execute this program per rank (a forked CUDA context is unusable).
  const std::string port = std::to_string(FreePort());
  setenv("GPU_CHECK_PORT", port.c_str(), 1);
  std::vector<pid_t> pids;
  for (int r = 0; r < devices; ++r) {
    std::string rs = std::to_string(r), ws = std::to_string(devices);
    char* args[] = {argv[0], const_cast<char*>("--rank"), rs.data(), ws.data(), nullptr};
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, args, environ) != 0) {
      std::printf("FAIL: cannot spawn rank %d\n", r);
      return 1;
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::printf("%s: %d of %d ranks failed\n", failed == 0 ? "PASS" : "FAIL", failed, devices);
  return failed == 0 ? 0 : 1;
}

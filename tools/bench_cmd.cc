// `adaptcomm bench`: latency and bandwidth of collectives through the public API, reported the way
// nccl-tests does (algbw, busbw), so that a job's numbers can be compared with NCCL's own tests.
//
// Ranks are threads of this process meeting over a loopback TCP store (--ranks N), or this process
// is one rank of a job started by `adaptcomm launch -n N -- adaptcomm bench` (or torchrun, mpirun,
// srun). The first run of every op and size is checked element by element on every rank: a wrong
// result fails the command (exit 1), a benchmark of a broken collective is worthless.
// Exit codes: 0 ok, 1 a rank failed or a result was wrong, 2 bad arguments.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "lib/base/byte_text.h"
#include "lib/base/cast_kernels.h"
#include "lib/config/units.h"
#include "lib/cuda/cuda_api.h"
#include "lib/diag/collective_timing.h"
#include "lib/diag/rank_group.h"
#include "nlohmann/json.hpp"
#include "tools/subcommands.h"

namespace adaptcomm::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchArgs {
  int ranks = 0;  // 0: one rank of the launched job
  std::string ops = "allreduce,allgather,broadcast,reduce_scatter";
  std::string sizes = "4KiB,1MiB,64MiB";
  int iters = 20;
  int warmup = 3;
  std::string dtype = "f32";
  std::string backend = "auto";
  double timeout_s = 60;
  std::string model;
  bool json = false;
  int inject_corruption = -1;  // this rank alters one element of each checked result
};

struct Plan {
  std::vector<OpKind> ops;
  std::vector<uint64_t> sizes;
  DType dtype = DType::kF32;
  BackendChoice backend = BackendChoice::kAuto;
  int ranks_on_host = 1;  // ranks of the job whose buffers share this host's memory
};

// Every error names the token that is wrong.
absl::StatusOr<Plan> ParsePlan(const BenchArgs& a) {
  Plan p;
  for (absl::string_view t : absl::StrSplit(a.ops, ',')) {
    const std::string tok(absl::StripAsciiWhitespace(t));
    if (tok == "allreduce") {
      p.ops.push_back(OpKind::kAllreduce);
    } else if (tok == "allgather") {
      p.ops.push_back(OpKind::kAllgather);
    } else if (tok == "broadcast") {
      p.ops.push_back(OpKind::kBroadcast);
    } else if (tok == "reduce_scatter") {
      p.ops.push_back(OpKind::kReduceScatter);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--ops: unknown op '", tok,
                       "' (one of allreduce, allgather, broadcast, reduce_scatter)"));
    }
  }
  for (absl::string_view t : absl::StrSplit(a.sizes, ',')) {
    const std::string tok(absl::StripAsciiWhitespace(t));
    auto bytes = config::ParseByteSize(tok);
    if (!bytes.ok() || *bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sizes: bad size '", tok, "' (a positive byte count: 4096, 4KiB, 1MiB, 64MiB, 1GB)"));
    }
    p.sizes.push_back(*bytes);
  }
  if (a.dtype == "f32") {
    p.dtype = DType::kF32;
  } else if (a.dtype == "bf16") {
    p.dtype = DType::kBF16;
  } else if (a.dtype == "f16") {
    p.dtype = DType::kF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype: unknown dtype '", a.dtype, "' (f32, bf16 or f16)"));
  }
  if (a.backend == "auto") {
    p.backend = BackendChoice::kAuto;
  } else if (a.backend == "gloo") {
    p.backend = BackendChoice::kGloo;
  } else if (a.backend == "nccl") {
    p.backend = BackendChoice::kNccl;
  } else if (a.backend == "shm") {
    p.backend = BackendChoice::kShm;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: unknown backend '", a.backend, "' (auto, gloo, nccl or shm)"));
  }
  return p;
}

// ---- element values: small integers, so every dtype holds sums over all ranks exactly ----

float Load(DType t, const uint8_t* base, size_t i) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, base + i * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, base + i * 2, 2);
  const uint32_t bits =
      t == DType::kBF16 ? precision::BF16ToF32Bits(h) : precision::F16ToF32Bits(h);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void StoreValue(DType t, uint8_t* base, size_t i, float v) {
  if (t == DType::kF32) {
    std::memcpy(base + i * 4, &v, 4);
    return;
  }
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint16_t h =
      t == DType::kBF16 ? precision::F32BitsToBF16(bits) : precision::F32BitsToF16(bits);
  std::memcpy(base + i * 2, &h, 2);
}

// Largest integer every value up to which the dtype represents exactly.
double ExactLimit(DType t) { return t == DType::kBF16 ? 256 : t == DType::kF16 ? 2048 : 16777216; }

// Rank r's value at global index g, in 1..k with n*k within the dtype's exact range (k <= 4).
struct Pattern {
  int k = 1;
  Pattern(int n, DType t)
      : k(static_cast<int>(std::clamp<double>(ExactLimit(t) / std::max(1, n), 1, 4))) {}
  float At(int r, size_t g) const { return static_cast<float>((r * 3 + g) % k + 1); }
};

// ---- buffers: host memory, or CUDA memory with a host mirror to fill and check ----

struct DeviceContext {
  std::shared_ptr<cuda::CudaApi> cuda;
  int device = 0;
  absl::Duration timeout;
};

class Buffer {
 public:
  Buffer(size_t count, DType dtype, const DeviceContext* dev)
      : count_(count), dtype_(dtype), dev_(dev), host_(count * DTypeSize(dtype)) {}
  ~Buffer() {
    if (device_data_ != nullptr) dev_->cuda->Free(device_data_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  absl::Status Init() {
    if (dev_ == nullptr) return absl::OkStatus();
    const int rc = dev_->cuda->Malloc(&device_data_, std::max<size_t>(1, host_.size()));
    if (rc != cuda::kCudaSuccess) {
      device_data_ = nullptr;
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc(", host_.size(), "): ", dev_->cuda->ErrorString(rc)));
    }
    return absl::OkStatus();
  }
  uint8_t* host() { return host_.data(); }
  size_t count() const { return count_; }
  TensorView view() {
    if (dev_ == nullptr) return TensorView{host_.data(), count_, dtype_, Device::Cpu(), nullptr};
    return TensorView{device_data_, count_, dtype_, Device::Cuda(dev_->device), nullptr};
  }
  absl::Status Upload() { return Copy(cuda::MemcpyKind::kHostToDevice); }
  absl::Status Download() { return Copy(cuda::MemcpyKind::kDeviceToHost); }

 private:
  // On the legacy default stream, which orders it with the collectives' streams; waited for.
  absl::Status Copy(cuda::MemcpyKind kind) {
    if (dev_ == nullptr || host_.empty()) return absl::OkStatus();
    cuda::CudaApi& c = *dev_->cuda;
    void* dst = kind == cuda::MemcpyKind::kHostToDevice ? device_data_ : host_.data();
    const void* src =
        kind == cuda::MemcpyKind::kHostToDevice ? static_cast<void*>(host_.data()) : device_data_;
    if (int rc = c.MemcpyAsync(dst, src, host_.size(), kind, nullptr); rc != cuda::kCudaSuccess) {
      return absl::InternalError(absl::StrCat("cudaMemcpyAsync: ", c.ErrorString(rc)));
    }
    cuda::CudaEvent ev = nullptr;
    if (int rc = c.EventCreateDisableTiming(&ev); rc != cuda::kCudaSuccess) {
      return absl::InternalError(absl::StrCat("cudaEventCreate: ", c.ErrorString(rc)));
    }
    absl::Status s;
    if (int rc = c.EventRecord(ev, nullptr); rc != cuda::kCudaSuccess) {
      s = absl::InternalError(absl::StrCat("cudaEventRecord: ", c.ErrorString(rc)));
    }
    const absl::Time deadline = absl::Now() + dev_->timeout;
    while (s.ok()) {
      const int q = c.EventQuery(ev);
      if (q == cuda::kCudaSuccess) break;
      if (q != cuda::kCudaErrorNotReady) {
        s = absl::InternalError(absl::StrCat("cudaEventQuery: ", c.ErrorString(q)));
      } else if (absl::Now() > deadline) {
        s = absl::DeadlineExceededError(absl::StrCat("a host/device copy did not finish within ",
                                                     absl::FormatDuration(dev_->timeout)));
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    c.EventDestroy(ev);
    return s;
  }

  size_t count_;
  DType dtype_;
  const DeviceContext* dev_;
  std::vector<uint8_t> host_;
  void* device_data_ = nullptr;
};

// ---- one rank's run ----

struct Row {
  OpKind op;
  uint64_t bytes = 0;  // nccl-tests' size: the full buffer (gathered/scattered total)
  size_t count = 0;    // elements of that size
  diag::TimingSummary us;
  double algbw = 0, busbw = 0;  // GB/s, from the median
};

struct RankReport {
  std::string backend, reason;
  std::vector<Row> rows;
};

Work Issue(Communicator& comm, OpKind op, Buffer& in, Buffer* out) {
  switch (op) {
    case OpKind::kAllreduce:
      return comm.Allreduce(in.view());
    case OpKind::kBroadcast:
      return comm.Broadcast(in.view());
    case OpKind::kAllgather:
      return comm.Allgather(in.view(), out->view());
    default:
      return comm.ReduceScatter(in.view(), out->view());
  }
}

// Fills this rank's input; returns the check of the output: "" when right, else the first error.
class Case {
 public:
  Case(OpKind op, uint64_t bytes, int rank, int n, DType t)
      : op_(op), rank_(rank), n_(n), t_(t), pattern_(n, t) {
    const size_t elems = std::max<size_t>(1, bytes / DTypeSize(t));
    block_ = std::max<size_t>(1, elems / n);
    in_count_ = op == OpKind::kAllgather       ? block_
                : op == OpKind::kReduceScatter ? block_ * n
                                               : elems;
    out_count_ = op == OpKind::kAllgather ? block_ * n : op == OpKind::kReduceScatter ? block_ : 0;
    size_count_ = op == OpKind::kAllgather || op == OpKind::kReduceScatter ? block_ * n : elems;
  }
  bool in_place() const { return out_count_ == 0; }
  size_t in_count() const { return in_count_; }
  size_t out_count() const { return out_count_; }
  size_t size_count() const { return size_count_; }

  void Fill(uint8_t* in) const {
    for (size_t g = 0; g < in_count_; ++g) {
      float v = pattern_.At(rank_, g);
      if (op_ == OpKind::kBroadcast && rank_ != 0) v = 0;  // must be overwritten
      StoreValue(t_, in, g, v);
    }
  }

  // Wrong elements of the result; `first` describes the first one.
  size_t Check(const uint8_t* result, std::string* first) const {
    const size_t count = in_place() ? in_count_ : out_count_;
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) {
      const double want = Expected(i);
      const double got = Load(t_, result, i);
      // Exact while sums stay in the dtype's integer range; beyond it (huge worlds) allow the
      // rounding of a few additions.
      const double tol = want <= ExactLimit(t_) ? 0 : want * 0.02;
      if (!(std::abs(got - want) <= tol)) {
        if (bad++ == 0) *first = absl::StrFormat("element %zu is %g, want %g", i, got, want);
      }
    }
    return bad;
  }

 private:
  double Expected(size_t i) const {
    double sum = 0;
    switch (op_) {
      case OpKind::kAllreduce:
        for (int r = 0; r < n_; ++r) sum += pattern_.At(r, i);
        return sum;
      case OpKind::kBroadcast:
        return pattern_.At(0, i);
      case OpKind::kAllgather:
        return pattern_.At(static_cast<int>(i / block_), i % block_);
      default:
        for (int r = 0; r < n_; ++r) sum += pattern_.At(r, rank_ * block_ + i);
        return sum;
    }
  }

  OpKind op_;
  int rank_, n_;
  DType t_;
  Pattern pattern_;
  size_t block_ = 0, in_count_ = 0, out_count_ = 0, size_count_ = 0;
};

absl::Status Wait(Work w, const char* what) {
  absl::Status s = w.Synchronize();  // device ops too: the time of an op is until it is done
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  return s;
}

// Sums (or maxes) doubles over all ranks, through a buffer in the same memory as the measured ones.
absl::StatusOr<std::vector<double>> OverAllRanks(Communicator& comm, std::vector<double> values,
                                                 ReduceOp op, const DeviceContext* dev) {
  Buffer buf(values.size(), DType::kF64, dev);
  if (absl::Status s = buf.Init(); !s.ok()) return s;
  std::memcpy(buf.host(), values.data(), values.size() * sizeof(double));
  if (absl::Status s = buf.Upload(); !s.ok()) return s;
  if (absl::Status s = Wait(comm.Allreduce(buf.view(), {.op = op}), "exchanging results");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = buf.Download(); !s.ok()) return s;
  std::memcpy(values.data(), buf.host(), values.size() * sizeof(double));
  return values;
}

absl::StatusOr<Row> RunCase(Communicator& comm, const Plan& plan, const BenchArgs& a, OpKind op,
                            uint64_t bytes, const DeviceContext* dev) {
  const int n = comm.size();
  const Case c(op, bytes, comm.rank(), n, plan.dtype);
  const std::string name = absl::StrCat(OpKindName(op), " ", bytes, " B ", DTypeName(plan.dtype));
  Buffer in(c.in_count(), plan.dtype, dev);
  Buffer out(std::max<size_t>(1, c.out_count()), plan.dtype, dev);
  for (Buffer* b : {&in, &out}) {
    if (absl::Status s = b->Init(); !s.ok()) return s;
  }
  c.Fill(in.host());
  std::vector<uint8_t> pristine(in.host(), in.host() + c.in_count() * DTypeSize(plan.dtype));
  auto refill = [&]() -> absl::Status {
    if (!c.in_place()) return absl::OkStatus();
    std::memcpy(in.host(), pristine.data(), pristine.size());
    return in.Upload();
  };
  if (absl::Status s = in.Upload(); !s.ok()) return s;

  // The checked run: every rank learns whether any rank got a wrong result.
  if (absl::Status s = Wait(Issue(comm, op, in, &out), name.c_str()); !s.ok()) return s;
  Buffer& result = c.in_place() ? in : out;
  if (absl::Status s = result.Download(); !s.ok()) return s;
  if (comm.rank() == a.inject_corruption) {
    const size_t i = (c.in_place() ? c.in_count() : c.out_count()) / 2;
    StoreValue(plan.dtype, result.host(), i, Load(plan.dtype, result.host(), i) + 1);
  }
  std::string first;
  const size_t bad = c.Check(result.host(), &first);
  std::vector<double> bad_by_rank(n, 0);
  bad_by_rank[comm.rank()] = static_cast<double>(bad);
  auto bad_all = OverAllRanks(comm, bad_by_rank, ReduceOp::kSum, dev);
  if (!bad_all.ok()) return bad_all.status();
  std::vector<std::string> wrong;
  for (int r = 0; r < n; ++r) {
    if ((*bad_all)[r] <= 0) continue;
    wrong.push_back(absl::StrFormat("rank %d: %.0f wrong element(s)%s", r, (*bad_all)[r],
                                    r == comm.rank() ? absl::StrCat(" (first: ", first, ")") : ""));
  }
  if (!wrong.empty()) {
    return absl::DataLossError(absl::StrCat(name, ": wrong result: ", absl::StrJoin(wrong, "; ")));
  }

  for (int i = 0; i < a.warmup; ++i) {
    if (absl::Status s = refill(); !s.ok()) return s;
    if (absl::Status s = Wait(Issue(comm, op, in, &out), name.c_str()); !s.ok()) return s;
  }
  std::vector<double> us;
  for (int i = 0; i < a.iters; ++i) {
    if (absl::Status s = refill(); !s.ok()) return s;
    // Ranks start together, so a time is the collective's, not a late peer's arrival.
    if (absl::Status s = Wait(comm.Barrier(), "barrier"); !s.ok()) return s;
    const auto t0 = Clock::now();
    if (absl::Status s = Wait(Issue(comm, op, in, &out), name.c_str()); !s.ok()) return s;
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  // An op is done when its last rank is: the slowest rank's time per iteration.
  auto slowest = OverAllRanks(comm, us, ReduceOp::kMax, dev);
  if (!slowest.ok()) return slowest.status();
  Row row;
  row.op = op;
  row.count = c.size_count();
  row.bytes = c.size_count() * DTypeSize(plan.dtype);
  row.us = diag::Summarize(*slowest);
  row.algbw = diag::BandwidthGBps(static_cast<double>(row.bytes), row.us.median / 1e6);
  row.busbw = row.algbw * diag::BusBandwidthFactor(op, n);
  return row;
}

// ---- memory: a size whose buffers this host cannot hold is a bad argument ----

// Marks a rank's error as a size refused for want of memory (exit 2, not a failed run).
constexpr char kSizeRefusedPayload[] = "adaptcomm.bench/size-refused";

absl::Status SizeRefused(const std::string& message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kSizeRefusedPayload, absl::Cord());
  return s;
}

bool IsSizeRefused(const absl::Status& s) { return s.GetPayload(kSizeRefusedPayload).has_value(); }

// Inputs of the last ops the library keeps while retries are on (ReplayLog's depth).
constexpr int kRetryInputRecords = 4;

struct HostMemory {
  double bytes = 0;
  std::string source;
};

// What this host can still give: MemAvailable, else its physical memory.
HostMemory AvailableHostMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, rest;
  uint64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return {kib * 1024.0, "MemAvailable in /proc/meminfo"};
    std::getline(meminfo, rest);
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return {HUGE_VAL, "unknown"};
  return {static_cast<double>(pages) * static_cast<double>(page), "physical memory"};
}

std::string GiB(double bytes) { return absl::StrFormat("%.1f GiB", bytes / (1ull << 30)); }

// Before any buffer exists: the host memory one rank needs for the plan's largest case (input,
// output and the pristine copy of the input; while retries are on, the library's copies of the
// input too), times the ranks on this host, must be available. Every rank learns whether any
// rank is short, so all refuse together and none waits for a rank that left.
absl::Status CheckHostMemory(Communicator& comm, const Plan& plan, const DeviceContext* dev) {
  const bool retries = comm.config().retry.max_attempts > 1;
  const double elem = DTypeSize(plan.dtype);
  double per_rank = 0;
  uint64_t largest = 0;
  for (OpKind op : plan.ops) {
    for (uint64_t bytes : plan.sizes) {
      const Case c(op, bytes, comm.rank(), comm.size(), plan.dtype);
      const double in = static_cast<double>(c.in_count()) * elem;
      const double out = static_cast<double>(std::max<size_t>(1, c.out_count())) * elem;
      const double need = 2 * in + out + (retries ? kRetryInputRecords * in : 0);
      if (need > per_rank) {
        per_rank = need;
        largest = bytes;
      }
    }
  }
  const double need = per_rank * plan.ranks_on_host;
  const HostMemory available = AvailableHostMemory();
  const bool short_here = need > available.bytes;
  std::vector<double> short_by_rank(comm.size(), 0);
  short_by_rank[comm.rank()] = short_here ? 1 : 0;
  auto short_all = OverAllRanks(comm, short_by_rank, ReduceOp::kSum, dev);
  if (!short_all.ok()) return short_all.status();
  if (short_here) {
    return SizeRefused(absl::StrFormat(
        "--sizes: %s does not fit in memory: %d rank(s) on this host need %s for it (per rank: "
        "input, output and a pristine copy of the input%s), more than the %s available (%s)",
        ByteSizeText(largest), plan.ranks_on_host, GiB(need),
        retries ? absl::StrCat(", and up to ", kRetryInputRecords,
                               " copies of the input kept for retries")
                : "",
        GiB(available.bytes), available.source));
  }
  std::vector<std::string> short_ranks;
  for (int r = 0; r < comm.size(); ++r) {
    if ((*short_all)[r] > 0) short_ranks.push_back(absl::StrCat(r));
  }
  if (short_ranks.empty()) return absl::OkStatus();
  return SizeRefused(absl::StrCat("--sizes: ", ByteSizeText(largest),
                                  " does not fit in the memory of rank(s) ",
                                  absl::StrJoin(short_ranks, ", "), " (see their message)"));
}

absl::Status RunRank(Communicator& comm, const Plan& plan, const BenchArgs& a, RankReport* report) {
  const absl::Duration timeout = absl::Seconds(a.timeout_s);
  DeviceContext dev_ctx;
  const DeviceContext* dev = nullptr;
  if (!comm.capabilities().host_memory) {  // NCCL: CUDA buffers
    auto cuda = cuda::LoadCudaApi();
    if (!cuda.ok()) return cuda.status();
    dev_ctx = {*cuda, DefaultCudaDevice(), timeout};
    if (int rc = dev_ctx.cuda->SetDevice(dev_ctx.device); rc != cuda::kCudaSuccess) {
      return absl::FailedPreconditionError(
          absl::StrCat("cudaSetDevice(", dev_ctx.device, "): ", dev_ctx.cuda->ErrorString(rc)));
    }
    dev = &dev_ctx;
  }
  if (absl::Status s = CheckHostMemory(comm, plan, dev); !s.ok()) return s;
  for (OpKind op : plan.ops) {
    for (uint64_t bytes : plan.sizes) {
      absl::StatusOr<Row> row;
      try {
        row = RunCase(comm, plan, a, op, bytes, dev);
      } catch (const std::bad_alloc&) {  // the check above missed a limit (ulimit -v, a cgroup)
        const HostMemory available = AvailableHostMemory();
        return SizeRefused(absl::StrFormat(
            "--sizes: cannot allocate the buffers of %s %s (std::bad_alloc); memory available: %s "
            "(%s), less any limit on this process",
            OpKindName(op), ByteSizeText(bytes), GiB(available.bytes), available.source));
      }
      if (!row.ok()) return row.status();
      if (report != nullptr) report->rows.push_back(*row);
    }
  }
  if (report != nullptr) {
    report->backend = comm.backend_name();
    report->reason = comm.selection_reason();
  }
  return absl::OkStatus();
}

std::string Render(const BenchArgs& a, const Plan& plan, int world, const RankReport& r) {
  if (a.json) {
    nlohmann::json j;
    j["ok"] = true;
    j["ranks"] = world;
    j["mode"] = a.ranks > 0 ? "threads" : "launched";
    j["backend"] = r.backend;
    j["selection_reason"] = r.reason;
    j["dtype"] = DTypeName(plan.dtype);
    j["iters"] = a.iters;
    j["warmup"] = a.warmup;
    j["verified"] = true;
    j["results"] = nlohmann::json::array();
    for (const Row& row : r.rows) {
      j["results"].push_back({{"op", OpKindName(row.op)},
                              {"bytes", row.bytes},
                              {"count", row.count},
                              {"median_us", row.us.median},
                              {"p10_us", row.us.p10},
                              {"p90_us", row.us.p90},
                              {"min_us", row.us.min},
                              {"max_us", row.us.max},
                              {"algbw_gbps", row.algbw},
                              {"busbw_gbps", row.busbw},
                              {"verified", true}});
    }
    return j.dump(2) + "\n";
  }
  std::string out = absl::StrFormat(
      "adaptcomm bench: %d rank(s) (%s), backend %s, %s, %d warm-up + %d timed iterations; "
      "results checked element by element\n  backend: %s\n",
      world, a.ranks > 0 ? "threads" : "launched", r.backend, DTypeName(plan.dtype), a.warmup,
      a.iters, r.reason);
  absl::StrAppendFormat(&out, "%-15s %9s %11s %11s %11s %11s %11s %11s\n", "op", "size", "count",
                        "median_us", "p10_us", "p90_us", "algbw_GB/s", "busbw_GB/s");
  for (const Row& row : r.rows) {
    absl::StrAppendFormat(&out, "%-15s %9s %11zu %11.1f %11.1f %11.1f %11.3f %11.3f\n",
                          OpKindName(row.op), ByteSizeText(row.bytes), row.count, row.us.median,
                          row.us.p10, row.us.p90, row.algbw, row.busbw);
  }
  out += "(time: slowest rank per iteration; algbw = size / median; busbw per nccl-tests)\n";
  return out;
}

int Fail(const BenchArgs& a, int code, const std::string& message) {
  std::fprintf(stderr, "bench: %s\n", message.c_str());
  if (a.json)
    std::printf("%s\n", nlohmann::json{{"ok", false}, {"error", message}}.dump(2).c_str());
  return code;
}

int RunBench(const BenchArgs& a) {
  auto plan = ParsePlan(a);
  if (!plan.ok()) return Fail(a, 2, std::string(plan.status().message()));
  diag::RankGroupOptions g;
  g.local_ranks = a.ranks;
  plan->ranks_on_host = std::max(1, a.ranks);
  if (a.ranks == 0) {
    auto launch = DetectLaunchEnvironment();
    if (!launch.ok()) {
      return Fail(a, 2,
                  "no launcher environment: pass --ranks N (ranks as threads) or run under "
                  "`adaptcomm launch -n N -- adaptcomm bench`");
    }
    plan->ranks_on_host = std::max(1, launch->local_world_size);
  }
  g.comm.name = "bench";
  g.comm.backend = plan->backend;
  // Asked for NCCL, measure NCCL or fail: numbers of a silent Gloo fallback would mislead.
  if (plan->backend == BackendChoice::kNccl || plan->backend == BackendChoice::kShm) {
    g.comm.fallback = Fallback::kDeny;
  }
  if (!a.model.empty()) g.comm.model_size = a.model;
  g.comm.timeout = absl::Seconds(a.timeout_s);
  g.comm.init_timeout = absl::Seconds(a.timeout_s);
  RankReport report;
  int world = 0;
  std::vector<absl::Status> st = diag::RunRankGroup(g, [&](Communicator& comm) {
    const bool reporter = comm.rank() == 0;
    if (reporter) world = comm.size();
    return RunRank(comm, *plan, a, reporter ? &report : nullptr);
  });
  for (const absl::Status& s : st) {
    if (IsSizeRefused(s)) return Fail(a, 2, std::string(s.message()));
  }
  // A rank that saw wrong elements itself says which one: prefer its report.
  for (const absl::Status& s : st) {
    if (absl::StrContains(s.message(), "(first: ")) return Fail(a, 1, s.ToString());
  }
  if (absl::Status s = diag::FirstError(st); !s.ok()) return Fail(a, 1, s.ToString());
  if (world == 0) return 0;  // a launched rank other than 0: rank 0 reports
  const std::string out = Render(a, *plan, world, report);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

std::function<int()> SetupBench(CLI::App& sub) {
  auto a = std::make_shared<BenchArgs>();
  sub.add_option("--ranks", a->ranks,
                 "Run N ranks as threads of this process over a loopback TCP store (default: be "
                 "one rank of the job started by `adaptcomm launch`)")
      ->check(CLI::Range(1, 1024));
  sub.add_option("--ops", a->ops, "Comma-separated: allreduce,allgather,broadcast,reduce_scatter")
      ->capture_default_str();
  sub.add_option("--sizes", a->sizes,
                 "Comma-separated sizes (bytes; KiB/MiB/GiB or KB/MB/GB), nccl-tests' convention: "
                 "the whole buffer, the gathered/scattered total for allgather/reduce_scatter")
      ->capture_default_str();
  sub.add_option("--iters", a->iters, "Timed iterations per op and size")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  sub.add_option("--warmup", a->warmup, "Untimed iterations after the checked one")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  sub.add_option("--dtype", a->dtype, "f32, bf16 or f16")->capture_default_str();
  sub.add_option("--backend", a->backend, "auto, gloo, nccl or shm")->capture_default_str();
  sub.add_option("--timeout", a->timeout_s, "Bound of creation and of each operation, seconds")
      ->check(DurationSeconds(/*zero_allowed=*/false))
      ->capture_default_str();
  sub.add_option("--model", a->model,
                 "Model size or tier selecting the profile (default: ADAPTCOMM_MODEL_SIZE)");
  sub.add_flag("--json", a->json, "Machine-readable output");
  sub.add_option("--inject-corruption", a->inject_corruption,
                 "RANK - that rank alters one element of each checked result (tests the check: "
                 "the command must fail)");
  sub.footer(
      "Each op and size: one run checked element by element on every rank, --warmup untimed "
      "runs, --iters timed runs (each after a barrier; the slowest rank's time counts).\n"
      "Exit code: 0 ok, 1 a rank failed or a result was wrong, 2 bad arguments.");
  return [a] { return RunBench(*a); };
}

}  // namespace

ADAPTCOMM_SUBCOMMAND(bench, "Measure collectives: latency percentiles, algbw and busbw",
                     SetupBench);

}  // namespace adaptcomm::tools

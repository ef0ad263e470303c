// GradientBucketer's registration checks (bucketer_registration.h).
#include "lib/precision/bucketer_registration.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace adaptcomm::bucketer {
namespace {

constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void Mix(uint64_t& h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= kFnvPrime;
  }
}

}  // namespace

int64_t TensorCode(const GradientSpec& s) {
  return static_cast<int64_t>(static_cast<uint64_t>(s.dtype) |
                              (static_cast<uint64_t>(s.device.type) << 8) |
                              (static_cast<uint64_t>(s.device.index + 1) << 16));
}

std::string DescribeTensor(int64_t count, int64_t code) {
  const auto dtype = static_cast<DType>(code & 0xff);
  const auto type = static_cast<DeviceType>((code >> 8) & 0xff);
  const int64_t index = (code >> 16) - 1;
  return absl::StrCat(count, " x ", DTypeName(dtype), " on ",
                      type == DeviceType::kCuda ? absl::StrCat("cuda:", index) : "cpu");
}

absl::Status ValidateOptions(const std::vector<GradientSpec>& specs, const BucketerOptions& o,
                             const Communicator& comm) {
  const Capabilities caps = comm.capabilities();
  if (!caps.host_memory && o.wire != DType::kF32) {
    return absl::UnimplementedError(absl::StrCat("gradient bucketer: a ", DTypeName(o.wire),
                                                 " wire on a backend that takes device memory "
                                                 "only (",
                                                 comm.backend_name(),
                                                 ") is not supported yet; use wire f32"));
  }
  if (o.bucket_bytes.has_value() && *o.bucket_bytes == 0) {
    return absl::InvalidArgumentError("gradient bucketer: bucket_bytes must be positive");
  }
  if (o.timeout.has_value() && *o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient bucketer: timeout must be positive, got ", absl::FormatDuration(*o.timeout)));
  }
  if (o.wire != DType::kF32 && o.wire != DType::kBF16 && o.wire != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient bucketer: wire must be f32, bf16 or f16, not ", DTypeName(o.wire)));
  }
  if (o.wire != DType::kF32 && o.op == ReduceOp::kProd) {
    return absl::InvalidArgumentError(
        "gradient bucketer: a bf16/f16 wire takes sum, avg, min or max, not prod");
  }
  const GradientSpec* first_cuda = nullptr;
  for (size_t i = 0; i < specs.size(); ++i) {
    const GradientSpec& s = specs[i];
    const std::string who = absl::StrCat("gradient bucketer: tensor ", i, " (", s.name, ")");
    if (s.count == 0) return absl::InvalidArgumentError(absl::StrCat(who, " has no elements"));
    if (o.op == ReduceOp::kAvg && !IsFloatingPoint(s.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, " is ", DTypeName(s.dtype), ": avg needs a floating-point dtype"));
    }
    if (s.device.is_cuda() && !caps.device_memory) {
      return absl::UnimplementedError(absl::StrCat(
          who, " is on cuda:", s.device.index,
          " but the communicator's backend takes host memory only (NCCL takes CUDA tensors)"));
    }
    if (!s.device.is_cuda() && !caps.host_memory) {
      return absl::UnimplementedError(
          absl::StrCat(who, " is host memory but the communicator's backend (", comm.backend_name(),
                       ") takes device memory only"));
    }
    if (s.device.is_cuda() && first_cuda == nullptr) first_cuda = &s;
    if (s.device.is_cuda() && s.device.index != first_cuda->device.index) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, " is on cuda:", s.device.index, " but ", first_cuda->name,
          " on cuda:", first_cuda->device.index, ": a rank's tensors must be on one device"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSameOnEveryRank(Communicator& comm, const std::vector<GradientSpec>& specs,
                                  const BucketerOptions& o, size_t bucket_bytes, bool fuse_cuda,
                                  const Gather& gather) {
  const int world = comm.size();
  if (world == 1) return absl::OkStatus();
  const int64_t header = static_cast<int64_t>(
      static_cast<uint64_t>(o.op) | (static_cast<uint64_t>(o.wire) << 8) |
      (static_cast<uint64_t>(o.unused) << 16) | (static_cast<uint64_t>(fuse_cuda) << 24));
  uint64_t digest = kFnvOffset;
  Mix(digest, static_cast<uint64_t>(header));
  Mix(digest, bucket_bytes);
  Mix(digest, o.direct_bytes);
  for (const GradientSpec& s : specs) {
    Mix(digest, s.count);
    Mix(digest, static_cast<uint64_t>(TensorCode(s)));
  }
  std::vector<int64_t> mine = {static_cast<int64_t>(specs.size()), static_cast<int64_t>(digest)};
  std::vector<int64_t> all(2 * static_cast<size_t>(world));
  absl::Status s = gather(mine.data(), mine.size(), all.data());
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("gradient bucketer: comparing the registrations: ", s.message()));
  }
  int64_t max_n = 0;
  bool same = true;
  for (int r = 0; r < world; ++r) {
    max_n = std::max(max_n, all[2 * r]);
    same = same && all[2 * r] == all[0] && all[2 * r + 1] == all[1];
  }
  if (same) return absl::OkStatus();
  // Record: n, bucket bytes, direct bytes, header, then (count, code) per tensor, padded with -1.
  constexpr size_t kHead = 4;
  const size_t width = kHead + 2 * static_cast<size_t>(max_n);
  std::vector<int64_t> rec(width, -1);
  rec[0] = static_cast<int64_t>(specs.size());
  rec[1] = static_cast<int64_t>(bucket_bytes);
  rec[2] = static_cast<int64_t>(o.direct_bytes);
  rec[3] = header;
  for (size_t i = 0; i < specs.size(); ++i) {
    rec[kHead + 2 * i] = static_cast<int64_t>(specs[i].count);
    rec[kHead + 1 + 2 * i] = TensorCode(specs[i]);
  }
  std::vector<int64_t> recs(width * world);
  s = gather(rec.data(), rec.size(), recs.data());
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("gradient bucketer: comparing the registrations: ", s.message()));
  }
  const int64_t* zero = recs.data();
  for (int r = 1; r < world; ++r) {
    const int64_t* other = recs.data() + width * r;
    if (std::equal(zero, zero + width, other)) continue;
    std::string what;
    if (!std::equal(zero + 1, zero + kHead, other + 1)) {
      what = absl::StrCat("its options differ (bucket bytes ", other[1], " vs ", zero[1],
                          "; direct bytes ", other[2], " vs ", zero[2], "; op/wire/unused code ",
                          other[3], " vs ", zero[3], ")");
    } else {
      const int64_t n = std::min(zero[0], other[0]);
      int64_t i = 0;
      auto count = [](const int64_t* r, int64_t t) { return r[kHead + 2 * t]; };
      auto code = [](const int64_t* r, int64_t t) { return r[kHead + 1 + 2 * t]; };
      while (i < n && count(zero, i) == count(other, i) && code(zero, i) == code(other, i)) ++i;
      const std::string name =
          i < static_cast<int64_t>(specs.size()) ? absl::StrCat(" (", specs[i].name, " here)") : "";
      if (i < n) {
        what = absl::StrCat("tensor ", i, name, " is ",
                            DescribeTensor(count(other, i), code(other, i)), " on rank ", r,
                            " but ", DescribeTensor(count(zero, i), code(zero, i)), " on rank 0");
      } else {
        what = absl::StrCat("rank ", r, " registers ", other[0], " tensors and rank 0 ", zero[0],
                            "; the first tensor only one of them has is tensor ", i, name);
      }
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "gradient bucketer: rank ", r, "'s registration differs from rank 0's: ", what));
  }
  return absl::FailedPreconditionError(
      "gradient bucketer: the registration digests differ but the registrations do not");
}

}  // namespace adaptcomm::bucketer

// Built with -O3 (lib/shm/CMakeLists.txt): GCC 12's -O2 cost model leaves these loops scalar.
#include "lib/shm/shm_reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lib/base/cast_kernels.h"
#include "lib/base/elementwise.h"

namespace adaptcomm::shm {
namespace {

using elementwise::MaxOp;
using elementwise::MinOp;
using elementwise::ProdOp;
using elementwise::SumOp;

template <typename T, typename Op>
void InPlace(T* __restrict o, const T* __restrict y, size_t m) {
  for (size_t i = 0; i < m; ++i) o[i] = Op::Apply(o[i], y[i]);
}
template <typename T, typename Op>
void Distinct(T* __restrict o, const T* __restrict x, const T* __restrict y, size_t m) {
  for (size_t i = 0; i < m; ++i) o[i] = Op::Apply(x[i], y[i]);
}

template <typename T, typename Op, bool kAvg>
void ReduceNative(const void* const* srcs, int n, void* out, size_t count, void* second_out) {
  T* o = static_cast<T*>(out);
  T* o2 = static_cast<T*>(second_out);
  auto src = [srcs](int j, size_t i) { return static_cast<const T*>(srcs[j]) + i; };
  // Each block is reduced in an L1-resident buffer and then stored: `out` may be any source.
  constexpr size_t kBlock = (16u << 10) / sizeof(T);
  alignas(64) T acc[kBlock];
  for (size_t i = 0; i < count; i += kBlock) {
    const size_t m = std::min(kBlock, count - i);
    if (n == 1) {
      std::memcpy(acc, src(0, i), m * sizeof(T));
    } else {
      Distinct<T, Op>(acc, src(0, i), src(1, i), m);
    }
    for (int j = 2; j < n; ++j) InPlace<T, Op>(acc, src(j, i), m);
    if constexpr (kAvg) {
      const T d = static_cast<T>(n);
      for (size_t k = 0; k < m; ++k) acc[k] = acc[k] / d;
    }
    std::memcpy(o + i, acc, m * sizeof(T));
    if (o2 != nullptr) std::memcpy(o2 + i, acc, m * sizeof(T));
  }
}

template <bool kBF16, typename Op, bool kAvg>
void Reduce16(const void* const* srcs, int n, void* out, size_t count, void* second_out) {
  namespace p = ::adaptcomm::precision;
  const p::CastPath path = p::ActiveCastPath();
  constexpr bool kSum = std::is_same_v<Op, SumOp>;
  auto widen = [path](const uint16_t* s, float* d, size_t m) {
    if constexpr (kBF16) {
      (void)p::BF16ToF32(path, s, d, m);
    } else {
      (void)p::F16ToF32(path, s, d, m);
    }
  };
  uint16_t* o = static_cast<uint16_t*>(out);
  uint16_t* o2 = static_cast<uint16_t*>(second_out);
  auto src = [srcs](int j, size_t i) { return static_cast<const uint16_t*>(srcs[j]) + i; };
  constexpr size_t kBlock = 2048;
  alignas(64) float acc[kBlock];
  alignas(64) float tmp[kBlock];
  for (size_t i = 0; i < count; i += kBlock) {
    const size_t m = std::min(kBlock, count - i);
    widen(src(0, i), acc, m);
    for (int j = 1; j < n; ++j) {
      if constexpr (kSum && kBF16) {
        p::AccumulateBF16(path, src(j, i), acc, m);
      } else if constexpr (kSum) {
        p::AccumulateF16(path, src(j, i), acc, m);
      } else {
        widen(src(j, i), tmp, m);
        InPlace<float, Op>(acc, tmp, m);
      }
    }
    if constexpr (kAvg) {
      const float d = static_cast<float>(n);
      for (size_t k = 0; k < m; ++k) acc[k] = acc[k] / d;
    }
    if constexpr (kBF16) {
      (void)p::F32ToBF16(path, acc, o + i, m);
    } else {
      (void)p::F32ToF16(path, acc, o + i, m);
    }
    if (o2 != nullptr) std::memcpy(o2 + i, o + i, m * sizeof(uint16_t));
  }
}

using Kernel = void (*)(const void* const*, int, void*, size_t, void*);

template <typename T>
Kernel NativeFor(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return &ReduceNative<T, SumOp, false>;
    case ReduceOp::kAvg:
      if constexpr (std::is_floating_point_v<T>) return &ReduceNative<T, SumOp, true>;
      return nullptr;
    case ReduceOp::kProd:
      return &ReduceNative<T, ProdOp, false>;
    case ReduceOp::kMin:
      return &ReduceNative<T, MinOp, false>;
    case ReduceOp::kMax:
      return &ReduceNative<T, MaxOp, false>;
  }
  return nullptr;
}

template <bool kBF16>
Kernel SixteenFor(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return &Reduce16<kBF16, SumOp, false>;
    case ReduceOp::kAvg:
      return &Reduce16<kBF16, SumOp, true>;
    case ReduceOp::kProd:
      return &Reduce16<kBF16, ProdOp, false>;
    case ReduceOp::kMin:
      return &Reduce16<kBF16, MinOp, false>;
    case ReduceOp::kMax:
      return &Reduce16<kBF16, MaxOp, false>;
  }
  return nullptr;
}

Kernel KernelFor(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF32:
      return NativeFor<float>(op);
    case DType::kF64:
      return NativeFor<double>(op);
    case DType::kF16:
      return SixteenFor<false>(op);
    case DType::kBF16:
      return SixteenFor<true>(op);
    case DType::kI8:
      return NativeFor<int8_t>(op);
    case DType::kU8:
      return NativeFor<uint8_t>(op);
    case DType::kI32:
      return NativeFor<int32_t>(op);
    case DType::kI64:
      return NativeFor<int64_t>(op);
  }
  return nullptr;
}

}  // namespace

bool CanReduce(DType dtype, ReduceOp op) { return KernelFor(dtype, op) != nullptr; }

void ReduceSlots(DType dtype, ReduceOp op, const void* const* srcs, int n, void* out, size_t count,
                 void* second_out) {
  if (count == 0) return;
  KernelFor(dtype, op)(srcs, n, out, count, second_out);
}

}  // namespace adaptcomm::shm

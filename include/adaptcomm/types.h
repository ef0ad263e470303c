// Element types, reduction operators, the kinds of operation and the non-owning TensorView that
// every collective takes.
//
// Compiles as C++17: trainers include it. No CUDA header is needed: a CUDA stream travels as an
// opaque pointer (cudaStream_t is itself a pointer type).
#ifndef ADAPTCOMM_TYPES_H_
#define ADAPTCOMM_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "adaptcomm/export.h"

namespace adaptcomm {

enum class DType : uint8_t { kF32, kF64, kF16, kBF16, kI8, kU8, kI32, kI64 };
inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                       DType::kI8,  DType::kU8,  DType::kI32, DType::kI64};

// Size of one element in bytes.
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI8:
    case DType::kU8:
      return 1;
  }
  return 0;
}
constexpr bool IsFloatingPoint(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16;
}
ADAPTCOMM_EXPORT const char* DTypeName(DType t);  // "f32", "bf16", ...

// kAvg is defined for floating-point types only (sum, then scale by 1/world_size in the element
// type); integer averages would silently truncate, so they are refused with InvalidArgument.
enum class ReduceOp : uint8_t { kSum, kProd, kMin, kMax, kAvg };
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kAvg};
ADAPTCOMM_EXPORT const char* ReduceOpName(ReduceOp op);  // "sum", "avg", ...

// The operations a communicator runs (a hook's HookInfo::op, a backend's OpDesc::kind).
enum class OpKind : uint8_t {
  kAllreduce,
  kBroadcast,
  kReduce,
  kAllgather,
  kReduceScatter,
  kAlltoall,
  kBarrier,
  kSend,
  kRecv,
};
ADAPTCOMM_EXPORT const char* OpKindName(OpKind kind);  // "allreduce", "reduce_scatter", ...

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = -1;  // CUDA ordinal; -1 on the CPU.

  static constexpr Device Cpu() { return Device{}; }
  static constexpr Device Cuda(int ordinal) { return Device{DeviceType::kCuda, ordinal}; }
  constexpr bool is_cuda() const { return type == DeviceType::kCuda; }
};

// A view of `count` elements of `dtype` at `data`. It does not own the memory.
// REQUIRES: the memory stays valid and untouched by the caller until the Work of every
// collective using it has completed (Work::Wait returned or state() is terminal).
struct TensorView {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  Device device = Device::Cpu();
  // A cudaStream_t when device is CUDA (nullptr = the legacy default stream); ignored on the CPU.
  void* stream = nullptr;

  constexpr size_t bytes() const { return count * DTypeSize(dtype); }
};

namespace internal {
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kF64;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kI8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};
}  // namespace internal

// View of a host array of a C++ arithmetic type (f16/bf16 have no C++ type here: build the
// TensorView by hand with uint16_t storage).
template <typename T>
TensorView HostView(T* data, size_t count) {
  return TensorView{data, count, internal::DTypeOf<T>::value, Device::Cpu(), nullptr};
}

}  // namespace adaptcomm

#endif  // ADAPTCOMM_TYPES_H_

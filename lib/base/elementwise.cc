#include "lib/base/elementwise.h"

#include <cstdint>

#include "absl/base/casts.h"
#include "lib/base/cast_bits.h"

namespace adaptcomm::elementwise {
namespace {

template <typename T>
void DivideNative(void* data, size_t n, int divisor) {
  T* p = static_cast<T*>(data);
  const T d = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
}

template <uint32_t (*Widen)(uint16_t), uint16_t (*Narrow)(uint32_t)>
void Divide16(void* data, size_t n, int divisor) {
  uint16_t* p = static_cast<uint16_t*>(data);
  const float d = static_cast<float>(divisor);
  for (size_t i = 0; i < n; ++i) {
    p[i] = Narrow(absl::bit_cast<uint32_t>(absl::bit_cast<float>(Widen(p[i])) / d));
  }
}

}  // namespace

void DivideInPlace(DType dtype, void* data, size_t n, int divisor) {
  namespace bits = precision::bits;
  if (divisor == 1) return;
  switch (dtype) {
    case DType::kF32:
      return DivideNative<float>(data, n, divisor);
    case DType::kF64:
      return DivideNative<double>(data, n, divisor);
    case DType::kF16:
      return Divide16<bits::F16ToF32, bits::F32ToF16>(data, n, divisor);
    case DType::kBF16:
      return Divide16<bits::BF16ToF32, bits::F32ToBF16>(data, n, divisor);
    case DType::kI8:
    case DType::kU8:
    case DType::kI32:
    case DType::kI64:
      return;
  }
}

}  // namespace adaptcomm::elementwise

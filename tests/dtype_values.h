// Reading and writing one element of any DType as a double: what reference checks in tests and
// the GPU check need (f16/bf16 through the library's own round-to-nearest-even conversions).
#ifndef ADAPTCOMM_TESTS_DTYPE_VALUES_H_
#define ADAPTCOMM_TESTS_DTYPE_VALUES_H_

#include <cstdint>
#include <cstring>

#include "adaptcomm/types.h"
#include "lib/gloo/gloo_reduce.h"

namespace adaptcomm::testing {

inline void StoreAs(DType t, double v, void* p) {
  auto put = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
  switch (t) {
    case DType::kF32:
      put(static_cast<float>(v));
      break;
    case DType::kF64:
      put(v);
      break;
    case DType::kF16:
      put(gloo_backend::FloatToHalf(static_cast<float>(v)));
      break;
    case DType::kBF16:
      put(gloo_backend::FloatToBf16(static_cast<float>(v)));
      break;
    case DType::kI8:
      put(static_cast<int8_t>(v));
      break;
    case DType::kU8:
      put(static_cast<uint8_t>(v));
      break;
    case DType::kI32:
      put(static_cast<int32_t>(v));
      break;
    case DType::kI64:
      put(static_cast<int64_t>(v));
      break;
  }
}

inline double LoadAs(DType t, const void* p) {
  auto get = [p](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (t) {
    case DType::kF32:
      return get(float{});
    case DType::kF64:
      return get(double{});
    case DType::kF16:
      return gloo_backend::HalfToFloat(get(uint16_t{}));
    case DType::kBF16:
      return gloo_backend::Bf16ToFloat(get(uint16_t{}));
    case DType::kI8:
      return get(int8_t{});
    case DType::kU8:
      return get(uint8_t{});
    case DType::kI32:
      return get(int32_t{});
    case DType::kI64:
      return static_cast<double>(get(int64_t{}));
  }
  return 0;
}

// The value `v` as the dtype holds it (rounded for the floating types).
inline double RoundTo(DType t, double v) {
  unsigned char bytes[8];
  StoreAs(t, v, bytes);
  return LoadAs(t, bytes);
}

// One step of a reference reduction (avg accumulates as a sum; the caller divides).
inline double Combine(ReduceOp op, double acc, double v) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return acc + v;
    case ReduceOp::kProd:
      return acc * v;
    case ReduceOp::kMin:
      return acc < v ? acc : v;
    case ReduceOp::kMax:
      return acc > v ? acc : v;
  }
  return acc;
}

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_DTYPE_VALUES_H_

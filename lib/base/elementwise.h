// Element-wise combine operations of the reductions, and the avg's division, shared by every host
// backend so that all give the same bits: integers wrap (two's complement, through the unsigned
// type: signed overflow would be undefined; NCCL gives the wrapped result too), floats combine in
// their own type, f16/bf16 divide through float and round to nearest even.
#ifndef ADAPTCOMM_LIB_BASE_ELEMENTWISE_H_
#define ADAPTCOMM_LIB_BASE_ELEMENTWISE_H_

#include <cstddef>
#include <type_traits>

#include "adaptcomm/types.h"

namespace adaptcomm::elementwise {

struct SumOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct ProdOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      // uint8 promotes to int (255*255 fits); wider types multiply as unsigned.
      using U =
          std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};
struct MinOp {
  template <typename T>
  static T Apply(T a, T b) {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <typename T>
  static T Apply(T a, T b) {
    return a < b ? b : a;
  }
};

// data[i] /= divisor in the element type's precision (f16/bf16: in float, rounded back): the avg
// after a sum. Floating-point dtypes only; a no-op for integer dtypes (avg is refused for them).
void DivideInPlace(DType dtype, void* data, size_t n, int divisor);

}  // namespace adaptcomm::elementwise

#endif  // ADAPTCOMM_LIB_BASE_ELEMENTWISE_H_

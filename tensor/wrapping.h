#pragma once
// Two's-complement wrap-around for integer arithmetic, as PyTorch (and the hardware) give it,
// without the undefined behaviour of signed overflow: the operation runs on the unsigned type.
#include <type_traits>

#include "tensor/half.h"  // FRUGAL_HD

namespace frugal::ops::math {

template <typename T>
FRUGAL_HD T wrapping_neg(T x) {
  using U = std::make_unsigned_t<T>;
  return T(U(0) - U(x));
}
template <typename T>
FRUGAL_HD T wrapping_add(T x, T y) {
  using U = std::make_unsigned_t<T>;
  return T(U(x) + U(y));
}
template <typename T>
FRUGAL_HD T wrapping_mul(T x, T y) {
  using U = std::make_unsigned_t<T>;
  return T(U(x) * U(y));
}

}  // namespace frugal::ops::math

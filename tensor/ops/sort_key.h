#pragma once
// Note [Sort keys]
// The sort kernels order unsigned integer keys whose integer order is Note [Sort order]'s
// (tensor/ops/sort.h): a float's bits with the sign bit flipped (negative values: every bit
// flipped), NaN the largest key, -0 the key of +0; an integer with its sign bit flipped; 16-bit
// types through float. Descending complements the keys. Sorting (key, index) pairs by key, then
// index, gives the one order every backend must give, with integer comparisons only. Host and
// device code (FRUGAL_HD), so the CPU and CUDA kernels share the definition.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tensor/half.h"

namespace frugal::ops {

/// The unsigned key type of T: 64 bits for 8-byte types, 32 for the others.
template <typename T>
using SortKey = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;

/// x's key in ascending (or, complemented, descending) order: Note [Sort keys].
template <typename T>
FRUGAL_HD SortKey<T> sort_key(T x, bool descending) {
  SortKey<T> key;
  if constexpr (std::is_same_v<T, int32_t>) {
    key = uint32_t(x) ^ 0x80000000u;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    key = uint64_t(x) ^ 0x8000000000000000ull;
  } else {
    using F = std::conditional_t<std::is_same_v<T, double>, double, float>;
    constexpr SortKey<T> kSign = SortKey<T>(1) << (8 * sizeof(SortKey<T>) - 1);
    const F f = F(x);
    if (f != f) {
      key = ~SortKey<T>(0);  // NaN above everything
    } else {
      const F nonzero = f == F(0) ? F(0) : f;  // -0 sorts as +0
      SortKey<T> bits;
      memcpy(&bits, &nonzero, sizeof(bits));
      key = (bits & kSign) ? SortKey<T>(~bits) : SortKey<T>(bits | kSign);
    }
  }
  return descending ? SortKey<T>(~key) : key;
}

}  // namespace frugal::ops

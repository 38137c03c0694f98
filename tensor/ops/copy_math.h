#pragma once
// The element conversion of copy_ (contiguous(), to(), tolist()), shared by the CPU and
// CUDA copy kernels (see Note [One formula, two backends] in unary_math.h).
//
// Note [Float to integer conversion]
// C++ leaves a float-to-integer conversion undefined when the value is NaN or outside the
// integer type's range. PyTorch inherits the hardware's answer: INT_MIN on x86 (the
// "integer indefinite" of cvttss2si) for all of them, saturation on CUDA (cvt.rzi), NaN to
// 0. frugal defines one answer for both of its backends, CUDA's: values truncate toward
// zero and saturate at the type's limits (+-inf included), and NaN gives 0. A label tensor
// cast from float then holds the nearest representable class, never a wrapped-around one,
// and the CPU is a reference the CUDA kernels can be compared with bit for bit.
#include <limits>
#include <type_traits>

#include "tensor/half.h"

namespace frugal::ops {

// Note [Same-dtype copies keep the bits]
// A copy between equal dtypes copies the element's bits, whatever the layouts, as the
// contiguous fast path (a memcpy) does and as PyTorch's direct_copy_kernel does. It must not
// go through opmath_t: float16 -> float -> float16 re-encodes every NaN as 0x7e00 and
// bfloat16 sets a signalling NaN's quiet bit, so contiguous() or clone() of a transposed
// 16-bit tensor, or a checkpoint saved from one, would differ from it in its NaN payloads.

/// v (storage type S) converted to D as copy_ converts it: the same bits when D is S (Note
/// [Same-dtype copies keep the bits]), bool is v != 0, a floating value into an integer type
/// saturates (Note [Float to integer conversion]), anything else is the C++ conversion through
/// opmath_t<S> (float64 -> float16/bfloat16 thus rounds through float32, as PyTorch's
/// c10::Half(float) does).
template <typename D, typename S>
FRUGAL_HD D convert_element(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (std::is_same_v<D, bool>) {
    return static_cast<double>(v) != 0.0;
  } else if constexpr (std::is_integral_v<D> && !std::is_integral_v<S> && !std::is_same_v<S, bool>) {
    static_assert(std::is_signed_v<D>, "convert_element: integer targets are int32/int64");
    // In double, so the bounds are exact: -2^(bits-1) is representable and 2^(bits-1) is the
    // first value past the largest.
    const double x = static_cast<double>(static_cast<opmath_t<S>>(v));
    constexpr double lo = double(std::numeric_limits<D>::lowest());
    constexpr double hi = -lo;  // 2^(bits-1)
    if (!(x == x)) return D(0);
    if (x <= lo) return std::numeric_limits<D>::lowest();
    if (x >= hi) return std::numeric_limits<D>::max();
    return D(x);
  } else {
    return D(static_cast<opmath_t<S>>(v));
  }
}

}  // namespace frugal::ops

#pragma once
#include "tensor/tensor.h"

namespace frugal::ops {

// Note [Integer fill values]
// Converting a double that is NaN, infinite or outside an integer type's range to that type
// is undefined behaviour in C++ (x86 gives INT_MIN, CUDA saturates). PyTorch refuses such a
// value in fill_, full and masked_fill ("value cannot be converted to type int without
// overflow"), and so does frugal: a value for an int32/int64 tensor must be finite and lie
// in the dtype's range; a fraction is truncated toward zero, as PyTorch does. Floating
// dtypes take any value (one beyond float16's range rounds to inf, which PyTorch refuses:
// the IEEE rounding, and a mask is -inf or the finite extreme anyway); bool takes value != 0.

/// Throws frugal::Error, naming `op` and `t`, unless `value` may fill t (see Note [Integer
/// fill values]).
void check_fill_value(const char* op, double value, const Tensor& t);

/// Sets every element of t (any strides) to value, converted to t's dtype (an integer dtype
/// must hold it: Note [Integer fill values]). Bumps the version.
void fill_(const Tensor& t, double value);
/// fill_(t, 0)
void zero_(const Tensor& t);
/// Sets element i of the contiguous 1-D t to start + i * step, computed in double and
/// converted to t's dtype as fill_ converts (an integer t must hold its first and last
/// values; integral start and step are computed in int64: Note [Integer arange]). Bumps the
/// version.
void arange_fill_(const Tensor& t, double start, double step);

// Note [Integer arange]
// start + i * step in double is exact only below 2^53: arange(2^53, 2^53 + 4) in int64 would
// give 2^53, 2^53, 2^53 + 2, 2^53 + 4. PyTorch computes an integer arange in int64, and so do
// both kernels when start and step are whole numbers of int64's range (then every value is, and
// arange_fill_ has checked that the first and last fit).
inline bool integral_arange(double start, double step) {
  auto whole = [](double v) {
    return v >= -9223372036854775808.0 && v < 9223372036854775808.0 && v == double(int64_t(v));
  };
  return whole(start) && whole(step);
}

}  // namespace frugal::ops

namespace frugal::ops::cpu {
void fill_kernel(const Tensor& t, double value);
void arange_fill_kernel(const Tensor& t, double start, double step);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void fill_kernel(const Tensor& t, double value);
void arange_fill_kernel(const Tensor& t, double start, double step);
}  // namespace frugal::ops::cuda

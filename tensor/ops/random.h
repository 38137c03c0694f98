#pragma once
// In-place random fills over the Philox stream (see Note [Counter-based RNG]).
// Element i of t (in row-major order) draws from counter first + i / 4, word i % 4,
// on the CPU and on CUDA alike.
#include <limits>

#include "tensor/philox.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal::ops {

// Note [Random bounds in the dtype]
// uniform_(low, high) promises values in [low, high) of the tensor's dtype, but a draw in
// [low, high) rounded to float16, bfloat16 or a coarse float32 range can land on high (rand
// in float16 gave 1.0 once in 4096 draws; uniform_(1e6, 1e6 + 1) in float32 once in 32), or
// below a low the dtype does not hold (0.1 in float16). So every stored value is clamped
// to [lowest value of the dtype >= low, highest < high]; where the dtype holds none (low ==
// high, or a range narrower than one step), the nearest value is stored as rounded. Bounds
// that are not finite, or lie outside the dtype's finite range, are refused (as PyTorch's
// uniform_ does: "to is out of bounds for Half"), and so is a range whose width overflows
// a double: they gave inf or NaN. randint refuses bounds the dtype cannot hold exactly
// (PyTorch: "to - 1 is out of bounds for int"): int32 would wrap, and a floating dtype past
// 2^digits (2048 for float16) would round onto high or off the integers (PyTorch only warns).

/// Uniform in [low, high), as the tensor's dtype holds it (Note [Random bounds in the dtype]).
void uniform_(const Tensor& t, double low, double high, Generator* gen = nullptr);
void normal_(const Tensor& t, double mean, double std, Generator* gen = nullptr);
/// Integers uniform in [low, high), any int64 bounds with low < high that t's dtype holds
/// exactly (Note [Random integers] in tensor/philox.h).
void random_int_(const Tensor& t, int64_t low, int64_t high, Generator* gen = nullptr);

}  // namespace frugal::ops

namespace frugal::ops {
enum class RandomKind { Uniform, Normal, Integer };
/// Parameters of one random fill: a = low/mean, b = high/std.
struct RandomFill {
  RandomKind kind;
  double a, b;
  Generator::Range range;
  /// Uniform: what a stored value is clamped to, values of the target's dtype (Note [Random
  /// bounds in the dtype]); -inf and inf when no clamp applies.
  double lo_in_dtype = -std::numeric_limits<double>::infinity();
  double hi_in_dtype = std::numeric_limits<double>::infinity();
  /// Integer: low and span = high - low (Note [Random integers]).
  int64_t low = 0;
  uint64_t span = 1;
};

/// Element i of fill `f` stored as T, counters from `first` (the kernels' one formula, on
/// the host and on the device).
template <typename T>
FRUGAL_HD T random_element(const RandomFill& f, uint64_t first, uint64_t i) {
  using Acc = opmath_t<T>;
  if (f.kind == RandomKind::Integer) return T(static_cast<Acc>(philox_int(f.low, f.span, f.range.seed, first, i)));
  T out = T(static_cast<Acc>(philox_sample(int(f.kind), f.a, f.b, f.range.seed, first, i)));
  if (f.kind == RandomKind::Uniform) {  // Note [Random bounds in the dtype]
    const double r = double(static_cast<Acc>(out));
    if (r < f.lo_in_dtype) out = T(static_cast<Acc>(f.lo_in_dtype));
    if (r > f.hi_in_dtype) out = T(static_cast<Acc>(f.hi_in_dtype));
  }
  return out;
}
}  // namespace frugal::ops
namespace frugal::ops::cpu {
void random_kernel(const Tensor& t, const RandomFill& fill);  // t contiguous
}
namespace frugal::ops::cuda {
void random_kernel(const Tensor& t, const RandomFill& fill);
}

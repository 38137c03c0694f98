#pragma once
// q_i of Note [Blockwise quantization] in float64 arithmetic, for the tests' independent
// references of the encoders.
#include <cmath>

namespace frugal::testing {

/// x (a float32 value) in units of its block's scale, as float32 would compute it: x times
/// the float32 inverse of the scale, x / scale where that inverse overflows, x itself when the
/// scale is 0. Float64 gives each float32 result with one rounding: a product of two float32
/// is exact there, and a quotient rounded to float64 and then to float32 is the correctly
/// rounded float32 quotient (53 >= 2 * 24 + 2 bits).
inline double ref_scaled(double x, float scale) {
  if (!(scale > 0.0f)) return x;
  const float inverse = float(1.0 / double(scale));
  if (std::isinf(inverse)) return double(float(x / double(scale)));
  return double(float(x * double(inverse)));
}

}  // namespace frugal::testing

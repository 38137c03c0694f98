#pragma once
// Differentiable binary math functions: atan2, hypot, logaddexp and the division-like ops
// (remainder, fmod, rounded division). Same names, arguments and semantics (broadcasting, type
// promotion, errors) as the raw ops in tensor/ops/binary.h (Note [Division-like ops] there);
// gradients come back in each input's own dtype.
#include <string_view>

#include "tensor/tensor.h"

namespace frugal {

/// atan2(a, b), the angle of the point (b, a); integer inputs give float32. Gradients
/// g b / (a^2 + b^2) and -g a / (a^2 + b^2) (NaN at the origin, as PyTorch's).
Tensor atan2(const Tensor& a, const Tensor& b);
/// sqrt(a^2 + b^2); gradients g a / hypot and g b / hypot (NaN at the origin, as PyTorch's).
Tensor hypot(const Tensor& a, const Tensor& b);
/// log(e^a + e^b); gradients g sigmoid(a - b) and g sigmoid(b - a).
Tensor logaddexp(const Tensor& a, const Tensor& b);
/// a - b floor(a / b), the divisor's sign (Python's %); gradients g and -g floor(a / b).
Tensor remainder(const Tensor& a, const Tensor& b);
Tensor remainder(const Tensor& x, double s);
/// a - b trunc(a / b), the dividend's sign (C's fmod); gradients g and -g trunc(a / b).
Tensor fmod(const Tensor& a, const Tensor& b);
Tensor fmod(const Tensor& x, double s);
/// floor(a / b); integers stay integers. The gradient is zeros (a step function), as PyTorch's.
Tensor floor_divide(const Tensor& a, const Tensor& b);
Tensor floor_divide(const Tensor& x, double s);
/// a / b rounded: rounding_mode "trunc" or "floor"; gradient zeros. div(a, b) is true division.
Tensor div(const Tensor& a, const Tensor& b, std::string_view rounding_mode);
Tensor div(const Tensor& x, double s, std::string_view rounding_mode);

}  // namespace frugal

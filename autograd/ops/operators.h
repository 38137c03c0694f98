#pragma once
// Arithmetic operators on Tensor: spelled-out calls of the differentiable ops in
// autograd/ops/binary.h (and neg in autograd/ops/unary.h, remainder in binary_math.h), so `y = (x - mean) / std * w + b`
// records the same graph as add/sub/mul/div would. Compound assignments (+= -= *= /=) write
// in place, with the rules of Note [In-place ops and autograd] (autograd/ops/binary.cpp).
#include "autograd/ops/binary.h"
#include "autograd/ops/binary_math.h"
#include "autograd/ops/unary.h"

namespace frugal {

inline Tensor operator-(const Tensor& x) { return neg(x); }

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator+(const Tensor& x, double s) { return add(x, s); }
inline Tensor operator+(double s, const Tensor& x) { return add(x, s); }

inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator-(const Tensor& x, double s) { return sub(x, s); }
inline Tensor operator-(double s, const Tensor& x) { return rsub(x, s); }

inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator*(const Tensor& x, double s) { return mul(x, s); }
inline Tensor operator*(double s, const Tensor& x) { return mul(x, s); }

inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator/(const Tensor& x, double s) { return div(x, s); }
inline Tensor operator/(double s, const Tensor& x) { return rdiv(x, s); }

// Python's %: remainder, with the divisor's sign (Note [Division-like ops] in tensor/ops/binary.h).
inline Tensor operator%(const Tensor& a, const Tensor& b) { return remainder(a, b); }
inline Tensor operator%(const Tensor& x, double s) { return remainder(x, s); }

// In place. They take a const handle, as the in-place ops do, so that `x[0] += 1` works
// on the temporary view (which, if x requires grad, throws: see the Note).
inline const Tensor& operator+=(const Tensor& a, const Tensor& b) { return add_(a, b); }
inline const Tensor& operator+=(const Tensor& x, double s) { return add_(x, s); }
inline const Tensor& operator-=(const Tensor& a, const Tensor& b) { return sub_(a, b); }
inline const Tensor& operator-=(const Tensor& x, double s) { return sub_(x, s); }
inline const Tensor& operator*=(const Tensor& a, const Tensor& b) { return mul_(a, b); }
inline const Tensor& operator*=(const Tensor& x, double s) { return mul_(x, s); }
inline const Tensor& operator/=(const Tensor& a, const Tensor& b) { return div_(a, b); }
inline const Tensor& operator/=(const Tensor& x, double s) { return div_(x, s); }

}  // namespace frugal

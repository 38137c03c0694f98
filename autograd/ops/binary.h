#pragma once
// Differentiable binary ops: the broadcasting arithmetic ops, where, masked_fill, and their
// in-place forms. Same names, arguments and semantics (shapes, type promotion, errors) as
// the raw ops in tensor/ops/binary.h; gradients come back in each input's own dtype.
// Comparisons and logical ops are not differentiable; they are forwarded to the raw ops
// (run below autograd), so user code needs only `frugal::`.
//
// In-place ops follow PyTorch's rules: see Note [In-place ops and autograd] in
// autograd/ops/inplace.h.
#include "tensor/tensor.h"

namespace frugal {

// ---- binary (broadcasting) ----------------------------------------------------

/// a + alpha * b
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);
/// a - alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
/// a * b
Tensor mul(const Tensor& a, const Tensor& b);
/// a / b (true division).
Tensor div(const Tensor& a, const Tensor& b);
/// Elementwise max; where a == b each input gets half the gradient (as PyTorch).
Tensor maximum(const Tensor& a, const Tensor& b);
/// Elementwise min; where a == b each input gets half the gradient.
Tensor minimum(const Tensor& a, const Tensor& b);
/// a ^ b
Tensor pow(const Tensor& a, const Tensor& b);
/// x + s
Tensor add(const Tensor& x, double s);
/// x - s
Tensor sub(const Tensor& x, double s);
/// x * s
Tensor mul(const Tensor& x, double s);
/// x / s
Tensor div(const Tensor& x, double s);
/// s - x (the scalar on the left, as `2.0 - x`).
Tensor rsub(const Tensor& x, double s);
/// s / x (the scalar on the left, as `1.0 / x`); s is first rounded to x's dtype.
Tensor rdiv(const Tensor& x, double s);

/// cond ? a : b (cond bool, not differentiable).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// mask ? value : x (mask bool); masked positions get no gradient.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
/// start + weight (end - start), broadcast, as torch.lerp (Note [Lerp formula]); one floating
/// dtype. Gradients: start g (1 - weight), end g weight, a tensor weight g (end - start).
Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight);
Tensor lerp(const Tensor& start, const Tensor& end, double weight);

// ---- in place: write into the first argument and return it ----------------------

/// a += alpha * b
const Tensor& add_(const Tensor& a, const Tensor& b, double alpha = 1.0);
/// a -= alpha * b
const Tensor& sub_(const Tensor& a, const Tensor& b, double alpha = 1.0);
/// a *= b
const Tensor& mul_(const Tensor& a, const Tensor& b);
/// a /= b
const Tensor& div_(const Tensor& a, const Tensor& b);
/// x += s
const Tensor& add_(const Tensor& x, double s);
/// x -= s
const Tensor& sub_(const Tensor& x, double s);
/// x *= s
const Tensor& mul_(const Tensor& x, double s);
/// x /= s
const Tensor& div_(const Tensor& x, double s);
/// x[mask] = value
const Tensor& masked_fill_(const Tensor& x, const Tensor& mask, double value);
/// self = lerp(self, end, weight); under NoGradGuard an EMA of weights (ema.lerp_(w, 0.001)).
const Tensor& lerp_(const Tensor& self, const Tensor& end, const Tensor& weight);
const Tensor& lerp_(const Tensor& self, const Tensor& end, double weight);

// ---- not differentiable: the raw ops, forwarded (bool results, nothing recorded) ---

/// a == b, broadcast; bool result. Likewise ne, lt, le, gt, ge.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
/// x == s; bool result. Likewise ne, lt, le, gt, ge.
Tensor eq(const Tensor& x, double s);
Tensor ne(const Tensor& x, double s);
Tensor lt(const Tensor& x, double s);
Tensor le(const Tensor& x, double s);
Tensor gt(const Tensor& x, double s);
Tensor ge(const Tensor& x, double s);
/// !x (x == 0 for non-bool x).
Tensor logical_not(const Tensor& x);
/// a && b, broadcast; non-bool inputs count as x != 0.
Tensor logical_and(const Tensor& a, const Tensor& b);
/// a || b, broadcast; non-bool inputs count as x != 0.
Tensor logical_or(const Tensor& a, const Tensor& b);

}  // namespace frugal

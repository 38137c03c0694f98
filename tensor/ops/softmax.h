#pragma once
// softmax / log_softmax along one dim, and the backward formulas autograd uses.
//
// Note [Stable softmax]
// softmax(x)_j = exp(x_j - m) / sum_k exp(x_k - m) with m = max_k x_k, so no exp
// overflows (the largest term is exp(0) = 1) and the sum is >= 1; log_softmax is
// x_j - m - log(sum_k exp(x_k - m)), never the log of a rounded-to-zero softmax.
// f16/bf16 compute in float, f32 in float with the sum accumulated in double on the
// CPU; the output is rounded once. A NaN anywhere in a slice makes the whole slice
// NaN (as in PyTorch); -inf entries (masks) give 0 (log: -inf) as long as one entry
// of the slice is finite, and an all -inf slice gives NaN.
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal::ops {

/// exp(x - max) / sum(exp(x - max)) along `dim` (negative counts from the end).
/// Floating dtypes; the output has x's dtype and shape, contiguous.
Tensor softmax(const Tensor& x, int64_t dim);
/// x - max - log(sum(exp(x - max))) along `dim`.
Tensor log_softmax(const Tensor& x, int64_t dim);

/// Gradient of softmax given the upstream gradient g and the forward output y:
/// y * (g - sum(g * y, dim)).
Tensor softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim);
/// Gradient of log_softmax given g and the forward output y: g - exp(y) * sum(g, dim).
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim);

/// A contiguous tensor seen as (outer, D, inner), softmax running along D.
struct SoftmaxShape {
  int64_t outer = 1, D = 1, inner = 1;
};

}  // namespace frugal::ops

// Backend kernels: every tensor contiguous with the same shape and dtype, numel > 0.
namespace frugal::ops::cpu {
/// out, x: (outer, D, inner)
void softmax_kernel(const Tensor& out, const Tensor& x, SoftmaxShape s, bool log);
/// grad_in, grad_out, out: (outer, D, inner)
void softmax_backward_kernel(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, SoftmaxShape s,
                             bool log);
/// Eigen's loop, for every dtype and dim: what softmax_backward_kernel runs but for float32
/// along the last dim, and the reference its vectorized rows are tested and timed against
/// (Note [Vectorized masked softmax] in tensor/cpu/masked_softmax_kernel.cpp).
void softmax_backward_kernel_generic(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, SoftmaxShape s,
                                     bool log);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void softmax_kernel(const Tensor& out, const Tensor& x, SoftmaxShape s, bool log);
void softmax_backward_kernel(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, SoftmaxShape s,
                             bool log);
}  // namespace frugal::ops::cuda

#pragma once
// Inclusive prefix sums along one dim, as torch.cumsum (the differentiable form is
// frugal::cumsum in autograd/ops/cumsum.h).
//
// Note [Cumulative sum dtypes]
// Each line along `dim` is summed in order, one running total per line, so the result does
// not depend on how a backend splits the work. Floating inputs keep their dtype and sum in
// opmath_t (float16/bfloat16 in float32, rounding each prefix once, as PyTorch); int32,
// int64 and bool inputs sum in int64 and give an int64 result (PyTorch's promotion of
// integral inputs to cumsum).
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal::ops {

/// out[..., j, ...] = x[..., 0, ...] + ... + x[..., j, ...] along `dim` (negative counts from
/// the end; a 0-d input takes dim 0 or -1). The output has x's shape, contiguous, in x's
/// dtype when floating, else int64.
Tensor cumsum(const Tensor& x, int64_t dim);

/// A contiguous tensor seen as (outer, D, inner), the sums running along D.
struct CumsumShape {
  int64_t outer = 1, D = 1, inner = 1;
};

}  // namespace frugal::ops

// Backend kernels: x contiguous, out contiguous (x's dtype when floating, else int64),
// numel > 0.
namespace frugal::ops::cpu {
/// out, x: (outer, D, inner)
void cumsum_kernel(const Tensor& out, const Tensor& x, CumsumShape s);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void cumsum_kernel(const Tensor& out, const Tensor& x, CumsumShape s);
}  // namespace frugal::ops::cuda

#pragma once
// Differentiable logsumexp, as torch.logsumexp: a composite of amax, exp, sum and log
// (Note [Stable logsumexp] in autograd/ops/logsumexp.cpp).
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace frugal {

/// log(sum(exp(x))) over `dims` (negative count from the end; empty: every dim, as sum),
/// without overflow. A slice of only -inf (or an empty slice) gives -inf with a zero
/// gradient, +inf gives +inf, NaN gives NaN. Integer and bool inputs are computed in
/// float32, as PyTorch; under autocast float16/bfloat16 inputs run in float32.
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

}  // namespace frugal

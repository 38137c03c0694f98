#pragma once
// Differentiable masked_select and the index op nonzero (not differentiable: an int64
// result), same names, arguments and semantics as the raw ops in tensor/ops/masked.h. Both
// read the number of true elements on the host (Note [Data-dependent output sizes]), so they
// synchronize with a CUDA device and refuse inside a CUDA graph capture.
#include "tensor/tensor.h"

namespace frugal {

/// x's elements where mask (bool) is true, x and mask broadcast, as a 1-D tensor in row-major
/// order of the broadcast shape. Gradient: the incoming gradient scattered back to the true
/// positions (0 elsewhere), summed over the dims x was broadcast along.
Tensor masked_select(const Tensor& x, const Tensor& mask);

/// The indices of x's nonzero elements, int64 (count, x.dim()), row-major order.
Tensor nonzero(const Tensor& x);

}  // namespace frugal

#pragma once
// Selections whose output size depends on the values: nonzero and masked_select, as
// torch.nonzero and torch.masked_select (the differentiable masked_select is in
// autograd/ops/masked.h).
//
// Note [Data-dependent output sizes]
// Both ops count before they write. The mask, seen flat in the row-major order of its
// (broadcast) shape, gets its inclusive prefix sum pos = cumsum(mask) (int64, the scan of
// tensor/ops/cumsum.h: on CUDA a multi-block scan, Note [Cumulative sum order]); pos[n - 1]
// is the number of true elements, which the host reads (on CUDA a device-to-host copy
// that waits for the stream, as PyTorch's nonzero and masked_select do) to allocate the
// output; then element i with mask[i] true goes to output row pos[i] - 1. Every element
// knows its slot without atomics, so the output is in row-major order on every backend and
// run to run. The host read cannot be captured in a CUDA graph (a replay would reuse the
// count of the capture), so both ops refuse inside a capture (core/graph_capture.h).
// masked_select's backward needs no count: its gradient has one element per true mask
// element, and masked_select_backward scatters it back by the same pos.
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal::ops {

/// The indices of x's nonzero elements (NaN counts as nonzero, -0 does not): int64
/// (count, x.dim()), one row per element in row-major order, as torch.nonzero. Any dtype.
Tensor nonzero(const Tensor& x);

/// x's elements where `mask` (bool) is true, x and mask broadcast together: a 1-D tensor of
/// x's dtype, in the row-major order of the broadcast shape, as torch.masked_select.
Tensor masked_select(const Tensor& x, const Tensor& mask);

/// masked_select's gradient before the broadcast is undone: a tensor of `shape` (the
/// broadcast shape) and grad's dtype holding grad's elements, in order, where mask
/// (broadcastable to shape) is true and 0 elsewhere (torch's masked_scatter into zeros).
/// grad: 1-D, one element per true mask element (not checked on CUDA: that needs the count).
Tensor masked_select_backward(const Tensor& grad, const Tensor& mask, const Shape& shape);

}  // namespace frugal::ops

// Backend kernels (Note [Data-dependent output sizes]); every tensor contiguous, n > 0.
// They move elements by their size alone, so every dtype takes the same few instantiations.
namespace frugal::ops::cpu {
/// out: (count); x: (n), out's dtype; mask: (n) bool; pos: (n) int64, cumsum(mask)
void masked_select_kernel(const Tensor& out, const Tensor& x, const Tensor& mask, const Tensor& pos);
/// out: (count, sizes.size()) int64; mask, pos: (n) as above, n = numel_of(sizes)
void nonzero_kernel(const Tensor& out, const Tensor& mask, const Tensor& pos, const Shape& sizes);
/// out: (n); src: (count), out's dtype; mask, pos: (n) as above. out[i] = mask[i] ? src[pos[i] - 1] : 0
void masked_scatter_kernel(const Tensor& out, const Tensor& mask, const Tensor& pos, const Tensor& src);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void masked_select_kernel(const Tensor& out, const Tensor& x, const Tensor& mask, const Tensor& pos);
void nonzero_kernel(const Tensor& out, const Tensor& mask, const Tensor& pos, const Shape& sizes);
void masked_scatter_kernel(const Tensor& out, const Tensor& mask, const Tensor& pos, const Tensor& src);
}  // namespace frugal::ops::cuda

#pragma once
// Attention's softmax with its scale and mask fused in (the differentiable form is
// frugal::masked_softmax in autograd/ops/masked_softmax.h, the building block of
// scaled_dot_product_attention).
//
// Note [Masked softmax]
// y = softmax(scale * scores + mask) along the last dim, computed as one kernel: each
// row is read once for the online (max, sum of exp) pair (Note [Stable softmax]) and
// once to write, and the mask is read in place through broadcast strides, so neither
// the scaled scores nor an expanded (B, H, L, S) mask is ever materialized. A bool mask
// keeps the entries where it is true (false: -inf, i.e. weight 0); a floating mask is
// added. is_causal keeps entry (l, s) of the last two dims iff s <= l (the top-left
// aligned lower triangle, as torch's is_causal). A row left with no finite entry (every
// key masked) gives zeros, not NaN, as PyTorch's _safe_softmax does in the math attention
// path: a padding query row then contributes nothing instead of poisoning the batch.
// Its gradient is the plain softmax's, so the backward is ops::softmax_backward on y
// (zero rows have zero gradients), times scale for the scores.
#include "tensor/tensor.h"

namespace frugal::ops {

/// softmax(scale * scores + mask) along the last dim; see Note [Masked softmax]. scores:
/// (..., L, S) floating (>= 2-D when is_causal); mask: undefined, bool (true = attend), or
/// of scores' dtype (added), broadcastable to scores' shape. Output: scores' shape and dtype.
Tensor masked_softmax(const Tensor& scores, const Tensor& mask = Tensor(), bool is_causal = false, double scale = 1.0);

/// How the kernels read the mask: scores' sizes and the mask's strides in them (0 where it
/// broadcasts); kind 0: no mask, 1: bool, 2: added.
struct MaskedSoftmaxParams {
  static constexpr int kMaxDims = 12;
  int kind = 0;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t mask_strides[kMaxDims] = {};
  bool causal = false;
  double scale = 1.0;
  /// Element offset of row `row`'s first mask entry (rows = all dims but the last).
#if defined(__CUDACC__)
  __host__ __device__
#endif
      int64_t
      mask_row_offset(int64_t row) const {
    int64_t off = 0;
    for (int d = ndim - 2; d >= 0; --d) {
      off += (row % sizes[d]) * mask_strides[d];
      row /= sizes[d];
    }
    return off;
  }
};

}  // namespace frugal::ops

// Backend kernels: out, scores contiguous (rows, S) with rows * S > 0; mask: a view with the
// strides in params (or undefined).
namespace frugal::ops::cpu {
/// out, scores: (..., L, S); mask: broadcast view, see MaskedSoftmaxParams
void masked_softmax_kernel(const Tensor& out, const Tensor& scores, const Tensor& mask,
                           const MaskedSoftmaxParams& params);
/// The scalar loop, for every dtype: what masked_softmax_kernel runs but for float32, and the
/// reference its vectorized float32 rows are tested and timed against (Note [Vectorized masked
/// softmax] in tensor/cpu/masked_softmax_kernel.cpp).
void masked_softmax_kernel_generic(const Tensor& out, const Tensor& scores, const Tensor& mask,
                                   const MaskedSoftmaxParams& params);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void masked_softmax_kernel(const Tensor& out, const Tensor& scores, const Tensor& mask,
                           const MaskedSoftmaxParams& params);
}  // namespace frugal::ops::cuda

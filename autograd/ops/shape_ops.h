#pragma once
// Differentiable rearrangements with no raw op of their own: flip, repeat, tril and triu
// (autograd/ops/shape_ops.cpp), and pad (autograd/ops/pad.cpp). Same names, arguments,
// defaults and results as PyTorch; every one returns a fresh tensor, never a view of x.
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace frugal {

/// x with the order of its entries reversed along each of `dims` (negative count from the
/// end; each at most once), as torch.flip. An index_select per dim, so the gradient is g
/// flipped back.
Tensor flip(const Tensor& x, const std::vector<int64_t>& dims);

/// x tiled `repeats[i]` times along dim i, as torch.Tensor.repeat: repeats.size() >= x.dim(),
/// the extra leading entries add new leading dims; a 0 gives a size-0 dim. An expand and a
/// reshape, so the gradient sums g over the copies.
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats);

/// The lower triangle of the last two dims of x (>= 2-D; batched over the others): entries
/// (i, j) with j - i <= diagonal kept, the rest 0, as torch.tril. diagonal 0 is the main
/// diagonal, > 0 above it, < 0 below. The gradient is g with the same entries kept.
Tensor tril(const Tensor& x, int64_t diagonal = 0);
/// The upper triangle: entries with j - i >= diagonal kept, as torch.triu.
Tensor triu(const Tensor& x, int64_t diagonal = 0);

/// x padded as torch.nn.functional.pad: `pad` holds (left, right) pairs from the last dim
/// backwards, at most x.dim() of them. mode "constant" fills with `value`, and a negative
/// pad crops (the gradient is g narrowed back, zeros where x was cropped); "reflect"
/// mirrors without repeating the edge (each pad below the dim's size), "replicate"
/// repeats the edge and "circular" wraps around (each pad at most the dim's size), all
/// three over the last k = 1, 2 or 3 dims of a (k + 1)- or (k + 2)-D x with no empty dim
/// but the batch dim, as PyTorch, through an index_select per padded dim; they take no
/// fill value (value must stay 0).
Tensor pad(const Tensor& x, const std::vector<int64_t>& pad, const std::string& mode = "constant", double value = 0);

}  // namespace frugal

#pragma once
// Joining and splitting along a dim: cat, stack (copies into a fresh tensor) and
// split, split_with_sizes, chunk (views of the input, no copies).
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::ops {

/// Concatenates `tensors` along `dim` (negative counts from the end) into a fresh
/// contiguous tensor, as torch.cat. Inputs must be on one device and have the same
/// sizes except at `dim`; the result dtype is the promotion of all input dtypes
/// (promote_types). A 1-D tensor of shape (0,) is skipped wherever it appears
/// (PyTorch's legacy rule; its dtype still takes part in the promotion). 0-d tensors
/// and an empty list are errors.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);

/// Stacks same-shaped `tensors` along a new dim `dim` (in [-(ndim+1), ndim]), as
/// torch.stack: cat of every input unsqueezed at `dim`. Dtypes promote as in cat.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

/// Views of consecutive pieces of `x` along `dim`, each `split_size` long except a
/// shorter last one, as torch.split. split_size 0 is allowed only when the dim is empty
/// (one piece). The pieces share x's storage.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);

/// Views of pieces of `x` along `dim` with the given lengths, which must sum to x.size(dim).
std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);

/// torch.chunk: split(x, ceil(n / chunks), dim), so it may return fewer than `chunks`
/// pieces; an empty dim gives `chunks` empty pieces. chunks must be positive.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace frugal::ops

namespace frugal::ops::cpu {
/// out: contiguous; inputs[i]: contiguous, out's dtype, sizes of out except at dim, where it
/// fills out[..., offsets[i] : offsets[i] + inputs[i].size(dim), ...].
void cat_kernel(const Tensor& out, const std::vector<Tensor>& inputs, const std::vector<int64_t>& offsets, int64_t dim);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void cat_kernel(const Tensor& out, const std::vector<Tensor>& inputs, const std::vector<int64_t>& offsets, int64_t dim);
}  // namespace frugal::ops::cuda

#pragma once
// Differentiable joining and splitting: cat, stack, split, split_with_sizes and chunk.
// Same names, arguments and semantics as the raw ops in tensor/ops/join.h.
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace frugal {

/// Concatenates along `dim`; each input's gradient is its slice of g (a view).
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Stacks same-shaped tensors along a new dim `dim`.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Views of consecutive `split_size`-long pieces along `dim`. One node owns all pieces:
/// its backward concatenates their gradients, zeros for the pieces that got none.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
/// Views of pieces of the given lengths along `dim`.
std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
/// torch.chunk: split into at most `chunks` pieces.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace frugal

#pragma once
// Differentiable indexing: index_select, gather, scatter_add, index_add and embedding.
// Same names, arguments and semantics as the raw ops in tensor/ops/index.h. Index tensors
// are never differentiable; one_hot is forwarded to the raw op.
#include <cstdint>
#include <optional>

#include "tensor/tensor.h"

namespace frugal {

/// Entries of x at `index` (1-D or 0-d) along `dim`; backward adds g into those rows.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// torch.gather; backward scatter-adds g to the gathered positions.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
/// self with src scatter-added at `index` along `dim` (a fresh tensor); grad_self = g,
/// grad_src = g gathered at `index` (zeros where index does not reach).
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
/// self with src's slices added to the slices `index` along `dim` (a fresh tensor).
Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
/// Rows of weight (V, D) picked by `indices`: (*indices.shape, D). The row `padding_idx`
/// gets no gradient; a negative one counts from the end (-1 is the last row), as
/// torch.nn.functional.embedding. (The raw ops::embedding_backward's -1 means none.)
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx = std::nullopt);

/// Not differentiable: int64 tensor (*index.shape, num_classes) with a 1 at each index
/// (num_classes = -1 infers max + 1), forwarded to the raw op.
Tensor one_hot(const Tensor& index, int64_t num_classes = -1);

}  // namespace frugal

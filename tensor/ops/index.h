#pragma once
// Indexing along a dim: index_select, gather, scatter_add, index_add, one_hot and the
// embedding lookup with its backward. Index tensors are int32 or int64; every index is
// checked against the size it selects from (negative indices are errors, as in PyTorch's
// versions of these ops), and a bad one throws frugal::Error naming the op, the value,
// its position in the index tensor and the valid range (see Note [Index validation]); on
// CUDA at the next synchronization with the device (set_sync_index_checks below).
#include <cstdint>

#include "memory/deferred_checks.h"
#include "tensor/half.h"  // FRUGAL_HD
#include "tensor/tensor.h"

namespace frugal::ops {

/// Entries of `x` at positions `index` (1-D or 0-d) along `dim`: the result has x's shape
/// with size(dim) = index.numel(), as torch.index_select.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);

/// out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (and likewise for other dims), as
/// torch.gather: index has x's number of dims and index.size(d) <= x.size(d) for d != dim;
/// the result has index's shape and x's dtype.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

/// self[index[i][j][k]][j][k] += src[i][j][k] for dim 0 (and likewise for other dims),
/// accumulating duplicates, as torch.Tensor.scatter_add_. index, self and src have the
/// same number of dims; index.size(d) <= src.size(d) for every d and <= self.size(d) for
/// d != dim; self and src share a dtype; src (or index) may overlap self: it is read as it
/// was before the op. Bumps self's version. If an index is out of range the op throws and
/// self may hold part of the update.
void scatter_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
/// Out-of-place scatter_add_: a fresh tensor, self unchanged.
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);

/// A copy of self with src's slice k added to self's slice index[k] along `dim` (duplicates
/// accumulate), as torch.index_add: index 1-D (or 0-d); src has self's shape except
/// src.size(dim) == index.numel(); same dtype.
Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);

/// int64 tensor of shape (*index.shape, num_classes) with a 1 at each index value.
/// num_classes = -1 infers max(index) + 1 (reads the index on the host: a sync on CUDA).
Tensor one_hot(const Tensor& index, int64_t num_classes = -1);

/// Rows of weight (V, D) picked by `indices` (any shape, int32/int64): (*indices.shape, D).
Tensor embedding(const Tensor& weight, const Tensor& indices);

/// Gradient of embedding with respect to weight: a (num_weights, D) tensor whose row v sums
/// the rows of grad_out (*indices.shape, D) whose index is v; the row padding_idx stays zero
/// (padding_idx = -1: none). Dtype of grad_out.
Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t num_weights, int64_t padding_idx = -1);

/// Checks that every value of `index` (int32/int64, any shape and strides) lies in
/// [0, dim_size), as the ops above check theirs, for callers that index through other means
/// (the vocabulary-parallel layers): at once on the CPU, at the next synchronization on CUDA.
/// A bad value throws frugal::Error(message(value, position)), position its linear
/// (row-major) position in `index`.
void check_index_range(const Tensor& index, int64_t dim_size, memory::CheckMessage message);

/// How pad's non-constant modes read a padded dim (torch.nn.functional.pad's modes).
enum class PadIndexMode { Reflect, Replicate, Circular };

/// Where entry o of a dim of size n padded by (left, right) reads the input: i = o - left,
/// mirrored at the edges without repeating them (reflect: -1 -> 1, n -> n - 2), clamped
/// into [0, n) (replicate) or wrapped once (circular: -1 -> n - 1). In [0, n) when
/// reflect's pads are below n and circular's at most n (pad's checks).
FRUGAL_HD int64_t pad_source_index(int64_t o, int64_t n, int64_t left, PadIndexMode mode) {
  const int64_t i = o - left;
  switch (mode) {
    case PadIndexMode::Reflect: return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i;
    case PadIndexMode::Replicate: return i < 0 ? 0 : i >= n ? n - 1 : i;
    case PadIndexMode::Circular: return i < 0 ? i + n : i >= n ? i - n : i;
  }
  return i;
}

/// The int64 tensor (out_size) of pad_source_index(o, n, left, mode) for o < out_size, made
/// on `device` by a kernel (no host-to-device copy, so it can be captured in a CUDA graph).
Tensor pad_source_indices(int64_t out_size, int64_t n, int64_t left, PadIndexMode mode, Device device);

/// On CUDA, a bad index is reported at the next synchronization with the device (.item(),
/// .cpu(), synchronize(device)) instead of at the op, so the host need not wait for the
/// GPU (Note [Deferred index checks] in memory/deferred_checks.h). `true` makes the CUDA
/// ops read their check right after the kernel and throw at the op, as the CPU ops do
/// (for debugging; FRUGAL_SYNC_INDEX_CHECKS=1 in the environment sets it at startup).
void set_sync_index_checks(bool on);
bool sync_index_checks();

/// What an index-checking kernel reports (see Note [Index validation]): the first
/// out-of-range index, when the kernel knows it at once (the CPU kernels), or the device
/// record {flag, value, position} it wrote (the CUDA kernels), not read yet.
struct IndexError {
  bool found = false;
  int64_t value = 0;     // the bad index value
  int64_t position = 0;  // linear (row-major) position in the kernel's iteration shape
  Tensor record;         // CUDA: int64 (3) on the device, written by the kernel in stream order
};

/// For op front-ends: throws message(value, position) for a bad index found at once; for
/// a device record, reads it now and throws (sync_index_checks()) or files a deferred check.
void finish_index_check(const IndexError& e, memory::CheckMessage message);

}  // namespace frugal::ops

// Kernels. All operands have one shape, the iteration shape (index is a strided or expanded
// view of the index tensor in it); `table` (src for gather, acc for scatter) has stride 0 at
// the indexed dim, and index value v moves it by v * dim_stride elements. Indices outside
// [0, dim_size) are reported through `err`, not written.
namespace frugal::ops::cpu {
/// out[p] = src[p + index[p] * dim_stride]. Any dtype (a copy of element_size bytes).
void index_gather_kernel(const Tensor& out, const Tensor& index, const Tensor& src, int64_t dim_size,
                         int64_t dim_stride, IndexError& err);
/// acc[p + index[p] * dim_stride] += src[p], skipping index value `skip` (-1: none). acc has
/// dtype opmath(src) (float32 for 16-bit src). Runs serially: see Note [Scatter accumulation].
void index_scatter_add_kernel(const Tensor& acc, const Tensor& index, const Tensor& src, int64_t dim_size,
                              int64_t dim_stride, int64_t skip, IndexError& err);
/// out: int64 (out.numel()), contiguous.
void pad_source_indices_kernel(const Tensor& out, int64_t n, int64_t left, PadIndexMode mode);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void index_gather_kernel(const Tensor& out, const Tensor& index, const Tensor& src, int64_t dim_size,
                         int64_t dim_stride, IndexError& err);
void index_scatter_add_kernel(const Tensor& acc, const Tensor& index, const Tensor& src, int64_t dim_size,
                              int64_t dim_stride, int64_t skip, IndexError& err);
void pad_source_indices_kernel(const Tensor& out, int64_t n, int64_t left, PadIndexMode mode);
}  // namespace frugal::ops::cuda

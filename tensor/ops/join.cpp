#include "tensor/ops/join.h"

#include <algorithm>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"

namespace frugal::ops {

// Note [cat: one batched copy]
// cat allocates the output once and writes every input into its slice of it. Inputs
// that are already contiguous and of the output's dtype (the common case: activations
// being joined) go through one cat_kernel call: on the CPU a memcpy per (outer index,
// input) row, on CUDA a single launch for up to 64 inputs at once, moving the widest
// unit (up to 16 bytes) that every pointer, row and offset is aligned to. Any other input
// (strided view, other dtype) is written by ops::copy_into into a narrow() view of the
// output, which casts and follows strides.
//
// Note [cat skips 1-D empty tensors]
// As PyTorch does for backward compatibility, a 1-D tensor of shape (0,) is ignored by
// cat whatever the other inputs' shapes, so `cat({empty({0}), x})` is x. It still takes
// part in dtype promotion. Any other empty tensor, e.g. (2, 0), is checked like the rest.

namespace {

bool legacy_empty(const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; }

/// uint8 has no type promotion (Note [Storage-only uint8] in tensor/dtype.h): it joins only
/// with uint8. Checked here, where the op's name and the positions are known.
void check_uint8_join(const char* op, const std::vector<Tensor>& tensors, size_t i) {
  FRUGAL_CHECK((tensors[i].dtype() == DType::UInt8) == (tensors[0].dtype() == DType::UInt8), op,
               ": uint8 is a storage-only dtype and joins only with uint8, got ", tensors[0].describe(),
               " at position 0 and ", tensors[i].describe(), " at position ", i);
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  FRUGAL_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  // Validation: defined, 0-d, device, dtype promotion; the first non-skipped input is the reference.
  DType dtype = DType::Bool;
  int64_t ref = -1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    FRUGAL_CHECK(t.defined(), "cat: tensor at position ", i, " is undefined");
    FRUGAL_CHECK(t.dim() > 0, "cat: zero-dimensional tensor ", t.describe(), " at position ", i,
                 " cannot be concatenated");
    FRUGAL_CHECK(t.device() == tensors[0].device(), "cat: expected all tensors on one device, got ",
                 tensors[0].describe(), " at position 0 and ", t.describe(), " at position ", i);
    check_uint8_join("cat", tensors, i);
    dtype = i == 0 ? t.dtype() : promote_types(dtype, t.dtype());
    if (ref < 0 && !legacy_empty(t)) ref = int64_t(i);
  }
  const Device device = tensors[0].device();
  if (ref < 0) {  // every input is a (0,) tensor
    wrap_dim(dim, 1, "cat");
    return empty({0}, {dtype, device});
  }
  const Tensor& first = tensors[size_t(ref)];
  dim = wrap_dim(dim, first.dim(), "cat");

  Shape out_shape = first.sizes();
  out_shape[size_t(dim)] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (legacy_empty(t)) continue;
    FRUGAL_CHECK(t.dim() == first.dim(), "cat: tensors must have the same number of dims, got ", first.describe(),
                 " at position ", ref, " and ", t.describe(), " at position ", i);
    for (int64_t d = 0; d < t.dim(); ++d) {
      FRUGAL_CHECK(d == dim || t.size(d) == first.size(d), "cat: sizes of tensors must match except in dim ", dim,
                   ", got ", first.describe(), " at position ", ref, " and ", t.describe(), " at position ", i,
                   " (dim ", d, ": ", first.size(d), " vs ", t.size(d), ")");
    }
    FRUGAL_CHECK(!__builtin_add_overflow(out_shape[size_t(dim)], t.size(dim), &out_shape[size_t(dim)]),
                 "cat: the sizes in dim ", dim, " add up past 2^63 - 1 (at ", t.describe(), ", position ", i, ")");
  }

  Tensor out = empty(out_shape, {dtype, device});
  if (out.numel() == 0) return out;
  // See Note [cat: one batched copy].
  std::vector<Tensor> dense;
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (legacy_empty(t) || t.size(dim) == 0) continue;
    if (t.dtype() == dtype && t.is_contiguous()) {
      dense.push_back(t);
      offsets.push_back(offset);
    } else {
      copy_into(out.narrow(dim, offset, t.size(dim)), t);
    }
    offset += t.size(dim);
  }
  if (!dense.empty()) FRUGAL_DEVICE_DISPATCH("cat", device, cat_kernel, out, dense, offsets, dim);
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  FRUGAL_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    FRUGAL_CHECK(t.defined(), "stack: tensor at position ", i, " is undefined");
    FRUGAL_CHECK(t.sizes() == tensors[0].sizes(), "stack: expects each tensor to be equal size, got ",
                 tensors[0].describe(), " at position 0 and ", t.describe(), " at position ", i);
    FRUGAL_CHECK(t.device() == tensors[0].device(), "stack: expected all tensors on one device, got ",
                 tensors[0].describe(), " at position 0 and ", t.describe(), " at position ", i);
    check_uint8_join("stack", tensors, i);
  }
  dim = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& t : tensors) parts.push_back(t.unsqueeze(dim));
  return cat(parts, dim);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  FRUGAL_CHECK(x.defined() && x.dim() > 0, "split: expects a tensor with at least one dim, got ", x.describe());
  dim = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.size(dim);
  FRUGAL_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be positive (or 0 for an ",
               "empty dim), got ", split_size, " for dim ", dim, " of ", x.describe());
  const int64_t pieces = split_size == 0 || n == 0 ? 1 : (n - 1) / split_size + 1;  // n + split_size may overflow
  std::vector<Tensor> out;
  out.reserve(size_t(pieces));
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t start = i * split_size;
    out.push_back(x.narrow(dim, start, std::min(split_size, n - start)));
  }
  return out;
}

std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  FRUGAL_CHECK(x.defined() && x.dim() > 0, "split_with_sizes: expects a tensor with at least one dim, got ",
               x.describe());
  dim = wrap_dim(dim, x.dim(), "split_with_sizes");
  int64_t total = 0;
  for (int64_t s : sizes) {
    FRUGAL_CHECK(s >= 0 && !__builtin_add_overflow(total, s, &total), "split_with_sizes: sizes ", shape_str(sizes),
                 " must be non-negative and add up to at most 2^63 - 1");
  }
  FRUGAL_CHECK(total == x.size(dim), "split_with_sizes: sizes ", shape_str(sizes), " sum to ", total, " but dim ", dim,
               " of ", x.describe(), " has size ", x.size(dim));
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(x.narrow(dim, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  FRUGAL_CHECK(x.defined() && x.dim() > 0, "chunk: expects a tensor with at least one dim, got ", x.describe());
  FRUGAL_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  dim = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.size(dim);
  // An empty dim splits into `chunks` empty pieces (split would give only one).
  if (n == 0) return split_with_sizes(x, std::vector<int64_t>(size_t(chunks), 0), dim);
  return split(x, (n - 1) / chunks + 1, dim);  // ceil(n / chunks), without n + chunks overflowing
}

}  // namespace frugal::ops

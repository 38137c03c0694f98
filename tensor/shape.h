#pragma once
// Shapes and strides: small vectors of int64, plus the helpers every op needs.
//
// Note [Size overflow]
// Sizes come from users, config files and checkpoints, so nothing may wrap: a product
// that overflows int64 is undefined behaviour, and one that wraps to a small number
// hands out a tensor backed by far fewer bytes than it claims (empty({1LL << 62}) once
// got 0 bytes, then wrote past them). The invariant every tensor keeps:
//   - every size >= 0, every stride >= 0;
//   - the product of max(size, 1) over its dims fits in int64, so its element count, its
//     contiguous strides and every partial product of its sizes do too (a zero size
//     does not excuse the others: [2^62, 2^62, 0] is rejected, as the reference
//     safetensors reader rejects it, because its contiguous strides overflow);
//   - its span (1 + sum (size - 1) * stride) and its byte count (numel * element size,
//     for an expanded view too) fit in int64, so size_t(numel()) * element_size() is exact.
// numel_of and contiguous_strides check the first two themselves and throw naming the
// op and the shape; the factories and make_view (every view) check the rest. The
// checks are overflow flags (__builtin_mul_overflow), one per dim, on paths that already
// loop over the dims.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace frugal {

using Shape = std::vector<int64_t>;

/// The element count of `sizes`. Throws naming `op` and the shape when a size is
/// negative or when the product of the sizes (zeros taken as 1) overflows int64.
int64_t numel_of(const Shape& sizes, const char* op = "numel");
/// Row-major (C-contiguous) strides for `sizes`, in elements; checks as numel_of.
Shape contiguous_strides(const Shape& sizes, const char* op = "contiguous_strides");
/// Both at once, for a new tensor (one check of the sizes).
struct ContiguousLayout {
  Shape strides;
  int64_t numel;
};
ContiguousLayout contiguous_layout(const Shape& sizes, const char* op);
/// How many elements a strided layout spans: 1 + sum (size - 1) * stride, or 0 when a
/// size is 0. Throws naming `op` when a size or stride is negative or the span overflows.
int64_t strided_span(const Shape& sizes, const Shape& strides, const char* op);
/// "[2, 3, 4]"
std::string shape_str(const Shape& s);
/// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
/// The broadcast of two shapes (NumPy rules); throws naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << shape_str(s); }

}  // namespace frugal

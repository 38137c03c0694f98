#pragma once
// Shapes and strides: small vectors of int64, plus the helpers every op needs.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace frugal {

using Shape = std::vector<int64_t>;

int64_t numel_of(const Shape& sizes);
/// Row-major (C-contiguous) strides for `sizes`, in elements.
Shape contiguous_strides(const Shape& sizes);
/// "[2, 3, 4]"
std::string shape_str(const Shape& s);
/// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
/// The broadcast of two shapes (NumPy rules); throws naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << shape_str(s); }

}  // namespace frugal

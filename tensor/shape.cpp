#include "tensor/shape.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/error.h"

namespace frugal {

namespace {

// Why `sizes` broke the invariant of Note [Size overflow].
[[noreturn]] void bad_shape(const Shape& sizes, const char* op) {
  for (size_t i = 0; i < sizes.size(); ++i)
    FRUGAL_CHECK(sizes[i] >= 0, op, ": size ", sizes[i], " at dim ", i, " of shape ", shape_str(sizes), " is negative");
  FRUGAL_FAIL(op, ": shape ", shape_str(sizes), " has too many elements (the product of its sizes overflows int64)");
}

// The product of max(size, 1) over `sizes` into `product`, and whether a size is 0; false
// when a size is negative or the product overflows. One pass: numel() runs on every op.
bool extent_of(const Shape& sizes, int64_t& product, bool& has_zero) {
  bool ok = true;
  product = 1;
  has_zero = false;
  for (int64_t s : sizes) {
    ok &= s >= 0 && !__builtin_mul_overflow(product, s > 1 ? s : 1, &product);
    has_zero |= s == 0;
  }
  return ok;
}

}  // namespace

int64_t numel_of(const Shape& sizes, const char* op) {
  int64_t n;
  bool has_zero;
  if (!extent_of(sizes, n, has_zero)) [[unlikely]]
    bad_shape(sizes, op);
  return has_zero ? 0 : n;
}

ContiguousLayout contiguous_layout(const Shape& sizes, const char* op) {
  int64_t n;
  bool has_zero;
  if (!extent_of(sizes, n, has_zero)) [[unlikely]]
    bad_shape(sizes, op);
  // Every partial product is at most n: none of these can overflow.
  Shape strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return {std::move(strides), has_zero ? 0 : n};
}

Shape contiguous_strides(const Shape& sizes, const char* op) { return contiguous_layout(sizes, op).strides; }

int64_t strided_span(const Shape& sizes, const Shape& strides, const char* op) {
  FRUGAL_CHECK(sizes.size() == strides.size(), op, ": ", sizes.size(), " sizes but ", strides.size(), " strides");
  int64_t last = 0;  // the highest element index, relative to the first
  bool ok = true, empty = false;
  for (size_t i = 0; i < sizes.size(); ++i) {
    FRUGAL_CHECK(sizes[i] >= 0 && strides[i] >= 0, op, ": negative size or stride in sizes ", shape_str(sizes),
                 " strides ", shape_str(strides));
    empty |= sizes[i] == 0;
    int64_t step;
    ok &= !__builtin_mul_overflow(std::max<int64_t>(sizes[i], 1) - 1, strides[i], &step) &&
          !__builtin_add_overflow(last, step, &last);
  }
  if (empty) return 0;  // touches nothing, whatever the other sizes and strides
  FRUGAL_CHECK(ok && last < INT64_MAX, op, ": sizes ", shape_str(sizes), " with strides ", shape_str(strides),
               " span more than 2^63 - 1 elements");
  return last + 1;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out.append(i ? ", " : "").append(std::to_string(s[i]));
  return out + "]";
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim > 0 ? -ndim : -1, hi = ndim > 0 ? ndim - 1 : 0;
  FRUGAL_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " out of range for a tensor of ", ndim, " dims (expected ",
               lo, "..", hi, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    FRUGAL_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
                 " cannot be broadcast (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  numel_of(out, op);  // [2^40, 1] with [1, 2^40] broadcasts to too many elements
  return out;
}

}  // namespace frugal

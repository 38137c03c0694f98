#pragma once
// Shared pieces of the op table's entries (tests/op_table/ops_*.cpp): operand shapes,
// the reference's own type promotion, and small builders for expected outputs.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "tests/op_table/op_table.h"

namespace frugal::optest {

/// Concatenates the streamed arguments (for Sample::params).
template <typename... A>
std::string cat_str(const A&... a) {
  std::ostringstream os;
  os.precision(9);
  (os << ... << a);
  return os.str();
}

/// A shape that broadcasts to `out`: some leading dims dropped, some dims set to 1.
inline Shape broadcast_operand(Rng& rng, const Shape& out) {
  const int64_t drop = rng.chance(0.3) ? rng.range(0, int64_t(out.size())) : 0;
  Shape s(out.begin() + drop, out.end());
  if (rng.chance(0.4))
    for (int64_t& n : s)
      if (rng.chance(0.35)) n = 1;
  return s;
}

/// PyTorch's promote_types, written out again so that the reference does not share it.
inline DType ref_promote(DType a, DType b) {
  auto cat = [](DType t) { return t == kBool ? 0 : (t == kInt32 || t == kInt64) ? 1 : 2; };
  if (a == b) return a;
  if (cat(a) != cat(b)) return cat(a) > cat(b) ? a : b;
  if (cat(a) == 1) return kInt64;
  if (a == kFloat64 || b == kFloat64) return kFloat64;
  return kFloat32;
}
/// PyTorch's result_type of two tensors, given whether each is 0-d: beside a dimensioned operand
/// a 0-d one counts only when its category is higher (PyTorch's "Type promotion" docs; Note [0-d
/// operands in promotion] in tensor/dtype.h), written out again.
inline DType ref_result_type(DType a, bool a_zero_dim, DType b, bool b_zero_dim) {
  auto cat = [](DType t) { return t == kBool ? 0 : (t == kInt32 || t == kInt64) ? 1 : 2; };
  if (a_zero_dim == b_zero_dim) return ref_promote(a, b);
  const DType dimensioned = a_zero_dim ? b : a, zero_dim = a_zero_dim ? a : b;
  return cat(zero_dim) > cat(dimensioned) ? ref_promote(dimensioned, zero_dim) : dimensioned;
}
/// The compute dtype of `tensor op scalar`: a floating scalar lifts integers and bool to
/// float32, an integral one lifts bool to int64.
inline DType ref_promote_scalar(DType t, bool floating_scalar) {
  if (floating_scalar && !is_floating(t)) return kFloat32;
  if (!floating_scalar && t == kBool) return kInt64;
  return t;
}

/// An output of `shape` whose element at idx is f(idx), rounded to `dtype`.
template <typename F>
Expected make_expected(const Shape& shape, DType dtype, Tol tol, F&& f) {
  Host h = host_zeros(shape);
  size_t i = 0;
  for_each_index(shape, [&](const std::vector<int64_t>& idx) { h.v[i++] = round_to(dtype, f(idx)); });
  return {std::move(h), dtype, tol};
}

/// Values that suit `dtype`: small integers for integer dtypes, [lo, hi] otherwise.
inline Values values_for(DType dtype, double lo = -2.0, double hi = 2.0) {
  if (is_floating(dtype)) return {lo, hi};
  return {std::floor(lo * 2.5), std::ceil(hi * 2.5), 1.0};
}

/// The element of a row-major shape at linear position i.
inline std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

}  // namespace frugal::optest

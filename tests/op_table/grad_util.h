#pragma once
// Shared pieces of the differentiable op table's entries (tests/op_table/grad_ops_*.cpp):
// small shapes (gradcheck runs two forwards per input element) and contiguous float64
// values; the runner picks the layouts.
#include <string>
#include <vector>

#include "tests/op_table/entry_util.h"
#include "tests/op_table/grad_table.h"

namespace frugal::optest {

/// A contiguous float64 tensor of `shape`, uniform in [lo, hi], none closer to 0 than min_abs.
inline Tensor values(Rng& rng, const Shape& shape, double lo = -2.0, double hi = 2.0, double min_abs = 0.0) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (double& x : v) do
      x = rng.uniform(lo, hi);
    while (std::fabs(x) < min_abs);
  return tensor_of(v, shape, kFloat64);
}
/// int64 indices in [0, n).
inline Tensor indices(Rng& rng, const Shape& shape, int64_t n) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (double& x : v) x = double(rng.range(0, n - 1));
  return tensor_of(v, shape, kInt64);
}
/// A bool mask, true with probability p.
inline Tensor mask_of(Rng& rng, const Shape& shape, double p) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (double& x : v) x = rng.chance(p) ? 1.0 : 0.0;
  return tensor_of(v, shape, kBool);
}

inline GradInput grad_in(Tensor t) { return {std::move(t), true, true}; }
inline GradInput const_in(Tensor t) { return {std::move(t), false, true}; }

/// A shape of min_dims to max_dims dims with at most max_numel elements (size-0 dims rare).
inline Shape small_shape(Rng& rng, int min_dims = 0, int max_dims = 3, int64_t max_numel = 24, double p_zero = 0.03) {
  ShapeOptions o;
  o.min_dims = min_dims, o.max_dims = max_dims, o.max_size = 5, o.max_numel = max_numel, o.p_zero = p_zero;
  return random_shape(rng, o);
}

/// A random subset of [0, ndim) (possibly empty), as negative or positive dims.
inline std::vector<int64_t> random_dims(Rng& rng, int64_t ndim) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < ndim; ++d)
    if (rng.chance(0.4)) dims.push_back(rng.chance(0.5) ? d : d - ndim);
  return dims;
}

}  // namespace frugal::optest

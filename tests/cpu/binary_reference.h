#pragma once
// The float64 reference of a broadcasting binary op (tests/cpu/test_binary*.cpp): a naive loop
// over the broadcast shape, reading each operand through its broadcast index.
#include <functional>
#include <vector>

#include "tests/test_util.h"

namespace frugal::testing {

/// out[i] = f(a[bcast(i)], b[bcast(i)]) in double over `out_shape`.
inline std::vector<double> reference(const Tensor& a, const Tensor& b, const Shape& out_shape,
                                     const std::function<double(double, double)>& f) {
  const std::vector<double> va = values_of(a), vb = values_of(b);
  std::vector<double> out(size_t(numel_of(out_shape)));
  for (int64_t i = 0; i < int64_t(out.size()); ++i) {
    const std::vector<int64_t> idx = unravel(i, out_shape);
    out[size_t(i)] = f(va[size_t(broadcast_index(idx, a.sizes()))], vb[size_t(broadcast_index(idx, b.sizes()))]);
  }
  return out;
}

}  // namespace frugal::testing

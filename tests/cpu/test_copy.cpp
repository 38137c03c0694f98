// copy_ and the raw copies under it: every dtype pair, broadcasting, strided destinations,
// and sources that overlap the destination.
#include <doctest/doctest.h>

#include <vector>

#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("copy_ converts dtypes, broadcasts and writes through strides") {
  for (DType dst : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
    for (DType src : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
      CAPTURE(dtype_name(dst));
      CAPTURE(dtype_name(src));
      // Small integers (and 0/1 for bool) are exact in every dtype.
      std::vector<double> vals = {0, 1, 2, 3, 0, 7, 1, 5, 0, 4, 2, 1};
      if (src == kBool || dst == kBool)
        for (auto& v : vals) v = v != 0 ? 1.0 : 0.0;
      Tensor s = make_tensor(vals, {3, 4}, src, Layout::Transposed);
      Tensor d = zeros({4, 6}, dst).slice(1, 0, 6, 2).t();  // (3, 4) strided destination
      d.copy_(s);
      check_close(d, vals, 0, 0, "copy_");
    }
  }
  Tensor row = from_vector(std::vector<double>{1, 2, 3});
  Tensor m = zeros({2, 3});
  m.copy_(row);
  CHECK(values_of(m) == std::vector<double>{1, 2, 3, 1, 2, 3});
  check_error([&] { m.copy_(zeros({2})); }, {"copy_", "[2]", "[2, 3]"});
  CHECK(from_vector(std::vector<double>{2.7, -2.7}).to(kInt32).tolist<int32_t>() == std::vector<int32_t>{2, -2});
}

TEST_CASE("copy_ from a view overlapping the destination reads the source as it was") {
  // m.copy_(m.t()) used to read elements it had already overwritten (6 of 16 wrong for a
  // 4x4), and a shifted same-dtype view went through memcpy on overlapping ranges.
  const Tensor m = arange(0, 16, 1.0, {kFloat32}).view({4, 4});
  m.copy_(m.t());
  std::vector<float> want;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) want.push_back(float(j * 4 + i));
  CHECK(m.tolist<float>() == want);
  for (int64_t n : {5, 4000}) {  // small and large rows, shifted either way
    const Tensor right = arange(0, double(n), 1.0, {kFloat64});
    right.narrow(0, 1, n - 1).copy_(right.narrow(0, 0, n - 1));
    const Tensor left = arange(0, double(n), 1.0, {kFloat64});
    left.narrow(0, 0, n - 1).copy_(left.narrow(0, 1, n - 1));
    const std::vector<double> r = right.tolist<double>(), l = left.tolist<double>();
    for (int64_t i = 1; i < n; ++i) CHECK(r[size_t(i)] == double(i - 1));
    for (int64_t i = 0; i + 1 < n; ++i) CHECK(l[size_t(i)] == double(i + 1));
  }
  const Tensor x = arange(0, 6, 1.0, {kFloat32});
  x.copy_(x);  // the same view: nothing to do
  CHECK(x.tolist<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
}

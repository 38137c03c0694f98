// fill_ and the factories that fill (full, eye, arange) on CUDA against the CPU, in every
// dtype and through a strided view.
#include <doctest/doctest.h>

#include <vector>

#include "tensor/factory.h"
#include "tensor/ops/fill.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda: fill and factories") {
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
    Tensor x = full({3, 5}, 1.0, {t, cuda()});
    check_close(x, std::vector<double>(15, 1.0), 0, 0, dtype_name(t));
    ops::fill_(x.slice(1, 0, 5, 2), 0.0);
    const std::vector<double> v = values_of(x);
    for (int i = 0; i < 15; ++i) REQUIRE(v[i] == ((i % 5) % 2 == 0 ? 0.0 : 1.0));
  }
  check_close(eye(3, 3, {kFloat16, cuda()}), values_of(eye(3)), 0, 0, "eye");
  check_close(arange(0.0, 10.0, 0.5, {kBFloat16, cuda()}), values_of(arange(0.0, 10.0, 0.5)), 0, 0, "arange");
}

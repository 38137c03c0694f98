// fill_ and the factories that fill (full, eye, arange) on CUDA against the CPU, in every
// dtype and through a strided view.
#include <doctest/doctest.h>

#include <vector>

#include "tensor/cuda_graph.h"
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

// arange fills on the device (a captured step may make one): each value start + i * step in
// double, converted as a float64 host tensor's to() converts it, for every dtype.
TEST_CASE("cuda: arange equals the float64 host values converted, in every dtype, and under a capture") {
  struct Range {
    double start, end, step;
  };
  for (Range r : {Range{0, 100003, 1}, Range{-3.5, 7.25, 0.3}, Range{10, -10, -0.7}, Range{5, 5, 1}}) {
    const int64_t n = std::max<int64_t>(0, int64_t(std::ceil((r.end - r.start) / r.step)));
    std::vector<double> host(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) host[size_t(i)] = r.start + double(i) * r.step;
    const Tensor reference = from_vector(host, {n}, TensorOptions(kFloat64));
    for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
      CAPTURE(dtype_name(t));
      CAPTURE(r.start);
      const Tensor got = arange(r.start, r.end, r.step, {t, cuda()});
      REQUIRE(got.numel() == n);
      CHECK(values_of(got) == values_of(reference.to(t)));
    }
  }
  Tensor captured;
  CudaGraph graph(cuda());
  graph.capture([&] { captured = arange(0.0, 4097.0, 1.0, {kInt64, cuda()}); }, {.warmup = 0});
  ops::fill_(captured, -1.0);
  graph.replay();
  CHECK(values_of(captured) == values_of(arange(4097)));
}

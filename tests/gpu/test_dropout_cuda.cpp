// dropout on CUDA against the CPU: the same mask bit for bit for the same generator state,
// in every floating dtype and for contiguous and transposed inputs, and the differentiable
// op's backward re-creating the forward's mask.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops/dropout.h"
#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda nn_functional: dropout masks are identical on CPU and CUDA for the same generator state") {
  for (DType dt : kFloatTypes) {
    for (int64_t n : {1, 3, 4, 1001, 262147}) {
      for (double p : {0.1, 0.5, 0.9}) {
        const std::string what = name_of(dt, {n}) + " p " + std::to_string(p);
        const DevicePair x = random_pair({n}, dt, uint64_t(n));
        Generator gc(42), gg(42);
        gc.set_state(42, 1000);
        gg.set_state(42, 1000);
        const auto rc = ops::dropout(x.cpu, p, &gc);
        const auto rg = ops::dropout(x.gpu, p, &gg);
        CHECK(rg.range.seed == rc.range.seed);
        CHECK(rg.range.counter == rc.range.counter);
        check_same(rg.out, rc.out, 0, 0, "dropout " + what);  // bit for bit: the same keep decisions and scale
        check_same(ops::dropout_with_range(x.gpu, p, rc.range), rc.out, 0, 0, "dropout_with_range " + what);
      }
    }
  }
  // Non-contiguous input: element i is row-major in x's shape on both devices.
  const DevicePair x = random_pair({40, 30}, kFloat32, 7, Layout::Transposed);
  Generator gc(3), gg(3);
  check_same(ops::dropout(x.gpu, 0.3, &gg).out, ops::dropout(x.cpu, 0.3, &gc).out, 0, 0, "transposed");
  // Autograd: the backward on CUDA re-creates the forward's mask.
  Generator g(11);
  const Tensor xs = x.gpu.detach().requires_grad_();
  const Tensor y = dropout(xs, 0.4, true, &g);
  y.backward(ones({40, 30}, {kFloat32, kGpu}));
  const std::vector<double> yv = values_of(y), gv = values_of(xs.grad());
  for (size_t i = 0; i < yv.size(); ++i) CHECK(gv[i] == (yv[i] == 0.0 ? 0.0 : double(float(1.0 / (1.0 - 0.4)))));
}

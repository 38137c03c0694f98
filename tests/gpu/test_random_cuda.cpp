// The Philox stream on CUDA: rand, randn and randint draw the CPU's numbers for the same
// generator state.
#include <doctest/doctest.h>

#include "tensor/factory.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda: Philox stream is the same on CPU and GPU") {
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(t));
    Generator gc(99), gg(99);
    check_close(rand({1000, 3}, {t, cuda()}, &gg), values_of(rand({1000, 3}, t, &gc)), 0, 0, "rand");
    // randn uses logf/sinf/cosf whose last bits may differ between libm and CUDA.
    check_close(randn({5001}, {t, cuda()}, &gg), values_of(randn({5001}, t, &gc)), default_rtol(t), 1e-5, "randn");
  }
  Generator gc(3), gg(3);
  check_close(randint(0, 1000, {4096}, {kInt64, cuda()}, &gg), values_of(randint(0, 1000, {4096}, kInt64, &gc)), 0, 0,
              "randint");
}

TEST_CASE("cuda: manual_seed seeds every device's draws (one default generator for the CPU and each GPU)") {
  for (int d = 0; d < cuda_device_count(); ++d) {
    CAPTURE(d);
    manual_seed(17);
    const std::vector<double> on_cpu = values_of(rand({257}));
    rand({3}, {kFloat32, cuda(d)});  // the stream moves on, whatever the device
    manual_seed(17);
    check_close(rand({257}, {kFloat32, cuda(d)}), on_cpu, 0, 0, "rand after manual_seed");
  }
}

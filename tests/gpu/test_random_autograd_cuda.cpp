// The random autograd programs of tests/random_programs.h on the GPU: the same program
// and leaves in float32 on CUDA and in float64 on the CPU give the same output and the
// same gradients (views, in-place ops, copy_ and broadcasts through the CUDA kernels).
#include <doctest/doctest.h>

#include "autograd/engine.h"
#include "tests/random_programs.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda random autograd programs: output and gradients match the CPU's float64 run") {
  for (uint64_t seed = 1; seed <= 80; ++seed) {
    const Program p = random_program(seed, 3, 3 + seed % 6);
    CAPTURE(seed);
    CAPTURE(p.str());
    const TensorList cpu_leaves = random_leaves(seed, 3);
    const TensorList gpu_leaves = random_leaves(seed, 3, {kFloat32, cuda()});
    const Tensor cpu_out = p.run(cpu_leaves), gpu_out = p.run(gpu_leaves);
    const TensorList cpu_grads = autograd::grad({cpu_out}, cpu_leaves, {}, false, /*allow_unused=*/true);
    const TensorList gpu_grads = autograd::grad({gpu_out}, gpu_leaves, {}, false, /*allow_unused=*/true);
    check_close(values_of(gpu_out.detach()), values_of(cpu_out.detach()), 1e-4, 1e-4, "output");
    for (size_t i = 0; i < cpu_grads.size(); ++i) {
      CAPTURE(i);
      REQUIRE(gpu_grads[i].defined() == cpu_grads[i].defined());
      if (!cpu_grads[i].defined()) continue;
      CHECK(gpu_grads[i].device() == cuda());
      check_close(values_of(gpu_grads[i]), values_of(cpu_grads[i]), 1e-4, 1e-4, "gradient");
    }
  }
}

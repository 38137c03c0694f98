// Random autograd programs: sequences of differentiable ops drawn at random (views,
// in-place ops, copy_, broadcasting, a tensor used in two branches), each program's
// gradient checked against central differences in float64, and autograd::grad checked
// against backward() and to leave every .grad as it was.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/all.h"
#include "tests/random_programs.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("random autograd programs: gradients match central differences in float64") {
  constexpr int kPrograms = 150;
  int checked = 0;
  for (uint64_t seed = 1; seed <= kPrograms; ++seed) {
    const Program p = random_program(seed, 3, 3 + seed % 6);
    CAPTURE(seed);
    CAPTURE(p.str());
    const autograd::GradcheckResult r =
        autograd::gradcheck([&](const TensorList& in) { return p.run(in); }, random_leaves(seed, 3));
    CHECK_MESSAGE(r.ok, r.report);
    ++checked;
  }
  CHECK(checked == kPrograms);
}

TEST_CASE("random autograd programs: autograd::grad equals backward and leaves every .grad as it was") {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    const Program p = random_program(seed + 1000, 3, 4 + seed % 5);
    CAPTURE(seed);
    CAPTURE(p.str());
    TensorList leaves = random_leaves(seed + 1000, 3);
    // A .grad from an earlier step on leaf 2, which grad() must not add to.
    const Tensor earlier = random_tensor({kRows, kCols}, kFloat64, seed + 5000);
    leaves[2].set_grad(earlier.clone());
    const TensorList requested = autograd::grad({p.run(leaves)}, {leaves[0], leaves[1]}, {}, false,
                                                /*allow_unused=*/true);
    CHECK_FALSE(leaves[0].grad().defined());
    CHECK_FALSE(leaves[1].grad().defined());
    CHECK(values_of(leaves[2].grad()) == values_of(earlier));
    // backward() on the same program: its .grad is what grad() returned.
    leaves[2].set_grad(Tensor());
    p.run(leaves).backward();
    for (size_t i = 0; i < 2; ++i) {
      CAPTURE(i);
      if (!requested[i].defined()) {  // the program does not read this leaf
        CHECK_FALSE(leaves[i].grad().defined());
        continue;
      }
      check_close(values_of(requested[i]), values_of(leaves[i].grad()), 1e-12, 1e-12);
    }
  }
}

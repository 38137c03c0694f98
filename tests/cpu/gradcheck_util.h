#pragma once
// The differentiable ops' CPU tests: float64 leaves and gradcheck with the report on failure
// (tests/cpu/test_<stem>.cpp, "the differentiable ops" sections).
#include <doctest/doctest.h>

#include <functional>

#include "autograd/gradcheck.h"
#include "tests/test_util.h"

namespace frugal::testing {

/// A contiguous float64 leaf that requires grad, values in [lo, hi).
inline Tensor leaf(const Shape& s, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  Tensor t = random_tensor(s, kFloat64, seed, Layout::Contiguous, lo, hi);
  t.requires_grad_();
  return t;
}

/// Checks f's backward against central differences at `inputs` (autograd::gradcheck);
/// prints the table of worst mismatches when it fails.
inline void check_gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                            const autograd::GradcheckOptions& options = {}) {
  const autograd::GradcheckResult r = autograd::gradcheck(f, inputs, options);
  CHECK_MESSAGE(r.ok, r.report);
}

}  // namespace frugal::testing

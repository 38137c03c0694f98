#pragma once
// Max-norm closeness for the CUDA-vs-CPU tests, where elementwise tolerances are too
// strict: cuDNN and the CPU sum in different orders, so entries near zero differ by a
// rounding of the largest value, not of their own.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace frugal::testing {

/// Checks max |actual - expected| <= rtol * max |expected| (shapes must match; a NaN
/// in `actual` fails); reports the worst entry.
inline void check_norm_close(const Tensor& actual, const Tensor& expected, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(actual.defined(), what, ": undefined");
  REQUIRE_MESSAGE(actual.sizes() == expected.sizes(), what, ": ", actual.describe(), " vs ", expected.describe());
  const std::vector<double> a = values_of(actual), e = values_of(expected);
  double emax = 0, dmax = 0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    emax = std::max(emax, std::fabs(e[i]));
    const double d = std::fabs(a[i] - e[i]);
    if (!(d <= dmax)) dmax = d, worst = i;  // NaN counts as the worst
  }
  CHECK_MESSAGE(dmax <= rtol * emax, what, ": max |diff| ", dmax, " at ", worst, " (got ", a.empty() ? 0.0 : a[worst],
                ", expected ", e.empty() ? 0.0 : e[worst], ") over max |expected| ", emax, ", rtol ", rtol);
}

}  // namespace frugal::testing

#pragma once
// The float64 reconstruction check shared by the CPU and CUDA svd tests.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace frugal::testing {

/// max |U diag(S) Vh - A| / scale over the row-major (m, n) matrix `a`, with `u` (m, k),
/// `s` (k) and `vh` (k, n): naive double loops, independent of the op under test.
inline double svd_reconstruction_error(const double* a, const double* u, const double* s, const double* vh, int64_t m,
                                       int64_t n, int64_t k, double scale) {
  double worst = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t l = 0; l < k; ++l) acc += u[i * k + l] * s[l] * vh[l * n + j];
      worst = std::max(worst, std::fabs(acc - a[i * n + j]) / scale);
    }
  return worst;
}

}  // namespace frugal::testing

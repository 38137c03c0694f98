#pragma once
// Helpers shared by the parallel-algorithm tests (test_tensor_parallel.cpp,
// test_pipeline.cpp, test_ddp.cpp): every rank of run_ranks stores what it computed in a
// slot of its own, and the main thread compares it with the single-process reference.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace frugal::testing {

/// f32 equivalence with a single-process run: 1e-5 relative, plus an absolute floor of
/// 1e-6 of the tensor's largest magnitude (entries that cancel to ~0 differ by rounding).
inline void check_equiv(const std::vector<double>& actual, const std::vector<double>& expected,
                        const std::string& what) {
  double scale = 0.0;
  for (double e : expected) scale = std::max(scale, std::fabs(e));
  check_close(actual, expected, 1e-5, 1e-6 * std::max(scale, 1e-30), what);
}
inline void check_equiv(const Tensor& actual, const Tensor& expected, const std::string& what) {
  REQUIRE_MESSAGE(actual.defined(), what, ": undefined");
  REQUIRE_MESSAGE(actual.sizes() == expected.sizes(), what, ": shape ", shape_str(actual.sizes()), " vs ",
                  shape_str(expected.sizes()));
  check_equiv(values_of(actual), values_of(expected), what);
}

/// One slot per rank, written by that rank's thread only.
template <typename T>
using PerRank = std::vector<T>;

/// A rank's named results, compared after the ranks have joined.
using Results = std::map<std::string, Tensor>;

}  // namespace frugal::testing

// The differentiable op table (tests/op_table/grad_table.h) on CUDA: every entry CUDA runs,
// forward and backward in float32, float16 and bfloat16 against the CPU's float64 run on the
// same rounded values (2x the CPU's tolerance), and its output dtype under CUDA autocast.
#include <doctest/doctest.h>

#include "tests/op_table/grad_table_check.h"

using namespace frugal;
using namespace frugal::optest;

namespace {
constexpr uint64_t kSeed = 1;
}  // namespace

TEST_CASE("grad table cuda: every differentiable op in float32, float16 and bfloat16 against the CPU's float64") {
  int64_t n = 0;
  for (DType dt : {kFloat32, kFloat16, kBFloat16})
    n += run_table(6, [dt](const GradEntry& e, int64_t i) { return run_dtype(e, kSeed, i, cuda(), dt); });
  MESSAGE(n, " cases of ", grad_table().size(), " ops");
}

TEST_CASE("grad table cuda: every differentiable op's output dtype under CUDA autocast is its policy's") {
  int64_t n = 0;
  for (DType low : {kFloat16, kBFloat16})
    n += run_table(3, [low](const GradEntry& e, int64_t i) { return run_autocast(e, kSeed, i, cuda(), low); });
  MESSAGE(n, " autocast cases of ", grad_table().size(), " ops");
}

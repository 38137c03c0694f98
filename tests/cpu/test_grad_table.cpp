// The differentiable op table (tests/op_table/grad_table.h) on the CPU: every entry's
// gradcheck (and gradgradcheck, where it has a double backward) in float64, its autocast
// dtype under CPU autocast (float16 and bfloat16), and its forward and backward in float32,
// float16 and bfloat16 against float64. `op_fuzz --grad` runs more cases.
#include <doctest/doctest.h>

#include "tests/op_table/grad_table_check.h"

using namespace frugal;
using namespace frugal::optest;

namespace {
constexpr uint64_t kSeed = 1;
}  // namespace

TEST_CASE("grad table: every differentiable op's backward against float64 central differences") {
  const int64_t n = run_table(40, [](const GradEntry& e, int64_t i) { return run_gradcheck(e, kSeed, i); });
  MESSAGE(n, " gradchecks of ", grad_table().size(), " ops");
}

TEST_CASE("grad table: every double backward against float64 central differences of gradients") {
  const int64_t n = run_table(6, [](const GradEntry& e, int64_t i) { return run_gradgradcheck(e, kSeed, i); });
  MESSAGE(n, " gradgradchecks");
  CHECK(n >= 790);  // 134 of the 135 entries have a double backward (flash attention: without dropout)
}

TEST_CASE("grad table: every differentiable op's output dtype under CPU autocast is its policy's") {
  int64_t n = 0;
  for (DType low : {kFloat16, kBFloat16})
    n += run_table(8, [low](const GradEntry& e, int64_t i) { return run_autocast(e, kSeed, i, kCPU, low); });
  MESSAGE(n, " autocast cases of ", grad_table().size(), " ops");
}

TEST_CASE("grad table: every differentiable op in float32, float16 and bfloat16 against float64 on the CPU") {
  int64_t n = 0;
  for (DType dt : {kFloat32, kFloat16, kBFloat16})
    n += run_table(12, [dt](const GradEntry& e, int64_t i) { return run_dtype(e, kSeed, i, kCPU, dt); });
  MESSAGE(n, " cases of ", grad_table().size(), " ops");
}

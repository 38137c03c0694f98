// The differential op test on CUDA: the op table's cases (tests/op_table/op_table.h) in
// float32, float16 and bfloat16, each run on the CPU and on the GPU from the same inputs
// in the same layouts, both checked against the float64 reference (the GPU with 4x the
// tolerance: its reductions accumulate in float where the CPU's use double).
#include <doctest/doctest.h>

#include "tests/op_table/op_table.h"

using namespace frugal;
using namespace frugal::optest;

TEST_CASE("differential ops: every op-table entry on CUDA and on the CPU against the float64 reference") {
  RunOptions options;
  options.device = cuda();
  options.dtypes = {kFloat32, kFloat16, kBFloat16};
  int64_t cases = 0;
  for (const OpEntry& op : op_table()) {
    int failed = 0;
    for (int64_t i = 0; i < 40 && failed < 3; ++i) {
      const CaseResult r = run_case(op, 1, i, options);
      cases += r.ran;
      if (!r.ok) ++failed;
      CHECK_MESSAGE(r.ok, r.message);
    }
  }
  MESSAGE(cases, " cases of ", op_table().size(), " ops");
}

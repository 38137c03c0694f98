#pragma once
// The doctest side of the differentiable op table, shared by the cpu and gpu suites'
// test_grad_table files.
#include <doctest/doctest.h>

#include <cstdint>

#include "tests/op_table/grad_table.h"

namespace frugal::optest {

/// Runs `cases` cases of every entry through `run` (a GradResult of (entry, case index)),
/// reporting each failure, at most two per op (the first failures of an op say enough);
/// returns how many cases ran.
template <typename Run>
int64_t run_table(int64_t cases, Run&& run) {
  constexpr int kReportedPerOp = 2;
  int64_t ran = 0;
  for (const GradEntry& e : grad_table()) {
    int failed = 0;
    for (int64_t i = 0; i < cases && failed < kReportedPerOp; ++i) {
      const GradResult r = run(e, i);
      ran += r.ran;
      if (!r.ok) ++failed;
      CHECK_MESSAGE(r.ok, r.message);
    }
  }
  return ran;
}

}  // namespace frugal::optest

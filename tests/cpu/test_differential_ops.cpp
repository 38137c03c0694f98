// The differential op test (tests/op_table/op_table.h): a fixed-seed sample of cases of
// every op-table entry, run on the CPU and checked against the entry's float64
// reference. build/tests/op_fuzz runs as many more cases as one likes, with other seeds.
#include <doctest/doctest.h>

#include "tests/op_table/op_table.h"

using namespace frugal::optest;

namespace {

constexpr uint64_t kSeed = 1;
constexpr int64_t kCasesPerOp = 200;  // about 20 s in a release build
constexpr int kReportedPerOp = 3;     // the first failures of an op say enough

}  // namespace

TEST_CASE("differential ops: every op-table entry on the CPU against its float64 reference") {
  int64_t cases = 0;
  for (const OpEntry& op : op_table()) {
    int failed = 0;
    for (int64_t i = 0; i < kCasesPerOp && failed < kReportedPerOp; ++i) {
      const CaseResult r = run_case(op, kSeed, i);
      cases += r.ran;
      if (!r.ok) ++failed;
      CHECK_MESSAGE(r.ok, r.message);
    }
  }
  MESSAGE(cases, " cases of ", op_table().size(), " ops");
}

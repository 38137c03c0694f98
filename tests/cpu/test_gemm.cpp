// The CPU GEMM of every x86-64 level this CPU runs (Note [GEMM kernels per instruction set]
// in tensor/cpu/gemm.cpp) against a float64 triple loop: both operand orders, leading
// dimensions wider than a row, size-0 and size-1 sides, accumulation, sizes straddling the
// blocking threshold; and each level gives the same bits at 1 and 2 threads.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/threads.h"
#include "tensor/cpu/gemm.h"
#include "tests/cpu_scopes.h"
#include "tests/gemm_matrix.h"

using namespace frugal;
using namespace frugal::ops::cpu;
using namespace frugal::testing;

namespace {

struct Case {
  int64_t M, N, K;
};

/// out = (accumulate ? out : 0) + a @ b for one level, checked element by element against
/// float64 loops with a bound of K eps sum |a_ik b_kj| (plus the starting value's rounding).
template <typename T>
void check_level(GemmIsa isa, const Case& c, bool a_row, bool b_row, int64_t pad, bool accumulate) {
  std::mt19937 rng(uint32_t(c.M * 131 + c.N * 17 + c.K));
  const GemmMatrix<T> a(c.M, c.K, a_row, pad, rng), b(c.K, c.N, b_row, pad, rng);
  const int64_t ldc = c.N + pad;
  std::vector<T> out(size_t(std::max<int64_t>(c.M * ldc, 1)), T(0.25));
  const std::vector<T> start = out;
  {
    LevelScope level(isa);
    gemm(a.op, b.op, out.data(), ldc, accumulate);
  }
  const double eps = std::is_same_v<T, float> ? 0x1p-24 : 0x1p-53;
  int bad = 0;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double want = accumulate ? double(start[size_t(i * ldc + j)]) : 0.0, mag = std::abs(want);
      for (int64_t k = 0; k < c.K; ++k) {
        want += a.at(i, k) * b.at(k, j);
        mag += std::abs(a.at(i, k) * b.at(k, j));
      }
      const double got = double(out[size_t(i * ldc + j)]);
      if (!(std::abs(got - want) <= 2.0 * double(c.K + 2) * eps * mag + 1e-300)) ++bad;
    }
  for (int64_t i = 0; i < c.M; ++i)  // the padding of out is not written
    for (int64_t j = c.N; j < ldc; ++j) bad += out[size_t(i * ldc + j)] != T(0.25);
  CHECK_MESSAGE(bad == 0, gemm_isa_name(isa), " ", (std::is_same_v<T, float> ? "float32" : "float64"), " M=", c.M,
                " N=", c.N, " K=", c.K, " a ", (a_row ? "row" : "col"), "-major, b ", (b_row ? "row" : "col"),
                "-major, pad ", pad, accumulate ? ", accumulate" : "", ": ", bad, " elements off");
}

const std::vector<Case> kCases = {
    {0, 5, 3},     {4, 0, 3},    {3, 4, 0},    {1, 1, 1},     {1, 37, 19}, {29, 1, 33},
    {7, 9, 1},     {17, 23, 31}, {64, 65, 66}, {150, 40, 70},  // 150 * 40 * 70 > 2^18: blocks of rows on threads
    {40, 150, 70},                                             // blocks of columns
};

}  // namespace

TEST_CASE("gemm: every level this CPU runs against float64 loops, every operand order and padding") {
  int levels = 0;
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    ++levels;
    for (const Case& c : kCases)
      for (bool a_row : {true, false})
        for (bool b_row : {true, false})
          for (int64_t pad : {0, 3})
            for (bool accumulate : {false, true}) {
              check_level<float>(isa, c, a_row, b_row, pad, accumulate);
              if (pad == 0) check_level<double>(isa, c, a_row, b_row, pad, accumulate);
            }
  }
  CHECK(levels >= 1);  // x86-64-v2 is the library's own baseline
  MESSAGE(levels, " levels checked; in use: ", gemm_isa_name(gemm_isa()));
}

TEST_CASE("gemm: the default level is the widest this CPU runs, unless FRUGAL_CPU_ISA chose one") {
  if (std::getenv("FRUGAL_CPU_ISA")) return;
  GemmIsa widest = GemmIsa::X86_64_V2;
  for (GemmIsa isa : kLevels)
    if (cpu_supports(isa)) widest = isa;
  CHECK(gemm_isa() == widest);
  CHECK(std::string(gemm_isa_name(GemmIsa::X86_64_V4)) == "x86-64-v4");
}

TEST_CASE("gemm: each level gives the same bits at 1 and 2 threads (blocks follow the shapes)") {
  std::mt19937 rng(7);
  const GemmMatrix<float> a(300, 90, true, 0, rng), b(90, 70, false, 0, rng);  // 1.9M multiply-adds: 7 blocks
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    LevelScope level(isa);
    std::vector<float> one(300 * 70), two(300 * 70);
    {
      ThreadScope threads(1);
      gemm(a.op, b.op, one.data(), 70, false);
    }
    {
      ThreadScope threads(2);
      gemm(a.op, b.op, two.data(), 70, false);
    }
    CHECK_MESSAGE(one == two, gemm_isa_name(isa));
  }
}

// The bfloat16 GEMM on AVX512-BF16 (Note [bfloat16 GEMM] in tensor/cpu/gemm_bf16_kernel.cpp)
// against float64 loops: both operand orders, leading dimensions wider than a row, odd K, tails
// of every block (K past 512, N past 1024, M past 144), accumulation; the same bits at 1 and 2
// threads; NaN and inf; subnormals counted as zero; and matmul, bmm and linear in bfloat16
// through it against the float32-copy path of x86-64-v3. On a CPU without the extension the
// kernel must refuse and the ops keep the float32-copy path.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/factory.h"
#include "tensor/half.h"
#include "tensor/ops/matmul.h"
#include "tests/cpu_scopes.h"
#include "tests/gemm_matrix.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::ops::cpu;
using namespace frugal::testing;

namespace {

struct Case {
  int64_t M, N, K;
};

/// out = (accumulate ? out : 0) + a @ b, element by element against float64 loops, within
/// 2 (K + 2) eps32 sum |a_ik b_kj| (each pair adds in two float32 roundings).
void check_case(const Case& c, bool a_row, bool b_row, int64_t pad, bool accumulate) {
  std::mt19937 rng(uint32_t(c.M * 131 + c.N * 17 + c.K));
  const GemmMatrix<BFloat16> a(c.M, c.K, a_row, pad, rng), b(c.K, c.N, b_row, pad, rng);
  const int64_t ldc = c.N + pad;
  std::vector<float> out(size_t(std::max<int64_t>(c.M * ldc, 1)), 0.25f);
  gemm(a.op, b.op, out.data(), ldc, accumulate);
  int bad = 0;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double want = accumulate ? 0.25 : 0.0, mag = std::abs(want);
      for (int64_t k = 0; k < c.K; ++k) {
        want += a.at(i, k) * b.at(k, j);
        mag += std::abs(a.at(i, k) * b.at(k, j));
      }
      const double got = out[size_t(i * ldc + j)];
      if (!(std::abs(got - want) <= 2.0 * double(c.K + 2) * 0x1p-24 * mag + 1e-300)) ++bad;
    }
  for (int64_t i = 0; i < c.M; ++i)  // the padding of out is not written
    for (int64_t j = c.N; j < ldc; ++j) bad += out[size_t(i * ldc + j)] != 0.25f;
  CHECK_MESSAGE(bad == 0, "M=", c.M, " N=", c.N, " K=", c.K, " a ", (a_row ? "row" : "col"), "-major, b ",
                (b_row ? "row" : "col"), "-major, pad ", pad, accumulate ? ", accumulate" : "", ": ", bad,
                " elements off");
}

/// A scope that runs the native kernel's level, or reports why the test cannot.
bool native_available() {
  if (!cpu_supports(GemmIsa::X86_64_V4)) return false;
  LevelScope level(GemmIsa::X86_64_V4);
  return gemm_bf16_native();
}

}  // namespace

TEST_CASE("gemm bf16: against float64 loops, every operand order, padding, odd K and block tails") {
  if (!native_available()) {
    MESSAGE("this CPU has no AVX512-BF16: checking that the kernel refuses");
    std::mt19937 rng(1);
    const GemmMatrix<BFloat16> a(2, 2, true, 0, rng), b(2, 2, true, 0, rng);
    std::vector<float> out(4);
    CHECK_THROWS_WITH(gemm(a.op, b.op, out.data(), 2, false), doctest::Contains("AVX512-BF16"));
    return;
  }
  LevelScope level(GemmIsa::X86_64_V4);
  const std::vector<Case> cases = {
      {0, 5, 3},   {4, 0, 3},     {3, 4, 0},     {1, 1, 1},     {1, 37, 19},   {29, 1, 33},      {7, 9, 1},
      {13, 33, 3}, {12, 32, 512}, {25, 65, 513}, {150, 40, 70}, {40, 150, 70}, {150, 1030, 520},  // every block's tail:
                                                                                                  // M past 144 rows, N
                                                                                                  // past 1024 columns,
                                                                                                  // K past 512
  };
  for (const Case& c : cases)
    for (bool a_row : {true, false})
      for (bool b_row : {true, false})
        for (int64_t pad : {int64_t(0), int64_t(3)})
          for (bool accumulate : {false, true}) {
            if (c.M * c.N * c.K > 1000000 && (pad != 0 || accumulate)) continue;  // the big case: orders only
            check_case(c, a_row, b_row, pad, accumulate);
          }
}

TEST_CASE("gemm bf16: the same bits at 1 and 2 threads; NaN and inf propagate; subnormals count as zero") {
  if (!native_available()) return;  // the refusal is checked above
  LevelScope level(GemmIsa::X86_64_V4);
  std::mt19937 rng(7);
  const GemmMatrix<BFloat16> a(300, 90, true, 0, rng), b(90, 70, false, 0, rng);  // 1.9M multiply-adds: 7 blocks
  std::vector<float> one(300 * 70), two(300 * 70);
  {
    ThreadScope threads(1);
    gemm(a.op, b.op, one.data(), 70, false);
  }
  {
    ThreadScope threads(2);
    gemm(a.op, b.op, two.data(), 70, false);
  }
  CHECK(one == two);

  // Row 0 of a holds a NaN, row 1 an inf against b's positive column 0 and zero column 1.
  std::vector<BFloat16> av(3 * 4, BFloat16(1.0f)), bv(4 * 2, BFloat16(0.0f));
  av[1] = BFloat16(NAN);
  av[4 + 2] = BFloat16(INFINITY);
  for (int k = 0; k < 4; ++k) bv[size_t(k * 2)] = BFloat16(0.5f);
  std::vector<float> out(3 * 2);
  gemm(GemmOperand<BFloat16>{av.data(), 3, 4, 4, true}, GemmOperand<BFloat16>{bv.data(), 4, 2, 2, true}, out.data(), 2,
       false);
  CHECK(std::isnan(out[0]));
  CHECK(std::isnan(out[1]));  // NaN * 0
  CHECK(out[2] == INFINITY);
  CHECK(std::isnan(out[3]));  // inf * 0
  CHECK(out[4] == 2.0f);
  CHECK(out[5] == 0.0f);

  // 2^-70 * 2^-70 = 2^-140: a float32 subnormal, which the instruction flushes to zero (as
  // oneDNN's bfloat16 GEMM); the normal 2^-60 * 2^-60 stays.
  std::vector<BFloat16> tiny = {BFloat16(0x1p-70f), BFloat16(0x1p-60f)},
                        ones = {BFloat16(0x1p-70f), BFloat16(0x1p-60f)};
  float r[2] = {1.0f, 1.0f};
  gemm(GemmOperand<BFloat16>{tiny.data(), 1, 1, 1, true}, GemmOperand<BFloat16>{ones.data(), 1, 1, 1, true}, r, 1,
       false);
  gemm(GemmOperand<BFloat16>{tiny.data() + 1, 1, 1, 1, true}, GemmOperand<BFloat16>{ones.data() + 1, 1, 1, 1, true},
       r + 1, 1, false);
  CHECK(r[0] == 0.0f);
  CHECK(r[1] == 0x1p-120f);
}

TEST_CASE("gemm bf16: matmul, bmm and linear in bfloat16 on the native kernel against the float32-copy path") {
  if (!native_available()) return;
  manual_seed(3);  // the default generator: randn below
  const Tensor x = randn({37, 70}).to(kBFloat16), w = randn({45, 70}).to(kBFloat16), bias = randn({45}).to(kBFloat16);
  const Tensor a3 = randn({3, 19, 33}).to(kBFloat16), b3 = randn({33, 21}).to(kBFloat16).expand({3, 33, 21});
  auto run_all = [&] {
    return std::vector<Tensor>{ops::matmul(x, w.t()), ops::matmul(x.t().contiguous().t(), w.t()),
                               ops::linear(x, w, bias), ops::matmul(a3, b3), ops::matmul(x.narrow(0, 0, 0), w.t())};
  };
  std::vector<Tensor> native, copies;
  {
    LevelScope level(GemmIsa::X86_64_V4);
    native = run_all();
  }
  {
    LevelScope level(GemmIsa::X86_64_V3);
    copies = run_all();
  }
  // Both round a float32 sum once to bfloat16: they differ by at most one bfloat16 ulp where
  // their float32 sums straddle a rounding boundary, and agree with float64 to half an ulp plus that.
  const std::vector<Tensor> exact = {ops::matmul(x.to(kFloat64), w.to(kFloat64).t()),
                                     ops::matmul(x.to(kFloat64), w.to(kFloat64).t()),
                                     ops::linear(x.to(kFloat64), w.to(kFloat64), bias.to(kFloat64)),
                                     ops::matmul(a3.to(kFloat64), b3.to(kFloat64)), empty({0, 45}, {kFloat64, kCPU})};
  for (size_t i = 0; i < native.size(); ++i) {
    CAPTURE(i);
    CHECK(native[i].dtype() == kBFloat16);
    CHECK(native[i].sizes() == copies[i].sizes());
    check_close(values_of(native[i]), values_of(exact[i]), 1.0 / 128, 1e-2, "native against float64");
    check_close(values_of(native[i]), values_of(copies[i]), 1.0 / 128, 1e-2, "native against float32 copies");
  }
  CHECK(values_of(native[0]) == values_of(native[1]));  // a column-major copy of x reads the same numbers

  // mm's widening form (a float32 result, as the backward of an autocast linear asks for the
  // weight gradient): no bfloat16 rounding at all, float32 accumulation on both paths.
  Tensor wide_native, wide_copies;
  const Tensor g = randn({37, 45}).to(kBFloat16);  // (M, out): weight gradient g^T x, (45, 70)
  {
    LevelScope level(GemmIsa::X86_64_V4);
    wide_native = ops::mm(g.t(), x, kFloat32);
  }
  {
    LevelScope level(GemmIsa::X86_64_V3);
    wide_copies = ops::mm(g.t(), x, kFloat32);
  }
  CHECK(wide_native.dtype() == kFloat32);
  const std::vector<double> wide_exact = values_of(ops::mm(g.to(kFloat64).t(), x.to(kFloat64)));
  check_close(values_of(wide_native), wide_exact, 1e-5, 1e-5, "widening mm, native");
  check_close(values_of(wide_copies), wide_exact, 1e-5, 1e-5, "widening mm, float32 copies");
}

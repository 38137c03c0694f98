// CUDA atan2, hypot, logaddexp and the division-like ops against the CPU ops on the same
// inputs (tests/cpu/test_binary_math.cpp checks the CPU against float64 loops): every floating
// dtype, broadcast and non-contiguous operands, mixed dtypes, integer division bit for bit
// (every sign, the minimum integer by -1), the integer division-by-zero error, and the
// differentiable ops' gradients (tests/gpu/autograd_check.h).
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "autograd/ops/binary_math.h"
#include "autograd/ops/operators.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tests/gpu/autograd_check.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Op = std::function<Tensor(const Tensor&, const Tensor&)>;

struct MathCase {
  std::string name;
  Op op;
  bool divides;  // exact: the division-like ops compute the same exact steps on both devices
};

std::vector<MathCase> math_cases() {
  return {
      {"atan2", [](const Tensor& a, const Tensor& b) { return ops::atan2(a, b); }, false},
      {"hypot", [](const Tensor& a, const Tensor& b) { return ops::hypot(a, b); }, false},
      {"logaddexp", [](const Tensor& a, const Tensor& b) { return ops::logaddexp(a, b); }, false},
      {"remainder", [](const Tensor& a, const Tensor& b) { return ops::remainder(a, b); }, true},
      {"fmod", [](const Tensor& a, const Tensor& b) { return ops::fmod(a, b); }, true},
      {"floor_divide", [](const Tensor& a, const Tensor& b) { return ops::floor_divide(a, b); }, true},
      {"div(trunc)", [](const Tensor& a, const Tensor& b) { return ops::div(a, b, "trunc"); }, true},
  };
}

void check_matches_cpu(const Tensor& gpu, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  REQUIRE_MESSAGE(gpu.device() == cuda(), what);
  REQUIRE_MESSAGE(gpu.dtype() == cpu.dtype(), what);
  REQUIRE_MESSAGE(gpu.sizes() == cpu.sizes(), what);
  check_close(values_of(gpu), values_of(cpu), rtol, atol, what);
}

/// Both devices' results of op on the same values.
void compare(const MathCase& c, const std::vector<double>& va, const Shape& sa, DType ta, const std::vector<double>& vb,
             const Shape& sb, DType tb, Layout layout, const std::string& what) {
  const Tensor cpu = c.op(make_tensor(va, sa, {ta}, layout), make_tensor(vb, sb, {tb}, layout));
  const Tensor gpu = c.op(make_tensor(va, sa, {ta, cuda()}, layout), make_tensor(vb, sb, {tb, cuda()}, layout));
  // The division-like ops are exact up to the final rounding on both; libm and CUDA's
  // atan2/hypot/log1p differ by an ulp or two.
  const DType out = cpu.dtype();
  const double rtol = c.divides ? 0 : default_rtol(out), atol = c.divides ? 0 : out == kFloat64 ? 1e-13 : 1e-6;
  check_matches_cpu(gpu, cpu, rtol, atol, what);
}

}  // namespace

TEST_CASE("cuda binary math: every op matches the CPU, broadcast, in every dtype and layout") {
  const std::vector<std::pair<Shape, Shape>> shapes = {{{33, 65}, {33, 65}}, {{3, 1, 65}, {7, 65}}, {{40, 9}, {1}},
                                                       {{}, {5, 6}},         {{6, 1}, {1, 130}},    {{0, 4}, {4}}};
  uint64_t seed = 71;
  for (const MathCase& c : math_cases()) {
    for (DType dt : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
      for (const auto& [sa, sb] : shapes) {
        for (Layout layout : kAllLayouts) {
          std::vector<double> va = random_values(numel_of(sa), seed++, -6.0, 6.0);
          std::vector<double> vb = random_values(numel_of(sb), seed++, -3.0, 3.0);
          if (c.divides)  // and a few zero divisors: IEEE's inf and NaN on both
            for (size_t i = 0; i < vb.size(); ++i) vb[i] = i % 17 == 3 ? 0.0 : vb[i];
          compare(c, va, sa, dt, vb, sb, dt, layout,
                  c.name + " " + dtype_name(dt) + " " + shape_str(sa) + " with " + shape_str(sb) + " " +
                      layout_name(layout));
        }
      }
    }
  }
}

TEST_CASE("cuda binary math: integer division bit for bit, mixed dtypes, scalars, the zero-divisor error") {
  std::vector<double> va, vb;
  for (int a = -9; a <= 9; ++a)
    for (int b = -4; b <= 4; ++b)
      if (b != 0) va.push_back(a), vb.push_back(b);
  va.push_back(-2147483648.0);  // the minimum int32 by -1 wraps
  vb.push_back(-1);
  const Shape s{int64_t(va.size())};
  for (const MathCase& c : math_cases()) {
    if (!c.divides) continue;
    for (DType dt : {kInt32, kInt64})
      for (Layout layout : kAllLayouts) compare(c, va, s, dt, vb, s, dt, layout, c.name + " " + name_of(dt, layout));
    compare(c, va, s, kInt32, vb, s, kFloat16, Layout::Strided, c.name + " int32 with float16");
    compare(c, va, s, kFloat16, vb, s, kFloat32, Layout::Transposed, c.name + " float16 with float32");
  }
  const Tensor x_cpu = make_tensor(va, s, {kInt64}), x_gpu = make_tensor(va, s, {kInt64, cuda()});
  check_matches_cpu(ops::remainder(x_gpu, -3.0), ops::remainder(x_cpu, -3.0), 0, 0, "remainder scalar");
  check_matches_cpu(ops::floor_divide(x_gpu, 4.0), ops::floor_divide(x_cpu, 4.0), 0, 0, "floor_divide scalar");
  check_matches_cpu(ops::fmod(x_gpu, 2.5), ops::fmod(x_cpu, 2.5), 0, 0, "fmod scalar 2.5");
  // A zero divisor among integers is refused on CUDA too (the count of zeros waits for the device).
  const Tensor z = make_tensor({1, 0, 2}, {3}, {kInt32, cuda()});
  check_error(
      [&] {
        ops::remainder(make_tensor({5, 6, 7}, {3}, {kInt32, cuda()}), z);
      },
      {"remainder", "integer division by zero", "cuda:0"});
  check_error([&] { ops::floor_divide(z, 0.0); }, {"floor_divide", "by zero"});
  check_error([&] { ops::atan2(z, make_tensor({1}, {1}, {kFloat32})); }, {"atan2", "cuda:0", "cpu"});
}

TEST_CASE("cuda autograd ops: atan2, hypot, logaddexp, remainder, fmod and the rounded divisions match the CPU") {
  using L = const TensorList&;
  const Shape s{33, 65};
  run_autograd_cases({
      {"atan2", {grad_input(s), grad_input({1, 65}, 0.5, 2.0)}, [](L in) { return atan2(in[0], in[1]); }},
      {"hypot", {grad_input({33, 1}, 0.5, 2.0), grad_input(s)}, [](L in) { return hypot(in[0], in[1]); }},
      {"logaddexp", {grad_input(s), grad_input({65})}, [](L in) { return logaddexp(in[0], in[1]); }},
      {"remainder and %",
       {grad_input(s), grad_input({1, 65}, 0.5, 2.0)},
       [](L in) { return remainder(in[0], in[1]) + in[0] % 0.75; }},
      {"fmod", {grad_input(s), grad_input(s, 0.5, 2.0)}, [](L in) { return fmod(in[0], in[1]) + fmod(in[0], -1.5); }},
      {"rounded divisions",
       {grad_input(s), grad_input(s, 0.5, 2.0)},
       [](L in) { return floor_divide(in[0], in[1]) + div(in[0], in[1], "trunc") + in[0] * 2.0; }},
  });
}

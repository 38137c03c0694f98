// CUDA binary ops against the CPU ops on the same inputs: arithmetic, comparisons,
// logical ops, where, masked_fill and in-place ops, in f32/f16/bf16/f64 (and the
// integer dtypes where they apply), contiguous, non-contiguous, broadcast and mixed
// dtypes; plus the device-mismatch errors. The differentiable ops and the operators,
// forward values and gradients (tests/gpu/autograd_check.h), and mixed-dtype gradients.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/operators.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tests/gpu/autograd_check.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kFloatTypes[] = {kFloat32, kFloat16, kBFloat16, kFloat64};

double small_atol(DType t) { return t == kFloat64 ? 1e-13 : t == kFloat32 ? 1e-6 : default_rtol(t) * 0.05; }

using BinaryFnT = std::function<Tensor(const Tensor&, const Tensor&)>;

struct BinaryCase {
  std::string name;
  BinaryFnT op;
  bool positive_a = false;  // pow: a > 0
  bool positive_b = false;  // div: b away from 0
  bool exact = false;       // comparisons and selections: bit-identical results
};

std::vector<BinaryCase> binary_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return ops::add(a, b); }},
      {"add(alpha)", [](const Tensor& a, const Tensor& b) { return ops::add(a, b, -1.5); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return ops::sub(a, b, 2.0); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return ops::mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return ops::div(a, b); }, false, true},
      {"maximum", [](const Tensor& a, const Tensor& b) { return ops::maximum(a, b); }, false, false, true},
      {"minimum", [](const Tensor& a, const Tensor& b) { return ops::minimum(a, b); }, false, false, true},
      {"pow", [](const Tensor& a, const Tensor& b) { return ops::pow(a, b); }, true},
      {"eq", [](const Tensor& a, const Tensor& b) { return ops::eq(a, b); }, false, false, true},
      {"ne", [](const Tensor& a, const Tensor& b) { return ops::ne(a, b); }, false, false, true},
      {"lt", [](const Tensor& a, const Tensor& b) { return ops::lt(a, b); }, false, false, true},
      {"le", [](const Tensor& a, const Tensor& b) { return ops::le(a, b); }, false, false, true},
      {"gt", [](const Tensor& a, const Tensor& b) { return ops::gt(a, b); }, false, false, true},
      {"ge", [](const Tensor& a, const Tensor& b) { return ops::ge(a, b); }, false, false, true},
  };
}

struct ShapePair {
  Shape a, b;
};
const std::vector<ShapePair> kShapePairs = {
    {{33, 65}, {33, 65}}, {{3, 1, 65}, {7, 65}}, {{40, 9}, {1}}, {{}, {5, 6}}, {{6, 1}, {1, 130}},
};

/// Values for one operand, identical on both devices. Comparisons get ties: values
/// on a 0.5 grid.
std::vector<double> operand_values(const BinaryCase& c, int64_t n, uint64_t seed, bool is_a) {
  const bool pos = is_a ? c.positive_a : c.positive_b;
  std::vector<double> v = random_values(n, seed, pos ? 0.25 : -2.0, 2.0);
  if (c.exact)
    for (double& x : v) x = std::round(x * 2) * 0.5;
  return v;
}

void check_matches_cpu(const Tensor& gpu, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  REQUIRE_MESSAGE(gpu.device() == cuda(), what);
  REQUIRE_MESSAGE(gpu.dtype() == cpu.dtype(), what);
  REQUIRE_MESSAGE(gpu.sizes() == cpu.sizes(), what);
  check_close(values_of(gpu), values_of(cpu), rtol, atol, what);
}

}  // namespace

TEST_CASE("cuda binary: every op matches the CPU, broadcast, in every dtype and layout") {
  uint64_t seed = 1;
  for (const BinaryCase& c : binary_cases()) {
    for (DType dt : kFloatTypes) {
      for (const ShapePair& sp : kShapePairs) {
        for (Layout layout : kAllLayouts) {
          const std::string what = c.name + " " + dtype_name(dt) + " " + shape_str(sp.a) + " with " + shape_str(sp.b) +
                                   " " + layout_name(layout);
          const auto va = operand_values(c, numel_of(sp.a), seed++, true);
          const auto vb = operand_values(c, numel_of(sp.b), seed++, false);
          const Tensor out_cpu = c.op(make_tensor(va, sp.a, {dt}, layout), make_tensor(vb, sp.b, {dt}, layout));
          const Tensor out_gpu =
              c.op(make_tensor(va, sp.a, {dt, cuda()}, layout), make_tensor(vb, sp.b, {dt, cuda()}, layout));
          const double rtol = c.exact ? 0 : default_rtol(dt), atol = c.exact ? 0 : small_atol(dt);
          check_matches_cpu(out_gpu, out_cpu, rtol, atol, what);
        }
      }
    }
  }
}

TEST_CASE("cuda binary: integer and bool operands") {
  const std::vector<double> va{-7, -1, 0, 3, 12, 5, 2, -3}, vb{2, -3, 4, 1, 0, 2, 10, -1};
  for (DType dt : {kInt32, kInt64}) {
    const std::string name = dtype_name(dt);
    const Tensor a_cpu = make_tensor(va, {2, 4}, {dt}), b_cpu = make_tensor(vb, {2, 4}, {dt}, Layout::Transposed);
    const Tensor a_gpu = make_tensor(va, {2, 4}, {dt, cuda()});
    const Tensor b_gpu = make_tensor(vb, {2, 4}, {dt, cuda()}, Layout::Transposed);
    for (const BinaryCase& c : binary_cases()) {
      if (c.name == "add(alpha)" || c.name == "pow") continue;  // non-integral alpha; pow below
      check_matches_cpu(c.op(a_gpu, b_gpu), c.op(a_cpu, b_cpu), 0, 0, c.name + " " + name);
    }
    check_matches_cpu(ops::pow(a_gpu, b_gpu), ops::pow(a_cpu, b_cpu), 0, 0, "pow " + name);
    check_matches_cpu(ops::mul(a_gpu, 3.0), ops::mul(a_cpu, 3.0), 0, 0, "mul scalar " + name);
    check_matches_cpu(ops::add(a_gpu, 0.5), ops::add(a_cpu, 0.5), 0, 0, "add 0.5 " + name);
  }
  const Tensor p_cpu = make_tensor({1, 0, 1, 1}, {4}, {kBool}), q_cpu = make_tensor({1, 1, 0}, {3, 1}, {kBool});
  const Tensor p_gpu = p_cpu.to(cuda()), q_gpu = q_cpu.to(cuda());
  check_matches_cpu(ops::logical_and(p_gpu, q_gpu), ops::logical_and(p_cpu, q_cpu), 0, 0, "logical_and");
  check_matches_cpu(ops::logical_or(p_gpu, q_gpu), ops::logical_or(p_cpu, q_cpu), 0, 0, "logical_or");
  check_matches_cpu(ops::logical_not(p_gpu), ops::logical_not(p_cpu), 0, 0, "logical_not");
  check_matches_cpu(ops::eq(p_gpu, q_gpu), ops::eq(p_cpu, q_cpu), 0, 0, "eq bool");
  const Tensor f_cpu = make_tensor({0, 2.5, -1}, {3}, {kFloat32});
  check_matches_cpu(ops::logical_or(f_cpu.to(cuda()), q_gpu), ops::logical_or(f_cpu, q_cpu), 0, 0, "logical_or f32");
}

TEST_CASE("cuda binary: mixed dtypes (dynamic-cast kernel) match the CPU") {
  struct Mixed {
    DType a, b;
  };
  const Mixed cases[] = {{kFloat16, kFloat32}, {kFloat32, kBFloat16}, {kFloat16, kBFloat16}, {kInt32, kFloat16},
                         {kInt64, kFloat64},   {kBool, kFloat32},     {kInt32, kInt64}};
  uint64_t seed = 700;
  for (const Mixed& m : cases) {
    for (Layout layout : kAllLayouts) {
      const std::string what = std::string(dtype_name(m.a)) + " with " + dtype_name(m.b) + " " + layout_name(layout);
      auto vals = [&](DType dt, int64_t n) {
        std::vector<double> v = random_values(n, seed++, -4.0, 4.0);
        for (double& x : v) x = dt == kBool ? double(x > 0) : is_floating(dt) ? x : std::round(x);
        return v;
      };
      const auto va = vals(m.a, 3 * 65), vb = vals(m.b, 7 * 65);
      const Tensor a_cpu = make_tensor(va, {3, 1, 65}, {m.a}, layout), b_cpu = make_tensor(vb, {7, 65}, {m.b}, layout);
      const Tensor a_gpu = make_tensor(va, {3, 1, 65}, {m.a, cuda()}, layout);
      const Tensor b_gpu = make_tensor(vb, {7, 65}, {m.b, cuda()}, layout);
      const DType out = promote_types(m.a, m.b);
      const double rtol = default_rtol(is_floating(out) ? out : kFloat64),
                   atol = is_floating(out) ? small_atol(out) : 0;
      check_matches_cpu(ops::add(a_gpu, b_gpu, 2), ops::add(a_cpu, b_cpu, 2), rtol, atol, "add " + what);
      check_matches_cpu(ops::mul(a_gpu, b_gpu), ops::mul(a_cpu, b_cpu), rtol, atol, "mul " + what);
      check_matches_cpu(ops::div(a_gpu, b_gpu), ops::div(a_cpu, b_cpu), default_rtol(ops::div(a_cpu, b_cpu).dtype()),
                        1e-6, "div " + what);
      check_matches_cpu(ops::ge(a_gpu, b_gpu), ops::ge(a_cpu, b_cpu), 0, 0, "ge " + what);
    }
  }
}

TEST_CASE("cuda binary: tensor-scalar ops") {
  for (DType dt : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      const std::string what = std::string(dtype_name(dt)) + " " + layout_name(layout);
      const Tensor x_cpu = random_tensor({33, 65}, {dt}, 9, layout, 0.5, 2.0);
      const Tensor x_gpu = random_tensor({33, 65}, {dt, cuda()}, 9, layout, 0.5, 2.0);
      const double rtol = default_rtol(dt), atol = small_atol(dt);
      check_matches_cpu(ops::add(x_gpu, 1.5), ops::add(x_cpu, 1.5), rtol, atol, "add " + what);
      check_matches_cpu(ops::sub(x_gpu, 0.25), ops::sub(x_cpu, 0.25), rtol, atol, "sub " + what);
      check_matches_cpu(ops::mul(x_gpu, -3.0), ops::mul(x_cpu, -3.0), rtol, atol, "mul " + what);
      check_matches_cpu(ops::div(x_gpu, 4.5), ops::div(x_cpu, 4.5), rtol, atol, "div " + what);
      check_matches_cpu(ops::lt(x_gpu, 1.25), ops::lt(x_cpu, 1.25), 0, 0, "lt " + what);
      check_matches_cpu(ops::eq(x_gpu, 1.0), ops::eq(x_cpu, 1.0), 0, 0, "eq " + what);
    }
  }
}

TEST_CASE("cuda binary: large contiguous tensors (vectorized path with a tail), misaligned operands") {
  for (DType dt : kFloatTypes) {
    const std::string name = dtype_name(dt);
    const Shape big{4'000'037};
    const Tensor a_cpu = random_tensor(big, {dt}, 1), b_cpu = random_tensor(big, {dt}, 2);
    const Tensor a_gpu = random_tensor(big, {dt, cuda()}, 1), b_gpu = random_tensor(big, {dt, cuda()}, 2);
    check_matches_cpu(ops::add(a_gpu, b_gpu), ops::add(a_cpu, b_cpu), default_rtol(dt), small_atol(dt), "add " + name);
    check_matches_cpu(ops::mul(a_gpu, b_gpu), ops::mul(a_cpu, b_cpu), default_rtol(dt), small_atol(dt), "mul " + name);
    check_matches_cpu(ops::gt(a_gpu, b_gpu), ops::gt(a_cpu, b_cpu), 0, 0, "gt " + name);
    // One operand one element off 16-byte alignment: the dense scalar loop.
    const int64_t n = 1001;
    const Tensor s_cpu = a_cpu.slice(0, 1, n + 1), s_gpu = a_gpu.slice(0, 1, n + 1);
    check_matches_cpu(ops::sub(s_gpu, b_gpu.slice(0, 0, n)), ops::sub(s_cpu, b_cpu.slice(0, 0, n)), default_rtol(dt),
                      small_atol(dt), "sub misaligned " + name);
  }
}

TEST_CASE("cuda binary: float32 with float16/bfloat16, dense and strided (the typed mixed kernels)") {
  // Note [Mixed float32 and 16-bit operands]: a residual stream plus a 16-bit branch, in
  // both orders, with a tail, one operand misaligned, broadcast, and in place.
  for (DType low : {kFloat16, kBFloat16}) {
    const std::string name = dtype_name(low);
    const Shape big{1'000'003};
    const Tensor x_cpu = random_tensor(big, {kFloat32}, 11), h_cpu = random_tensor(big, {low}, 12);
    const Tensor x_gpu = x_cpu.to(cuda()), h_gpu = h_cpu.to(cuda());
    check_matches_cpu(ops::add(x_gpu, h_gpu), ops::add(x_cpu, h_cpu), 1e-6, 1e-6, "f32 + " + name);
    check_matches_cpu(ops::add(h_gpu, x_gpu, -0.5), ops::add(h_cpu, x_cpu, -0.5), 1e-6, 1e-6, name + " - 0.5 f32");
    check_matches_cpu(ops::mul(h_gpu, x_gpu), ops::mul(h_cpu, x_cpu), 1e-6, 1e-6, name + " * f32");
    check_matches_cpu(ops::div(x_gpu, h_gpu), ops::div(x_cpu, h_cpu), 1e-6, 1e-6, "f32 / " + name);
    const int64_t n = 4097;
    check_matches_cpu(ops::add(x_gpu.slice(0, 1, n + 1), h_gpu.slice(0, 0, n)),
                      ops::add(x_cpu.slice(0, 1, n + 1), h_cpu.slice(0, 0, n)), 1e-6, 1e-6, "misaligned " + name);
    const Tensor row_cpu = random_tensor({1, 257}, {low}, 13), grid_cpu = random_tensor({33, 257}, {kFloat32}, 14);
    check_matches_cpu(ops::add(grid_cpu.to(cuda()), row_cpu.to(cuda())), ops::add(grid_cpu, row_cpu), 1e-6, 1e-6,
                      "broadcast " + name);
    Tensor acc_gpu = x_gpu.clone(), acc_cpu = x_cpu.clone();
    ops::add_(acc_gpu, h_gpu);
    ops::add_(acc_cpu, h_cpu);
    check_matches_cpu(acc_gpu, acc_cpu, 1e-6, 1e-6, "in place f32 += " + name);
  }
}

TEST_CASE("cuda binary: where and masked_fill") {
  uint64_t seed = 50;
  for (DType dt : {kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kBool}) {
    for (Layout layout : kAllLayouts) {
      const std::string what = std::string(dtype_name(dt)) + " " + layout_name(layout);
      std::vector<double> cv = random_values(3 * 65, seed++);
      for (double& x : cv) x = double(x > 0);
      auto vals = [&](int64_t n) {
        std::vector<double> v = random_values(n, seed++, -3.0, 3.0);
        for (double& x : v) x = dt == kBool ? double(x > 0) : is_floating(dt) ? x : std::round(x);
        return v;
      };
      const auto va = vals(7 * 65), vb = vals(65);
      const Tensor c_cpu = make_tensor(cv, {3, 1, 65}, {kBool}, layout),
                   c_gpu = make_tensor(cv, {3, 1, 65}, {kBool, cuda()}, layout);
      const Tensor a_cpu = make_tensor(va, {7, 65}, {dt}, layout),
                   a_gpu = make_tensor(va, {7, 65}, {dt, cuda()}, layout);
      const Tensor b_cpu = make_tensor(vb, {65}, {dt}, layout), b_gpu = make_tensor(vb, {65}, {dt, cuda()}, layout);
      check_matches_cpu(ops::where(c_gpu, a_gpu, b_gpu), ops::where(c_cpu, a_cpu, b_cpu), 0, 0, "where " + what);
      const Tensor m_cpu = c_cpu.select(0, 1), m_gpu = c_gpu.select(0, 1);  // (1, 65)
      check_matches_cpu(ops::masked_fill(a_gpu, m_gpu, 1.0), ops::masked_fill(a_cpu, m_cpu, 1.0), 0, 0,
                        "masked_fill " + what);
      const Tensor x_gpu = a_gpu.clone();
      const uint64_t v0 = x_gpu.version();
      ops::masked_fill_(x_gpu, m_gpu, -2.0);
      CHECK(x_gpu.version() == v0 + 1);
      check_matches_cpu(x_gpu, ops::masked_fill(a_cpu, m_cpu, -2.0), 0, 0, "masked_fill_ " + what);
    }
  }
  const Tensor c = make_tensor({1, 0, 1}, {3}, {kBool}, Layout::Contiguous);
  const Tensor w_cpu =
      ops::where(c, make_tensor({1.5, 2, 3}, {3}, {kFloat16}), make_tensor({7, 8, 9}, {3}, {kFloat32}));
  const Tensor w_gpu = ops::where(c.to(cuda()), make_tensor({1.5, 2, 3}, {3}, {kFloat16, cuda()}),
                                  make_tensor({7, 8, 9}, {3}, {kFloat32, cuda()}));
  check_matches_cpu(w_gpu, w_cpu, 0, 0, "where f16/f32");
}

TEST_CASE("cuda binary: in-place ops, version bumps and aliasing") {
  for (DType dt : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      const std::string what = std::string(dtype_name(dt)) + " " + layout_name(layout);
      const double rtol = default_rtol(dt), atol = small_atol(dt);
      const Tensor b_cpu = random_tensor({65}, {dt}, 3, Layout::Contiguous, 0.5, 2.0);
      const Tensor b_gpu = random_tensor({65}, {dt, cuda()}, 3, Layout::Contiguous, 0.5, 2.0);
      struct InPlace {
        const char* name;
        std::function<void(const Tensor&, const Tensor&)> op;
      };
      const InPlace cases[] = {
          {"add_", [](const Tensor& a, const Tensor& b) { ops::add_(a, b, 0.5); }},
          {"sub_", [](const Tensor& a, const Tensor& b) { ops::sub_(a, b); }},
          {"mul_", [](const Tensor& a, const Tensor& b) { ops::mul_(a, b); }},
          {"div_", [](const Tensor& a, const Tensor& b) { ops::div_(a, b); }},
          {"add_ scalar", [](const Tensor& a, const Tensor&) { ops::add_(a, 1.25); }},
          {"mul_ scalar", [](const Tensor& a, const Tensor&) { ops::mul_(a, -0.5); }},
          {"a += a", [](const Tensor& a, const Tensor&) { ops::add_(a, a); }},
          {"a *= a", [](const Tensor& a, const Tensor&) { ops::mul_(a, a); }},
          {"f32 rhs", [](const Tensor& a, const Tensor& b) { ops::add_(a, b.to(kFloat32)); }},
      };
      for (const InPlace& c : cases) {
        const Tensor a_cpu = random_tensor({33, 65}, {dt}, 4, layout);
        const Tensor a_gpu = random_tensor({33, 65}, {dt, cuda()}, 4, layout);
        const uint64_t v0 = a_gpu.version();
        c.op(a_cpu, b_cpu);
        c.op(a_gpu, b_gpu);
        CHECK_MESSAGE(a_gpu.version() == v0 + 1, c.name, " ", what);
        check_matches_cpu(a_gpu, a_cpu, rtol, atol, std::string(c.name) + " " + what);
      }
    }
  }
  // An overlapping view in another layout is read before it is overwritten.
  const Tensor m_cpu = random_tensor({65, 65}, {kFloat32}, 5), m_gpu = random_tensor({65, 65}, {kFloat32, cuda()}, 5);
  ops::add_(m_cpu, m_cpu.t());
  ops::add_(m_gpu, m_gpu.t());
  check_matches_cpu(m_gpu, m_cpu, 1e-6, 0, "m += m.t()");
}

TEST_CASE("cuda binary: empty and 0-d tensors") {
  const Tensor e = ops::add(empty({0, 3}, {kFloat16, cuda()}), ones({3}, {kFloat16, cuda()}));
  CHECK(e.sizes() == Shape{0, 3});
  CHECK(e.device() == cuda());
  const Tensor s = ops::mul(scalar_tensor(1.5, {kBFloat16, cuda()}), scalar_tensor(-2, {kBFloat16, cuda()}));
  CHECK(s.dim() == 0);
  check_close(s, {-3.0}, 0, 0, "0-d bf16");
  const Tensor bc = ops::sub(scalar_tensor(1, {kFloat32, cuda()}), ones({2, 3}, {kFloat32, cuda()}));
  check_close(bc, std::vector<double>(6, 0.0), 0, 0, "0-d - (2, 3)");
}

TEST_CASE("cuda binary: operands on different devices are an error") {
  const Tensor g = zeros({2, 3}, {kFloat32, cuda()}), c = zeros({2, 3});
  check_error([&] { ops::add(g, c); }, {"add", "cuda:0", "cpu"});
  check_error([&] { ops::eq(c, g); }, {"eq", "cuda:0", "cpu"});
  check_error([&] { ops::add_(g, c); }, {"add_", "cuda:0", "cpu"});
  check_error([&] { ops::where(zeros({2, 3}, {kBool, cuda()}), g, c); }, {"where", "cuda:0", "cpu"});
  check_error([&] { ops::masked_fill(g, zeros({3}, {kBool}), 0.0); }, {"masked_fill", "cuda:0", "cpu"});
  check_error([&] { ops::masked_fill_(g, zeros({3}, {kBool}), 0.0); }, {"masked_fill_", "cuda:0", "cpu"});
}

// ---- the differentiable ops on CUDA: autograd/ops/binary.h ------------------------------

namespace {

std::vector<AutogradCase> autograd_binary_cases() {
  using L = const TensorList&;
  const Shape s{33, 65};
  std::vector<AutogradCase> cases = {
      // Binary, broadcast (33, 1) with (1, 65), and same-shape.
      {"add alpha", {grad_input({33, 1}), grad_input({1, 65})}, [](L in) { return add(in[0], in[1], -2.0); }},
      {"sub", {grad_input(s), grad_input({65})}, [](L in) { return sub(in[0], in[1]); }},
      {"mul", {grad_input({33, 1}), grad_input(s)}, [](L in) { return mul(in[0], in[1]); }},
      {"div", {grad_input(s), grad_input({1, 65}, 0.5, 2.0)}, [](L in) { return div(in[0], in[1]); }},
      {"maximum", {grad_input(s), grad_input({33, 1})}, [](L in) { return maximum(in[0], in[1]); }},
      {"minimum", {grad_input(s), grad_input(s)}, [](L in) { return minimum(in[0], in[1]); }},
      {"pow", {grad_input(s, 0.5, 2.0), grad_input({65}, -1.5, 1.5)}, [](L in) { return frugal::pow(in[0], in[1]); }},
      {"scalar ops and operators",
       {grad_input(s), grad_input(s, 0.5, 2.0)},
       [](L in) { return (in[0] + 1.5) * 2.0 - in[1] / 4.0 + (2.0 - in[0]) + 3.0 / in[1] - (-in[1]); }},
      {"where",
       {grad_input({33, 1}), grad_input(s), const_input(s)},
       [](L in) { return where(gt(in[2], 0.0), in[0], in[1]); }},
      {"masked_fill", {grad_input({65}), const_input(s)}, [](L in) { return masked_fill(in[0], lt(in[1], 0.0), 3.0); }},
      {"in place on a non-leaf",
       {grad_input(s), grad_input({65}), grad_input(s), grad_input({33, 1}, 0.5, 2.0), const_input(s)},
       [](L in) {
         Tensor y = mul(in[0], 2.0);
         y += in[1];
         y *= in[2];
         y /= in[3];
         y -= 0.5;
         masked_fill_(y, gt(in[4], 1.0), 0.0);
         return y;
       }},
  };
  return cases;
}

}  // namespace

TEST_CASE("cuda autograd ops: binary, where, masked_fill, the operators and in-place forms match the CPU") {
  run_autograd_cases(autograd_binary_cases());
}

TEST_CASE("cuda autograd ops: mixed dtypes give gradients in each input's dtype") {
  Tensor a = random_tensor({4}, {kFloat32, cuda()}, 1), b = random_tensor({3, 1}, {kFloat16, cuda()}, 2);
  a.requires_grad_();
  b.requires_grad_();
  Tensor y = mul(a, b);
  REQUIRE(y.dtype() == kFloat32);
  y.backward(ones({3, 4}, {kFloat32, cuda()}));
  CHECK(a.grad().dtype() == kFloat32);
  CHECK(b.grad().dtype() == kFloat16);
  CHECK(a.grad().device().is_cuda());
  const std::vector<double> av = values_of(a), bv = values_of(b);
  check_close(a.grad(), std::vector<double>(4, bv[0] + bv[1] + bv[2]), 1e-6, 1e-6, "grad a");
  check_close(b.grad(), std::vector<double>(3, av[0] + av[1] + av[2] + av[3]), 2e-3, 2e-3, "grad b");
  check_error([&] { add(a, random_tensor({4}, kFloat32, 3)); }, {"add", "cuda:0", "cpu"});
}

TEST_CASE(
    "cuda binary: the inner-vector path (rows of a bias, column broadcasts, row-skipping views) matches the CPU") {
  // Note [Vectorized elementwise]: operands whose innermost dim runs along memory or is
  // broadcast go by vectors along it; a misaligned view or an odd inner size falls back to
  // the element-by-element path. Each case against the CPU op on the same values, in-place
  // and into a row-skipping output too.
  uint64_t seed = 100;
  for (DType dt : kFloatTypes) {
    CAPTURE(dtype_name(dt));
    const double rtol = default_rtol(dt), atol = small_atol(dt);
    auto both = [&](const Shape& s) {
      const std::vector<double> v = random_values(numel_of(s), seed++, -2.0, 2.0);
      return std::pair{make_tensor(v, s, {dt}), make_tensor(v, s, {dt, cuda()})};
    };
    const auto [wide_c, wide_g] = both({37, 80});  // views of it skip rows (row stride 80)
    const auto [odd_c, odd_g] = both({37, 68});    // row stride 68: a multiple of 4, not of 8
    const auto [bias_c, bias_g] = both({64});
    const auto [col_c, col_g] = both({37, 1});
    const auto [x_c, x_g] = both({37, 64});
    const auto [t3_c, t3_g] = both({3, 37, 64});
    const auto [mid_c, mid_g] = both({37, 1, 64});
    struct Case {
      const char* name;
      Tensor a_cpu, b_cpu, a_gpu, b_gpu;
    };
    const Case cases[] = {
        {"rows + bias", x_c, bias_c, x_g, bias_g},
        {"rows * column", x_c, col_c, x_g, col_g},
        {"aligned view + bias", wide_c.narrow(1, 8, 64), bias_c, wide_g.narrow(1, 8, 64), bias_g},
        {"misaligned view + bias", wide_c.narrow(1, 1, 64), bias_c, wide_g.narrow(1, 1, 64), bias_g},
        {"row stride 68 + bias", odd_c.narrow(1, 0, 64), bias_c, odd_g.narrow(1, 0, 64), bias_g},
        {"odd inner size", wide_c.narrow(1, 0, 63), bias_c.narrow(0, 0, 63), wide_g.narrow(1, 0, 63),
         bias_g.narrow(0, 0, 63)},
        {"3-D, middle broadcast", t3_c, mid_c.squeeze(1), t3_g, mid_g.squeeze(1)},
        {"3-D against (37, 1, 64)", mid_c.expand({37, 3, 64}), x_c.unsqueeze(1), mid_g.expand({37, 3, 64}),
         x_g.unsqueeze(1)},
    };
    for (const Case& c : cases) {
      CAPTURE(c.name);
      check_matches_cpu(ops::mul(c.a_gpu, c.b_gpu), ops::mul(c.a_cpu, c.b_cpu), rtol, atol, "mul");
      check_matches_cpu(ops::sub(c.a_gpu, c.b_gpu, 0.5), ops::sub(c.a_cpu, c.b_cpu, 0.5), rtol, atol, "sub");
    }
    // In place through a row-skipping view: the base's other columns stay as they were.
    const Tensor base_c = wide_c.clone(), base_g = wide_g.clone();
    ops::add_(base_c.narrow(1, 8, 64), bias_c);
    ops::add_(base_g.narrow(1, 8, 64), bias_g);
    check_matches_cpu(base_g, base_c, rtol, atol, "add_ into an aligned view");
    // Copies of a broadcast bias, same dtype and converted (float32 in, 16-bit out).
    const Tensor rows_g = empty({37, 64}, {dt, cuda()});
    rows_g.copy_(bias_g.expand({37, 64}));
    check_matches_cpu(rows_g, bias_c.expand({37, 64}).contiguous(), 0, 0, "copy of a bias over rows");
    const Tensor f32_bias = bias_g.to(kFloat32);
    rows_g.copy_(f32_bias.expand({37, 64}));
    check_matches_cpu(rows_g, bias_c.to(kFloat32).expand({37, 64}).to(dt), 0, 0, "converting copy over rows");
  }
}

// CUDA unary ops against the CPU ops on the same inputs: every op, f32/f16/bf16/f64,
// contiguous (aligned, misaligned, large with a vector tail) and non-contiguous; the fused
// derivative kernels (ops::unary_backward) likewise; and the differentiable ops, forward
// values and gradients (tests/gpu/autograd_check.h).
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "autograd/ops/unary.h"
#include "tensor/factory.h"
#include "tensor/ops/unary.h"
#include "tests/gpu/autograd_check.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using ops::UnaryOp;

namespace {

constexpr DType kFloatTypes[] = {kFloat32, kFloat16, kBFloat16, kFloat64};

double small_atol(DType t) { return t == kFloat64 ? 1e-13 : t == kFloat32 ? 1e-6 : default_rtol(t) * 0.05; }

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  double lo = -3.0, hi = 3.0;
};

std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", ops::neg},
      {"exp", ops::exp},
      {"log", ops::log, 0.05, 5.0},
      {"sqrt", ops::sqrt, 0.0, 5.0},
      {"rsqrt", ops::rsqrt, 0.05, 5.0},
      {"tanh", ops::tanh},
      {"sigmoid", ops::sigmoid, -8.0, 8.0},
      {"relu", ops::relu},
      {"gelu", ops::gelu},
      {"gelu_tanh", ops::gelu_tanh},
      {"silu", ops::silu},
      {"abs", ops::abs},
      {"square", ops::square},
      {"reciprocal", ops::reciprocal, 0.1, 4.0},
      {"sin", ops::sin, -6.0, 6.0},
      {"cos", ops::cos, -6.0, 6.0},
      {"pow(3)", [](const Tensor& x) { return ops::pow(x, 3.0); }},
      {"pow(-1.5)", [](const Tensor& x) { return ops::pow(x, -1.5); }, 0.2, 4.0},
      {"affine", [](const Tensor& x) { return ops::affine(x, 1.5, -0.25); }},
      {"clamp", [](const Tensor& x) { return ops::clamp(x, -0.5, 0.75); }},
      {"tan", ops::tan, -1.2, 1.2},
      {"asin", ops::asin, -1.0, 1.0},
      {"acos", ops::acos, -1.0, 1.0},
      {"atan", ops::atan, -6.0, 6.0},
      {"sinh", ops::sinh, -5.0, 5.0},
      {"cosh", ops::cosh, -5.0, 5.0},
      {"asinh", ops::asinh, -6.0, 6.0},
      {"acosh", ops::acosh, 1.0, 6.0},
      {"atanh", ops::atanh, -0.95, 0.95},
      {"erf", ops::erf},
      {"erfc", ops::erfc, -1.0, 4.0},
      {"expm1", ops::expm1},
      {"exp2", ops::exp2, -6.0, 6.0},
      {"log2", ops::log2, 0.05, 9.0},
      {"log10", ops::log10, 0.05, 9.0},
      {"logsigmoid", ops::logsigmoid, -20.0, 20.0},
      {"selu", ops::selu, -5.0, 3.0},
      {"celu(0.5)", [](const Tensor& x) { return ops::celu(x, 0.5); }, -5.0, 3.0},
      {"softsign", ops::softsign},
      {"tanhshrink", ops::tanhshrink},
      {"hardshrink", [](const Tensor& x) { return ops::hardshrink(x, 0.5); }},
      {"softshrink", [](const Tensor& x) { return ops::softshrink(x, 0.5); }},
      {"threshold", [](const Tensor& x) { return ops::threshold(x, 0.25, -2.0); }},
      {"floor", ops::floor, -4.0, 4.0},
      {"ceil", ops::ceil, -4.0, 4.0},
      {"trunc", ops::trunc, -4.0, 4.0},
      {"round", ops::round, -4.0, 4.0},
      {"sign", ops::sign},
  };
}

/// The CUDA result against the CPU result: same shape and dtype, values within tolerance.
void check_matches_cpu(const Tensor& gpu, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  REQUIRE_MESSAGE(gpu.device() == cuda(), what);
  REQUIRE_MESSAGE(gpu.dtype() == cpu.dtype(), what);
  REQUIRE_MESSAGE(gpu.sizes() == cpu.sizes(), what);
  check_close(values_of(gpu), values_of(cpu), rtol, atol, what);
}

}  // namespace

TEST_CASE("cuda unary: every op matches the CPU in every dtype and layout") {
  uint64_t seed = 1;
  for (const UnaryCase& c : unary_cases()) {
    for (DType dt : kFloatTypes) {
      for (Layout layout : kAllLayouts) {
        for (const Shape& shape : {Shape{6, 9}, Shape{129, 67}}) {
          const std::string what = c.name + " " + dtype_name(dt) + " " + layout_name(layout) + " " + shape_str(shape);
          const Tensor x_cpu = random_tensor(shape, {dt}, seed, layout, c.lo, c.hi);
          const Tensor x_gpu = random_tensor(shape, {dt, cuda()}, seed, layout, c.lo, c.hi);
          ++seed;
          check_matches_cpu(c.op(x_gpu), c.op(x_cpu), default_rtol(dt), small_atol(dt), what);
        }
      }
    }
  }
}

TEST_CASE("cuda unary: misaligned and large contiguous tensors (vector path, scalar tail)") {
  for (DType dt : kFloatTypes) {
    // Offset by one element: dense but not 16-byte aligned, so the scalar dense loop runs.
    const int64_t n = 1000;
    const Tensor base_cpu = random_tensor({n + 1}, {dt}, 3);
    const Tensor base_gpu = random_tensor({n + 1}, {dt, cuda()}, 3);
    const Tensor x_cpu = base_cpu.slice(0, 1, n + 1), x_gpu = base_gpu.slice(0, 1, n + 1);
    REQUIRE(x_gpu.is_contiguous());
    const std::string name = dtype_name(dt);
    check_matches_cpu(ops::gelu(x_gpu), ops::gelu(x_cpu), default_rtol(dt), small_atol(dt), "gelu misaligned " + name);
    // More elements than one grid pass covers, and not a multiple of the vector width.
    const Shape big{5'000'003};
    const Tensor y_cpu = random_tensor(big, {dt}, 4), y_gpu = random_tensor(big, {dt, cuda()}, 4);
    check_matches_cpu(ops::relu(y_gpu), ops::relu(y_cpu), 0, 0, "relu large " + name);
    check_matches_cpu(ops::silu(y_gpu), ops::silu(y_cpu), default_rtol(dt), small_atol(dt), "silu large " + name);
    check_matches_cpu(ops::affine(y_gpu, -2.0, 0.5), ops::affine(y_cpu, -2.0, 0.5), default_rtol(dt), small_atol(dt),
                      "affine large " + name);
  }
}

TEST_CASE("cuda unary: integer ops, empty and 0-d tensors") {
  for (DType dt : {kInt32, kInt64}) {
    const std::vector<double> v{-7, -1, 0, 3, 12, -40000, 46340, 65536};
    const Tensor x_cpu = make_tensor(v, {2, 4}, {dt}, Layout::Transposed);
    const Tensor x_gpu = make_tensor(v, {2, 4}, {dt, cuda()}, Layout::Transposed);
    const std::string name = dtype_name(dt);
    check_matches_cpu(ops::neg(x_gpu), ops::neg(x_cpu), 0, 0, "neg " + name);
    check_matches_cpu(ops::abs(x_gpu), ops::abs(x_cpu), 0, 0, "abs " + name);
    check_matches_cpu(ops::relu(x_gpu), ops::relu(x_cpu), 0, 0, "relu " + name);
    check_matches_cpu(ops::square(x_gpu), ops::square(x_cpu), 0, 0, "square " + name);
  }
  for (DType dt : kFloatTypes) {
    const Tensor e = ops::exp(empty({0, 5}, {dt, cuda()}));
    CHECK(e.sizes() == Shape{0, 5});
    CHECK(e.device() == cuda());
    const Tensor s_cpu = scalar_tensor(0.3, {dt}), s_gpu = scalar_tensor(0.3, {dt, cuda()});
    const Tensor t = ops::sigmoid(s_gpu);
    CHECK(t.dim() == 0);
    check_matches_cpu(t, ops::sigmoid(s_cpu), default_rtol(dt), 0, std::string("sigmoid 0-d ") + dtype_name(dt));
  }
}

TEST_CASE("cuda unary: errors") {
  check_error([] { ops::exp(zeros({2}, {kInt32, cuda()})); }, {"exp", "int32[2] cuda:0"});
  check_error([] { ops::neg(zeros({2}, {kBool, cuda()})); }, {"neg", "bool[2] cuda:0"});
}

// ---- the derivative kernels: ops::unary_backward ----------------------------------------

namespace {

struct BackwardKernelCase {
  std::string name;
  UnaryOp op;
  double a = 0, b = 0, lo = -3.0, hi = 3.0;
};

std::vector<BackwardKernelCase> backward_kernel_cases() {
  return {{"neg", UnaryOp::Neg},
          {"exp", UnaryOp::Exp},
          {"log", UnaryOp::Log, 0, 0, 0.1, 4.0},
          {"sqrt", UnaryOp::Sqrt, 0, 0, 0.1, 4.0},
          {"rsqrt", UnaryOp::Rsqrt, 0, 0, 0.2, 4.0},
          {"tanh", UnaryOp::Tanh},
          {"sigmoid", UnaryOp::Sigmoid},
          {"relu", UnaryOp::Relu},
          {"gelu", UnaryOp::Gelu},
          {"gelu_tanh", UnaryOp::GeluTanh},
          {"silu", UnaryOp::Silu},
          {"abs", UnaryOp::Abs},
          {"square", UnaryOp::Square},
          {"reciprocal", UnaryOp::Reciprocal, 0, 0, 0.2, 4.0},
          {"sin", UnaryOp::Sin, 0, 0, -6.0, 6.0},
          {"cos", UnaryOp::Cos, 0, 0, -6.0, 6.0},
          {"pow(3)", UnaryOp::Pow, 3.0},
          {"pow(-1.5)", UnaryOp::Pow, -1.5, 0, 0.3, 4.0},
          {"tan", UnaryOp::Tan, 0, 0, -1.2, 1.2},
          {"asin", UnaryOp::Asin, 0, 0, -0.9, 0.9},
          {"acos", UnaryOp::Acos, 0, 0, -0.9, 0.9},
          {"atan", UnaryOp::Atan},
          {"sinh", UnaryOp::Sinh},
          {"cosh", UnaryOp::Cosh},
          {"asinh", UnaryOp::Asinh},
          {"acosh", UnaryOp::Acosh, 0, 0, 1.3, 5.0},
          {"atanh", UnaryOp::Atanh, 0, 0, -0.8, 0.8},
          {"erf", UnaryOp::Erf},
          {"erfc", UnaryOp::Erfc},
          {"expm1", UnaryOp::Expm1},
          {"exp2", UnaryOp::Exp2},
          {"log2", UnaryOp::Log2, 0, 0, 0.1, 4.0},
          {"log10", UnaryOp::Log10, 0, 0, 0.1, 4.0},
          {"logsigmoid", UnaryOp::LogSigmoid, 0, 0, -8.0, 8.0},
          {"selu", UnaryOp::Selu, 0, 0, -5.0, 3.0},
          {"celu(0.5)", UnaryOp::Celu, 0.5, 0, -5.0, 3.0},
          {"softsign", UnaryOp::Softsign},
          {"tanhshrink", UnaryOp::Tanhshrink},
          {"hardshrink", UnaryOp::Hardshrink, 0.5},
          {"softshrink", UnaryOp::Softshrink, 0.5},
          {"threshold", UnaryOp::Threshold, 0.25, -2.0},
          {"affine", UnaryOp::Affine, 1.5, -0.25},
          {"clamp", UnaryOp::Clamp, -0.5, 0.75}};
}

}  // namespace

TEST_CASE("cuda unary_backward: every fused kernel matches the CPU in every dtype and layout") {
  const DType dtypes[] = {kFloat32, kFloat16, kBFloat16, kFloat64};
  uint64_t seed = 1;
  for (const BackwardKernelCase& c : backward_kernel_cases()) {
    for (DType dt : dtypes) {
      for (Layout layout : kAllLayouts) {
        for (const Shape& shape : {Shape{7, 9}, Shape{129, 67}}) {
          const std::string what = c.name + " " + dtype_name(dt) + " " + layout_name(layout) + " " + shape_str(shape);
          CAPTURE(what);
          const Tensor x_cpu = random_tensor(shape, {dt}, seed, layout, c.lo, c.hi);
          const Tensor x_gpu = random_tensor(shape, {dt, cuda()}, seed, layout, c.lo, c.hi);
          const Tensor g_cpu = random_tensor(shape, {dt}, seed + 1000);
          const Tensor g_gpu = random_tensor(shape, {dt, cuda()}, seed + 1000);
          ++seed;
          // The saved value: y for the ops whose derivative reads the output, from the CPU
          // forward on both sides so only the backward kernels are compared.
          const bool from_out = ops::unary_grad_from(c.op) == ops::UnaryGradFrom::Output;
          const Tensor v_cpu = from_out ? ops::unary(c.op, x_cpu, c.a, c.b) : x_cpu;
          const Tensor v_gpu = from_out ? v_cpu.to(cuda()) : x_gpu;
          const Tensor got = ops::unary_backward(c.op, g_gpu, v_gpu, c.a, c.b);
          const Tensor expected = ops::unary_backward(c.op, g_cpu, v_cpu, c.a, c.b);
          REQUIRE(got.device().is_cuda());
          REQUIRE(got.dtype() == dt);
          const double rtol = dt == kFloat64 ? 1e-12 : default_rtol(dt);
          check_close(values_of(got), values_of(expected), rtol, dt == kFloat64 ? 1e-13 : rtol * 0.1, what);
        }
      }
    }
  }
  // Large and dense (vectorized path with a tail).
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    const Tensor x = random_tensor({1'000'003}, {dt}, 5), g = random_tensor({1'000'003}, {dt}, 6);
    const Tensor got = ops::unary_backward(UnaryOp::Gelu, g.to(cuda()), x.to(cuda()));
    check_close(values_of(got), values_of(ops::unary_backward(UnaryOp::Gelu, g, x)), default_rtol(dt),
                default_rtol(dt) * 0.1, std::string("gelu large ") + dtype_name(dt));
  }
  check_error(
      [] {
        ops::unary_backward(UnaryOp::Gelu, zeros({2}, {kFloat32, cuda()}), zeros({2}));
      },
      {"gelu_backward", "cuda:0", "cpu"});
}

// ---- the differentiable ops on CUDA: autograd/ops/unary.h -------------------------------

namespace {

std::vector<AutogradCase> autograd_unary_cases() {
  using L = const TensorList&;
  const Shape s{33, 65};
  std::vector<AutogradCase> cases = {
      {"neg", {grad_input(s)}, [](L in) { return neg(in[0]); }},
      {"exp", {grad_input(s)}, [](L in) { return frugal::exp(in[0]); }},
      {"log", {grad_input(s, 0.1, 4.0)}, [](L in) { return frugal::log(in[0]); }},
      {"sqrt", {grad_input(s, 0.1, 4.0)}, [](L in) { return frugal::sqrt(in[0]); }},
      {"rsqrt", {grad_input(s, 0.2, 4.0)}, [](L in) { return rsqrt(in[0]); }},
      {"tanh", {grad_input(s)}, [](L in) { return frugal::tanh(in[0]); }},
      {"sigmoid", {grad_input(s, -6.0, 6.0)}, [](L in) { return sigmoid(in[0]); }},
      {"relu", {grad_input(s)}, [](L in) { return relu(in[0]); }},
      {"gelu", {grad_input(s, -4.0, 4.0)}, [](L in) { return gelu(in[0]); }},
      {"gelu_tanh", {grad_input(s, -4.0, 4.0)}, [](L in) { return gelu_tanh(in[0]); }},
      {"silu", {grad_input(s, -6.0, 6.0)}, [](L in) { return silu(in[0]); }},
      {"abs", {grad_input(s)}, [](L in) { return frugal::abs(in[0]); }},
      {"square", {grad_input(s)}, [](L in) { return square(in[0]); }},
      {"reciprocal", {grad_input(s, 0.2, 4.0)}, [](L in) { return reciprocal(in[0]); }},
      {"sin", {grad_input(s, -6.0, 6.0)}, [](L in) { return frugal::sin(in[0]); }},
      {"cos", {grad_input(s, -6.0, 6.0)}, [](L in) { return frugal::cos(in[0]); }},
      {"pow(3)", {grad_input(s)}, [](L in) { return frugal::pow(in[0], 3.0); }},
      {"pow(-1.5)", {grad_input(s, 0.3, 4.0)}, [](L in) { return frugal::pow(in[0], -1.5); }},
      {"affine", {grad_input(s)}, [](L in) { return affine(in[0], 1.5, -0.25); }},
      {"clamp", {grad_input(s)}, [](L in) { return clamp(in[0], -0.5, 0.75); }},
      {"gelu of a transposed view", {grad_input({65, 33})}, [](L in) { return gelu(in[0].t()); }},
  };
  return cases;
}

}  // namespace

TEST_CASE("cuda autograd ops: unary forward and gradients match the CPU") {
  run_autograd_cases(autograd_unary_cases());
}

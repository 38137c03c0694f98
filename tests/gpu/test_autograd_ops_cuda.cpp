// Differentiable ops on CUDA against the CPU: for every op of autograd/ops/{elementwise,
// reduce,shape}.h and the operators, forward values and every input gradient from the
// same inputs and upstream gradient, in f32, f16 and bf16; and the fused raw kernels
// ops::unary_backward, CUDA vs CPU in every float dtype and layout.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/ops/all.h"
#include "tensor/factory.h"
#include "tensor/ops/unary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using ops::UnaryOp;

namespace {

constexpr DType kAutogradTypes[] = {kFloat32, kFloat16, kBFloat16};

/// Tolerance for CUDA vs CPU after a forward and a backward: both round the same
/// intermediates, but in different orders (reductions) and with different libm's.
double cross_tol(DType t) { return t == kFloat32 ? 1e-4 : t == kFloat16 ? 1e-2 : 5e-2; }

void check_same(const Tensor& gpu, const Tensor& cpu, DType dt, double scale, const std::string& what) {
  REQUIRE_MESSAGE(gpu.defined(), what);
  REQUIRE_MESSAGE(cpu.defined(), what);
  REQUIRE_MESSAGE(gpu.device().is_cuda(), what);
  REQUIRE_MESSAGE(gpu.dtype() == cpu.dtype(), what);
  REQUIRE_MESSAGE(gpu.sizes() == cpu.sizes(), what);
  const std::vector<double> expected = values_of(cpu);
  double peak = 1.0;
  for (double v : expected)
    if (std::isfinite(v)) peak = std::max(peak, std::fabs(v));
  const double tol = cross_tol(dt) * scale;
  check_close(values_of(gpu), expected, tol, tol * peak, what);
}

/// One input of a case: a random floating tensor in the case's dtype (requires grad unless
/// `grad` is false), or an int64 index tensor with values in [0, hi).
struct Input {
  Shape shape;
  double lo = -2.0, hi = 2.0;
  bool grad = true;
  bool index = false;
};

Input values(Shape s, double lo = -2.0, double hi = 2.0) { return {std::move(s), lo, hi, true, false}; }
Input constant(Shape s, double lo = -2.0, double hi = 2.0) { return {std::move(s), lo, hi, false, false}; }
Input indices(Shape s, int64_t n) { return {std::move(s), 0.0, double(n), false, true}; }

struct Case {
  std::string name;
  std::vector<Input> inputs;
  std::function<Tensor(const TensorList&)> f;
  double tol_scale = 1.0;
};

Tensor make_input(const Input& in, DType dt, uint64_t seed, Device device) {
  if (in.index) {
    std::vector<int64_t> v;
    for (double r : random_values(numel_of(in.shape), seed, 0.0, in.hi)) v.push_back(int64_t(r));
    return from_vector(v, in.shape).to(device);
  }
  return random_tensor(in.shape, {dt, device}, seed, Layout::Contiguous, in.lo, in.hi);
}

void run_case(const Case& c, DType dt) {
  const std::string what = c.name + " " + dtype_name(dt);
  CAPTURE(what);
  TensorList cpu_in, gpu_in;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    cpu_in.push_back(make_input(c.inputs[k], dt, 100 + k, kCPU));
    gpu_in.push_back(make_input(c.inputs[k], dt, 100 + k, cuda()));
    if (c.inputs[k].grad) {
      cpu_in.back().requires_grad_();
      gpu_in.back().requires_grad_();
    }
  }
  const Tensor y_cpu = c.f(cpu_in), y_gpu = c.f(gpu_in);
  check_same(y_gpu, y_cpu, dt, c.tol_scale, what + " forward");
  REQUIRE(y_cpu.requires_grad());
  REQUIRE(y_gpu.requires_grad());
  const Tensor up = random_tensor(y_cpu.sizes(), y_cpu.dtype(), 7);
  y_cpu.backward(up);
  y_gpu.backward(up.to(cuda()));
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    if (!c.inputs[k].grad) continue;
    REQUIRE_MESSAGE(gpu_in[k].grad().dtype() == gpu_in[k].dtype(), what);
    check_same(gpu_in[k].grad(), cpu_in[k].grad(), dt, c.tol_scale, what + " grad of input " + std::to_string(k));
  }
}

std::vector<Case> elementwise_cases() {
  using L = const TensorList&;
  const Shape s{33, 65};
  std::vector<Case> cases = {
      {"neg", {values(s)}, [](L in) { return neg(in[0]); }},
      {"exp", {values(s)}, [](L in) { return frugal::exp(in[0]); }},
      {"log", {values(s, 0.1, 4.0)}, [](L in) { return frugal::log(in[0]); }},
      {"sqrt", {values(s, 0.1, 4.0)}, [](L in) { return frugal::sqrt(in[0]); }},
      {"rsqrt", {values(s, 0.2, 4.0)}, [](L in) { return rsqrt(in[0]); }},
      {"tanh", {values(s)}, [](L in) { return frugal::tanh(in[0]); }},
      {"sigmoid", {values(s, -6.0, 6.0)}, [](L in) { return sigmoid(in[0]); }},
      {"relu", {values(s)}, [](L in) { return relu(in[0]); }},
      {"gelu", {values(s, -4.0, 4.0)}, [](L in) { return gelu(in[0]); }},
      {"gelu_tanh", {values(s, -4.0, 4.0)}, [](L in) { return gelu_tanh(in[0]); }},
      {"silu", {values(s, -6.0, 6.0)}, [](L in) { return silu(in[0]); }},
      {"abs", {values(s)}, [](L in) { return frugal::abs(in[0]); }},
      {"square", {values(s)}, [](L in) { return square(in[0]); }},
      {"reciprocal", {values(s, 0.2, 4.0)}, [](L in) { return reciprocal(in[0]); }},
      {"sin", {values(s, -6.0, 6.0)}, [](L in) { return frugal::sin(in[0]); }},
      {"cos", {values(s, -6.0, 6.0)}, [](L in) { return frugal::cos(in[0]); }},
      {"pow(3)", {values(s)}, [](L in) { return frugal::pow(in[0], 3.0); }},
      {"pow(-1.5)", {values(s, 0.3, 4.0)}, [](L in) { return frugal::pow(in[0], -1.5); }},
      {"affine", {values(s)}, [](L in) { return affine(in[0], 1.5, -0.25); }},
      {"clamp", {values(s)}, [](L in) { return clamp(in[0], -0.5, 0.75); }},
      {"gelu of a transposed view", {values({65, 33})}, [](L in) { return gelu(in[0].t()); }},
      // Binary, broadcast (33, 1) with (1, 65), and same-shape.
      {"add alpha", {values({33, 1}), values({1, 65})}, [](L in) { return add(in[0], in[1], -2.0); }},
      {"sub", {values(s), values({65})}, [](L in) { return sub(in[0], in[1]); }},
      {"mul", {values({33, 1}), values(s)}, [](L in) { return mul(in[0], in[1]); }},
      {"div", {values(s), values({1, 65}, 0.5, 2.0)}, [](L in) { return div(in[0], in[1]); }},
      {"maximum", {values(s), values({33, 1})}, [](L in) { return maximum(in[0], in[1]); }},
      {"minimum", {values(s), values(s)}, [](L in) { return minimum(in[0], in[1]); }},
      {"pow", {values(s, 0.5, 2.0), values({65}, -1.5, 1.5)}, [](L in) { return frugal::pow(in[0], in[1]); }},
      {"scalar ops and operators",
       {values(s), values(s, 0.5, 2.0)},
       [](L in) { return (in[0] + 1.5) * 2.0 - in[1] / 4.0 + (2.0 - in[0]) + 3.0 / in[1] - (-in[1]); }},
      {"where", {values({33, 1}), values(s), constant(s)}, [](L in) { return where(gt(in[2], 0.0), in[0], in[1]); }},
      {"masked_fill", {values({65}), constant(s)}, [](L in) { return masked_fill(in[0], lt(in[1], 0.0), 3.0); }},
      {"in place on a non-leaf",
       {values(s), values({65}), values(s), values({33, 1}, 0.5, 2.0), constant(s)},
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

std::vector<Case> reduce_shape_cases() {
  using L = const TensorList&;
  const Shape s{6, 37, 50};
  std::vector<Case> cases;
  for (bool keepdim : {false, true}) {
    const std::string k = keepdim ? " keepdim" : "";
    cases.push_back({"sum" + k, {values(s)}, [=](L in) { return sum(in[0], {0, 2}, keepdim); }});
    cases.push_back({"sum all" + k, {values(s)}, [=](L in) { return sum(in[0], {}, keepdim); }});
    cases.push_back({"mean" + k, {values(s)}, [=](L in) { return mean(in[0], {1}, keepdim); }});
    cases.push_back({"var" + k, {values(s)}, [=](L in) { return var(in[0], {-1}, 1, keepdim); }, 2.0});
    cases.push_back({"amax" + k, {values(s)}, [=](L in) { return amax(in[0], {1, 2}, keepdim); }});
    cases.push_back({"amin" + k, {values(s)}, [=](L in) { return amin(in[0].transpose(0, 2), {0}, keepdim); }});
    cases.push_back({"max" + k, {values(s)}, [=](L in) { return max(in[0], 1, keepdim).values; }});
    cases.push_back({"min" + k, {values(s)}, [=](L in) { return min(in[0], -1, keepdim).values; }});
  }
  for (int64_t dim : {0, 1, -1}) {
    const std::string d = " dim " + std::to_string(dim);
    cases.push_back({"softmax" + d, {values(s, -4.0, 4.0)}, [=](L in) { return softmax(in[0], dim); }});
    cases.push_back({"log_softmax" + d, {values(s, -4.0, 4.0)}, [=](L in) { return log_softmax(in[0], dim); }});
  }
  cases.push_back({"softmax long rows", {values({4, 3000}, -8.0, 8.0)}, [](L in) { return softmax(in[0], -1); }});
  cases.push_back({"cat", {values({3, 5}), constant({2, 5}), values({5, 4})}, [](L in) {
                     return cat({in[0], in[1], in[2].t()}, 0);
                   }});
  cases.push_back({"stack", {values({3, 5}), values({3, 5})}, [](L in) { return stack({in[0], in[1]}, 1); }});
  cases.push_back({"split partially used", {values({7, 9})}, [](L in) { return mul(split(in[0], 4, 1)[1], 3.0); }});
  cases.push_back({"chunk", {values({7, 9})}, [](L in) {
                     std::vector<Tensor> c = chunk(in[0], 3, 0);
                     return cat({square(c[2]), c[0]}, 0);
                   }});
  cases.push_back({"split_with_sizes", {values({8, 3})}, [](L in) {
                     std::vector<Tensor> p = split_with_sizes(in[0], {2, 5, 1}, 0);
                     return add(p[0], p[0]) + p[2];
                   }});
  cases.push_back(
      {"index_select", {values({40, 7}), indices({64}, 40)}, [](L in) { return index_select(in[0], 0, in[1]); }});
  cases.push_back({"gather", {values({30, 20}), indices({30, 12}, 20)}, [](L in) { return gather(in[0], 1, in[1]); }});
  cases.push_back({"scatter_add", {values({10, 20}), indices({25, 20}, 10), values({25, 20})}, [](L in) {
                     return scatter_add(in[0], 0, in[1], in[2]);
                   }});
  cases.push_back({"index_add", {values({10, 6}), indices({30}, 10), values({30, 6})}, [](L in) {
                     return index_add(in[0], 0, in[1], in[2]);
                   }});
  cases.push_back({"embedding with padding", {values({50, 16}), indices({4, 33}, 50)}, [](L in) {
                     return embedding(in[0], in[1], /*padding_idx=*/3);
                   }});
  return cases;
}

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
          {"affine", UnaryOp::Affine, 1.5, -0.25},
          {"clamp", UnaryOp::Clamp, -0.5, 0.75}};
}

}  // namespace

TEST_CASE("cuda autograd ops: elementwise forward and gradients match the CPU") {
  for (const Case& c : elementwise_cases())
    for (DType dt : kAutogradTypes) run_case(c, dt);
}

TEST_CASE("cuda autograd ops: reductions, softmax, join and index ops match the CPU") {
  for (const Case& c : reduce_shape_cases())
    for (DType dt : kAutogradTypes) run_case(c, dt);
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

TEST_CASE("cuda autograd: copy_ across devices and dtypes sends the gradient back to the source's device") {
  Tensor src = random_tensor({3}, kFloat32, 7);  // on the CPU
  src.requires_grad_();
  Tensor h = zeros({2, 3}, {kFloat16, cuda()});
  h.copy_(src);  // broadcast, converted to float16, moved to the GPU
  const Tensor g = random_tensor({2, 3}, {kFloat16, cuda()}, 8);
  (h * 1.0).backward(g);
  REQUIRE(src.grad().device() == kCPU);
  REQUIRE(src.grad().dtype() == kFloat32);
  const std::vector<double> gv = values_of(g);
  check_close(values_of(src.grad()), {gv[0] + gv[3], gv[1] + gv[4], gv[2] + gv[5]}, 1e-3, 1e-3);
  check_close(values_of(h.detach()), values_of(src.detach().to(kFloat16).unsqueeze(0).expand({2, 3})), 0, 0);
}

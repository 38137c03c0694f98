// CUDA unary ops against the CPU ops on the same inputs: every op, f32/f16/bf16/f64,
// contiguous (aligned, misaligned, large with a vector tail) and non-contiguous.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "tensor/factory.h"
#include "tensor/ops/unary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

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

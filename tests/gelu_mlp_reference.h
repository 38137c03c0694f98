#pragma once
// The composed MLP block, linear -> gelu_tanh -> linear, in float64 on the CPU: the reference
// the fused gelu_mlp (autograd/ops/matmul.h, Note [GELU epilogues]) is checked against.
#include <vector>

#include "autograd/ops/matmul.h"
#include "autograd/ops/unary.h"
#include "tests/test_util.h"

namespace frugal::testing {

/// The operands of one MLP block (any dtype and device; biases may be undefined) and the
/// gradient flowing into its output.
struct MlpInputs {
  Tensor x, w1, b1, w2, b2, g;
};

/// Output and gradients, as float64 values; a bias's gradient is empty when it has none.
struct MlpValues {
  std::vector<double> y, dx, dw1, db1, dw2, db2;
};

/// One block's shapes: x (..., in), hidden and out features, x's layout, which biases it has.
struct MlpCase {
  Shape x;
  int64_t hidden, out;
  Layout layout;
  bool b1, b2;
};

/// Random operands of `c` (weights in [-0.5, 0.5], x and g in [-1, 1]) with options `o`.
inline MlpInputs mlp_inputs(const MlpCase& c, TensorOptions o, uint64_t seed) {
  const int64_t in = c.x.back();
  Shape y = c.x;
  y.back() = c.out;
  return {random_tensor(c.x, o, seed, c.layout, -1.0, 1.0),
          random_tensor({c.hidden, in}, o, seed + 1, Layout::Contiguous, -0.5, 0.5),
          c.b1 ? random_tensor({c.hidden}, o, seed + 2, Layout::Contiguous, -0.5, 0.5) : Tensor(),
          random_tensor({c.out, c.hidden}, o, seed + 3, Layout::Contiguous, -0.5, 0.5),
          c.b2 ? random_tensor({c.out}, o, seed + 4, Layout::Contiguous, -0.5, 0.5) : Tensor(),
          random_tensor(y, o, seed + 5, Layout::Contiguous, -1.0, 1.0)};
}

/// f(a's, e's, name) for the output and each gradient in turn.
template <typename F>
void for_each_mlp_value(const MlpValues& a, const MlpValues& e, F&& f) {
  f(a.y, e.y, "y"), f(a.dx, e.dx, "dx"), f(a.dw1, e.dw1, "dw1"), f(a.db1, e.db1, "db1");
  f(a.dw2, e.dw2, "dw2"), f(a.db2, e.db2, "db2");
}

/// check_close on the output and every gradient.
inline void check_mlp_values(const MlpValues& a, const MlpValues& e, double rtol, double atol) {
  for_each_mlp_value(a, e, [&](const std::vector<double>& got, const std::vector<double>& want, const char* what) {
    check_close(got, want, rtol, atol, what);
  });
}

/// linear(gelu_tanh(linear(x, w1, b1)), w2, b2) and its gradients for g, in float64 on the
/// CPU from the operands' values (as rounded to their dtype).
inline MlpValues composed_mlp_reference(const MlpInputs& in) {
  auto leaf = [](const Tensor& t) { return t.defined() ? t.detach().to(kCPU, kFloat64).requires_grad_() : Tensor(); };
  const Tensor x = leaf(in.x), w1 = leaf(in.w1), b1 = leaf(in.b1), w2 = leaf(in.w2), b2 = leaf(in.b2);
  const Tensor y = linear(gelu_tanh(linear(x, w1, b1)), w2, b2);
  y.backward(in.g.detach().to(kCPU, kFloat64));
  auto grad = [](const Tensor& t) { return t.defined() ? values_of(t.grad()) : std::vector<double>{}; };
  return {values_of(y), grad(x), grad(w1), grad(b1), grad(w2), grad(b2)};
}

/// The same from frugal::gelu_mlp run on the operands as they are.
inline MlpValues fused_mlp_values(const MlpInputs& in) {
  auto leaf = [](const Tensor& t) { return t.defined() ? t.detach().requires_grad_() : Tensor(); };
  const Tensor x = leaf(in.x), w1 = leaf(in.w1), b1 = leaf(in.b1), w2 = leaf(in.w2), b2 = leaf(in.b2);
  const Tensor y = gelu_mlp(x, w1, b1, w2, b2);
  y.backward(in.g);
  auto grad = [](const Tensor& t) { return t.defined() ? values_of(t.grad()) : std::vector<double>{}; };
  return {values_of(y), grad(x), grad(w1), grad(b1), grad(w2), grad(b2)};
}

}  // namespace frugal::testing

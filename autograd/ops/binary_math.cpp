// atan2, hypot, logaddexp and the division-like ops, forward and backward side by side.
//
// Note [Binary math gradients]
// The gradients are derivatives.yaml's, written once in differentiable ops (math_grads), which
// serves both the first-order backward (run with grad mode off, recording nothing) and the
// double backward (on the saved inputs joined to their history: Note [Double backward]):
//   atan2(a, b):     g b / (a^2 + b^2),  -g a / (a^2 + b^2)
//   hypot(a, b):     g a / hypot(a, b),  g b / hypot(a, b)       (recomputed: nothing saved)
//   logaddexp(a, b): g sigmoid(a - b),   g sigmoid(b - a)        (= g / (1 + e^(b - a)), stable)
//   remainder:       g,                  -g floor(a / b)
//   fmod:            g,                  -g trunc(a / b)
//   rounded division: zeros for both (a step function), as PyTorch's.
// The quotients are step functions, constants of the formula. 16-bit inputs compute their
// gradients in float32 (a^2 overflows float16 from |a| = 256) and return them in their dtype.
#include "autograd/ops/binary_math.h"

#include <string>

#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"

namespace frugal {

using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;
namespace graph = autograd::graph;

namespace {

enum class MathOp { Atan2, Hypot, LogAddExp, Remainder, Fmod, Rounded };

constexpr const char* backward_name(MathOp op) {
  switch (op) {
    case MathOp::Atan2: return "Atan2Backward";
    case MathOp::Hypot: return "HypotBackward";
    case MathOp::LogAddExp: return "LogaddexpBackward";
    case MathOp::Remainder: return "RemainderBackward";
    case MathOp::Fmod: return "FmodBackward";
    case MathOp::Rounded: return "DivRoundedBackward";
  }
  return "?";
}

/// The gradients of op (not the rounded division) at a and b from g, the output's gradient
/// (Note [Binary math gradients]), at the broadcast shape, in `compute`; b is undefined for a
/// tensor-scalar op, whose gradient needs no operand.
TensorList math_grads(MathOp op, const Tensor& g_out, const Tensor& a_in, const Tensor& b_in, DType compute,
                      bool want_a, bool want_b) {
  const Tensor g = in_dtype(g_out, compute);
  const Tensor a = a_in.defined() ? in_dtype(a_in, compute) : Tensor();
  const Tensor b = b_in.defined() ? in_dtype(b_in, compute) : Tensor();
  TensorList grads(2);
  switch (op) {
    case MathOp::Atan2: {
      const Tensor scale = div(g, add(mul(a, a), mul(b, b)));
      if (want_a) grads[0] = mul(scale, b);
      if (want_b) grads[1] = neg(mul(scale, a));
      break;
    }
    case MathOp::Hypot: {
      const Tensor scale = div(g, hypot(a, b));
      if (want_a) grads[0] = mul(scale, a);
      if (want_b) grads[1] = mul(scale, b);
      break;
    }
    case MathOp::LogAddExp: {
      if (want_a) grads[0] = mul(g, sigmoid(sub(a, b)));
      if (want_b) grads[1] = mul(g, sigmoid(sub(b, a)));
      break;
    }
    case MathOp::Remainder:
    case MathOp::Fmod: {
      if (want_a) grads[0] = g;
      if (want_b) {
        const char* mode = op == MathOp::Remainder ? "floor" : "trunc";
        const Tensor quotient = autograd::raw([&] { return ops::div(a.detach(), b.detach(), mode); });
        grads[1] = neg(mul(g, quotient));
      }
      break;
    }
    case MathOp::Rounded: break;  // BinaryMathBackward makes its zeros
  }
  return grads;
}

/// out = op(a, b), broadcast, or op(x, s) with b undefined; see Note [Binary math gradients].
struct BinaryMathBackward final : Node {
  MathOp op = MathOp::Atan2;
  SavedTensor a{this}, b{this};  // the operands the formula reads (none for Rounded)
  Shape a_sizes, b_sizes;
  DType a_dtype = kFloat32, b_dtype = kFloat32, compute = kFloat32;
  Device device = kCPU;
  bool scalar_rhs = false;
  std::string name() const override { return backward_name(op); }

  /// The formula on a and b, either the saved values or those joined to their history.
  TensorList grads_from(const Tensor& g, const Tensor& av, const Tensor& bv, bool graph_mode) {
    const bool want_a = wants_grad(*this, 0), want_b = !scalar_rhs && wants_grad(*this, 1);
    TensorList result(scalar_rhs ? 1 : 2);
    if (op == MathOp::Rounded) {  // zeros: a constant, yet still a function of the inputs at the next order
      if (want_a) result[0] = zeros(a_sizes, {a_dtype, device});
      if (want_b) result[1] = zeros(b_sizes, {b_dtype, device});
      for (size_t i = 0; graph_mode && i < result.size(); ++i)
        if (result[i].defined()) result[i] = graph::with_zero_derivative(result[i], *this, i);
      return result;
    }
    TensorList out = math_grads(op, g, av, bv, compute, want_a, want_b);
    if (want_a) result[0] = graph::reduce_grad(out[0], a_sizes, a_dtype);
    if (want_b) result[1] = graph::reduce_grad(out[1], b_sizes, b_dtype);
    return result;
  }
  TensorList apply(TensorList&& grads) override {
    const Tensor av = a.defined() ? a.unpack(name()) : Tensor(), bv = b.defined() ? b.unpack(name()) : Tensor();
    return autograd::raw([&] { return grads_from(grads[0], av, bv, false); });
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor av = a.defined() ? graph::saved_input(*this, 0, a) : Tensor();
    const Tensor bv = b.defined() ? graph::saved_input(*this, 1, b) : Tensor();
    return grads_from(grads[0], av, bv, true);
  }
};

/// Which operands op's formula reads: atan2, hypot and logaddexp both; remainder and fmod
/// both for b's gradient; the rounded division neither.
bool saves_operands(MathOp op, const BinaryMathBackward& node) {
  if (op == MathOp::Rounded) return false;
  if (op == MathOp::Remainder || op == MathOp::Fmod) return !node.scalar_rhs && wants_grad(node, 1);
  return true;
}

/// Records op's node for out = op(a, b) (b undefined: a tensor-scalar op).
void record_math(MathOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  auto node = b.defined() ? make_node<BinaryMathBackward>({a, b}) : make_node<BinaryMathBackward>({a});
  if (!node) return;
  node->op = op;
  node->scalar_rhs = !b.defined();
  node->a_sizes = a.sizes();
  node->a_dtype = a.dtype();
  if (b.defined()) {
    node->b_sizes = b.sizes();
    node->b_dtype = b.dtype();
  }
  node->compute = opmath_dtype(out.dtype());
  node->device = out.device();
  if (saves_operands(op, *node)) {
    node->a = a;
    if (b.defined()) node->b = b;
  }
  autograd::record(node, {out});
}

/// out = raw_call() run below autograd, recorded as op of a and b (b undefined: a tensor-scalar op).
template <typename Raw>
Tensor recorded_math(MathOp op, const char* name, const Tensor& a, const Tensor& b, const Raw& raw_call) {
  core::OpScope scope(name);
  Tensor out = autograd::raw(raw_call);
  record_math(op, out, a, b);
  return out;
}

Tensor binary_math(MathOp op, const char* name, const Tensor& a, const Tensor& b,
                   Tensor (*raw_op)(const Tensor&, const Tensor&)) {
  return recorded_math(op, name, a, b, [&] { return raw_op(a, b); });
}

Tensor scalar_math(MathOp op, const char* name, const Tensor& x, double s, Tensor (*raw_op)(const Tensor&, double)) {
  return recorded_math(op, name, x, Tensor(), [&] { return raw_op(x, s); });
}

}  // namespace

Tensor atan2(const Tensor& a, const Tensor& b) { return binary_math(MathOp::Atan2, "atan2", a, b, ops::atan2); }
Tensor hypot(const Tensor& a, const Tensor& b) { return binary_math(MathOp::Hypot, "hypot", a, b, ops::hypot); }
Tensor logaddexp(const Tensor& a, const Tensor& b) {
  return binary_math(MathOp::LogAddExp, "logaddexp", a, b, ops::logaddexp);
}
Tensor remainder(const Tensor& a, const Tensor& b) {
  return binary_math(MathOp::Remainder, "remainder", a, b, ops::remainder);
}
Tensor remainder(const Tensor& x, double s) {
  return scalar_math(MathOp::Remainder, "remainder", x, s, ops::remainder);
}
Tensor fmod(const Tensor& a, const Tensor& b) { return binary_math(MathOp::Fmod, "fmod", a, b, ops::fmod); }
Tensor fmod(const Tensor& x, double s) { return scalar_math(MathOp::Fmod, "fmod", x, s, ops::fmod); }
Tensor floor_divide(const Tensor& a, const Tensor& b) {
  return binary_math(MathOp::Rounded, "floor_divide", a, b, ops::floor_divide);
}
Tensor floor_divide(const Tensor& x, double s) {
  return scalar_math(MathOp::Rounded, "floor_divide", x, s, ops::floor_divide);
}
Tensor div(const Tensor& a, const Tensor& b, std::string_view rounding_mode) {
  return recorded_math(MathOp::Rounded, "div", a, b, [&] { return ops::div(a, b, rounding_mode); });
}
Tensor div(const Tensor& x, double s, std::string_view rounding_mode) {
  return recorded_math(MathOp::Rounded, "div", x, Tensor(), [&] { return ops::div(x, s, rounding_mode); });
}

}  // namespace frugal

// Binary ops, forward and backward side by side: one node per op, and the in-place
// forms (Note [In-place ops and autograd]).
#include "autograd/ops/binary.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/inplace.h"
#include "autograd/ops/unary.h"  // affine, reciprocal: rsub and rdiv
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/unary.h"  // ops::neg, ops::log

namespace frugal {

using autocast::Policy;
using autograd::in_dtype;
using autograd::make_node;
using autograd::must_record_inplace;
using autograd::Node;
using autograd::rebase_history;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;
namespace graph = autograd::graph;

namespace {

/// g in `dtype` (a gradient handed to backward by the user may come in another dtype).
/// The gradient of an input of `sizes` and `dtype` from the gradient of the broadcast
/// output: summed over the dims broadcasting stretched, then in the input's own dtype.
Tensor reduce_grad(const Tensor& g, const Shape& sizes, DType dtype) {
  return in_dtype(autograd::sum_to(g, sizes), dtype);
}

/// What backward must know of an input whose values it does not need.
struct InputMeta {
  Shape sizes;
  DType dtype = kFloat32;
  InputMeta() = default;
  InputMeta(const Tensor& t) : sizes(t.sizes()), dtype(t.dtype()) {}  // NOLINT: `node->a = a;`
};

// ---- binary: out = f(a, b), broadcast --------------------------------------------
// Every gradient is summed back over the dims broadcasting stretched (reduce_grad) and
// returned in its input's dtype.

// out = a + alpha b (sub: alpha negated)
// grad_a = g, grad_b = alpha g
struct AddBackward final : Node {
  InputMeta a, b;
  double alpha = 1.0;
  const char* label = "AddBackward";
  std::string name() const override { return label; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = reduce_grad(g, a.sizes, a.dtype);
    if (wants_grad(*this, 1)) {
      const Tensor r = autograd::sum_to(g, b.sizes);  // scale after reducing: fewer elements
      out[1] = in_dtype(alpha == 1.0 ? r : alpha == -1.0 ? ops::neg(r) : ops::mul(r, alpha), b.dtype);
    }
    return out;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = graph::reduce_grad(g, a.sizes, a.dtype);
    if (wants_grad(*this, 1)) out[1] = graph::reduce_grad(alpha == 1.0 ? g : frugal::mul(g, alpha), b.sizes, b.dtype);
    return out;
  }
};

// out = x op s for a scalar s (add, sub, mul, div)
// grad_x = g * factor (1 for add and sub, s for mul, 1/s for div)
struct ScalarBackward final : Node {
  double factor = 1.0;
  DType dtype = kFloat32;
  const char* label = "AddBackward";
  std::string name() const override { return label; }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    return {factor == 1.0 ? g : ops::mul(g, factor)};
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    return {factor == 1.0 ? g : frugal::mul(g, factor)};
  }
};

// out = a * b
// grad_a = g * b, grad_b = g * a
struct MulBackward final : Node {
  SavedTensor a{this}, b{this};  // a only when b needs grad, b only when a does
  InputMeta ma, mb;
  std::string name() const override { return "MulBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = reduce_grad(ops::mul(g, b.unpack(name())), ma.sizes, ma.dtype);
    if (wants_grad(*this, 1)) out[1] = reduce_grad(ops::mul(g, a.unpack(name())), mb.sizes, mb.dtype);
    return out;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0))
      out[0] = graph::reduce_grad(frugal::mul(g, graph::saved_input(*this, 1, b)), ma.sizes, ma.dtype);
    if (wants_grad(*this, 1))
      out[1] = graph::reduce_grad(frugal::mul(g, graph::saved_input(*this, 0, a)), mb.sizes, mb.dtype);
    return out;
  }
};

// out = a / b
// grad_a = g / b, grad_b = -g a / b^2 = -(g / b) (a / b)
// (a, not out, is saved, as PyTorch does: out may then be changed in place)
struct DivBackward final : Node {
  SavedTensor a{this}, b{this};  // a only when b needs grad
  InputMeta ma, mb;
  std::string name() const override { return "DivBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor bv = b.unpack(name());
    const Tensor g_over_b = ops::div(grads[0], bv);
    TensorList result(2);
    if (wants_grad(*this, 0)) result[0] = reduce_grad(g_over_b, ma.sizes, ma.dtype);
    if (wants_grad(*this, 1))
      result[1] = ops::neg(reduce_grad(ops::mul(g_over_b, ops::div(a.unpack(name()), bv)), mb.sizes, mb.dtype));
    return result;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor bv = graph::saved_input(*this, 1, b);
    const Tensor g_over_b = frugal::div(grads[0], bv);
    TensorList result(2);
    if (wants_grad(*this, 0)) result[0] = graph::reduce_grad(g_over_b, ma.sizes, ma.dtype);
    if (wants_grad(*this, 1)) {
      const Tensor t = frugal::mul(g_over_b, frugal::div(graph::saved_input(*this, 0, a), bv));
      result[1] = frugal::neg(graph::reduce_grad(t, mb.sizes, mb.dtype));
    }
    return result;
  }
};

// out = maximum(a, b) (minimum: the comparisons swapped)
// grad_a = a > b ? g : a == b ? g / 2 : 0, grad_b = b > a ? g : a == b ? g / 2 : 0
struct MaximumMinimumBackward final : Node {
  SavedTensor a{this}, b{this};
  InputMeta ma, mb;
  bool is_max = true;
  std::string name() const override { return is_max ? "MaximumBackward" : "MinimumBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor av = a.unpack(name()), bv = b.unpack(name());
    const Tensor shared = ops::where(ops::eq(av, bv), ops::mul(g, 0.5), g);  // ties split evenly
    TensorList out(2);
    if (wants_grad(*this, 0))  // a loses where it is the smaller (maximum) / larger (minimum) one
      out[0] =
          reduce_grad(ops::masked_fill(shared, is_max ? ops::lt(av, bv) : ops::gt(av, bv), 0.0), ma.sizes, ma.dtype);
    if (wants_grad(*this, 1))
      out[1] =
          reduce_grad(ops::masked_fill(shared, is_max ? ops::gt(av, bv) : ops::lt(av, bv), 0.0), mb.sizes, mb.dtype);
    return out;
  }
  // g times constant shares (1, 1/2 at ties, 0), of zero derivative in a and b.
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor av = a.unpack(name()), bv = b.unpack(name());
    auto share = [&](const Tensor& loses) {  // 0 where the input loses, 1/2 at ties, else 1
      return autograd::raw([&] {
        const Tensor one = ops::where(ops::eq(av, bv), full_like(g, 0.5), ones_like(g));
        return ops::masked_fill(one, loses, 0.0);
      });
    };
    TensorList out(2);
    if (wants_grad(*this, 0)) {
      const Tensor loses = autograd::raw([&] { return is_max ? ops::lt(av, bv) : ops::gt(av, bv); });
      out[0] = graph::with_zero_derivative(graph::reduce_grad(frugal::mul(g, share(loses)), ma.sizes, ma.dtype), *this, 0);
    }
    if (wants_grad(*this, 1)) {
      const Tensor loses = autograd::raw([&] { return is_max ? ops::gt(av, bv) : ops::lt(av, bv); });
      out[1] = graph::with_zero_derivative(graph::reduce_grad(frugal::mul(g, share(loses)), mb.sizes, mb.dtype), *this, 1);
    }
    return out;
  }
};

// out = a ^ b
// grad_a = g b a^(b - 1) (0 where b == 0), grad_b = g out log(a) (0 where a == 0 and b >= 0)
struct PowBackward final : Node {
  SavedTensor a{this}, b{this}, out{this};  // out only when b needs grad
  InputMeta ma, mb;
  std::string name() const override { return "PowBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor av = a.unpack(name()), bv = b.unpack(name());
    TensorList result(2);
    if (wants_grad(*this, 0)) {
      const Tensor b_num = bv.dtype() == kBool ? bv.to(kInt64) : bv;  // sub refuses bool operands
      const Tensor t = ops::mul(ops::mul(g, bv), ops::pow(av, ops::sub(b_num, 1.0)));
      result[0] = reduce_grad(ops::masked_fill(t, ops::eq(bv, 0.0), 0.0), ma.sizes, ma.dtype);
    }
    if (wants_grad(*this, 1)) {
      const Tensor a_float = is_floating(av.dtype()) ? av : av.to(g.dtype());  // log of an integer base
      const Tensor t = ops::mul(g, ops::mul(out.unpack(name()), ops::log(a_float)));
      const Tensor zero_base = ops::logical_and(ops::eq(av, 0.0), ops::ge(bv, 0.0));
      result[1] = reduce_grad(ops::masked_fill(t, zero_base, 0.0), mb.sizes, mb.dtype);
    }
    return result;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor av = graph::saved_input(*this, 0, a), bv = graph::saved_input(*this, 1, b);
    TensorList result(2);
    if (wants_grad(*this, 0)) {
      const Tensor b_num = bv.dtype() == kBool ? bv.to(kInt64) : bv;
      const Tensor t = frugal::mul(frugal::mul(g, b_num), frugal::pow(av, frugal::sub(b_num, 1.0)));
      const Tensor b_zero = autograd::raw([&] { return ops::eq(bv.detach(), 0.0); });
      result[0] = graph::reduce_grad(frugal::masked_fill(t, b_zero, 0.0), ma.sizes, ma.dtype);
    }
    if (wants_grad(*this, 1)) {
      const Tensor a_float = is_floating(av.dtype()) ? av : av.to(g.dtype());
      const Tensor t = frugal::mul(g, frugal::mul(graph::saved_output(*this, 0, out), frugal::log(a_float)));
      const Tensor zero_base =
          autograd::raw([&] { return ops::logical_and(ops::eq(av.detach(), 0.0), ops::ge(bv.detach(), 0.0)); });
      result[1] = graph::reduce_grad(frugal::masked_fill(t, zero_base, 0.0), mb.sizes, mb.dtype);
    }
    return result;
  }
};

// out = cond ? a : b
// grad_a = cond ? g : 0, grad_b = cond ? 0 : g
struct WhereBackward final : Node {
  SavedTensor cond{this};
  InputMeta a, b;
  std::string name() const override { return "WhereBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor c = cond.unpack(name());
    const Tensor zero = zeros({}, g.options());  // 0-d: broadcast by where, no full-size zeros
    TensorList out(3);
    if (wants_grad(*this, 1)) out[1] = reduce_grad(ops::where(c, g, zero), a.sizes, a.dtype);
    if (wants_grad(*this, 2)) out[2] = reduce_grad(ops::where(c, zero, g), b.sizes, b.dtype);
    return out;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor c = cond.unpack(name());
    TensorList out(3);
    if (wants_grad(*this, 1))
      out[1] = graph::reduce_grad(frugal::masked_fill(g, frugal::logical_not(c), 0.0), a.sizes, a.dtype);
    if (wants_grad(*this, 2)) out[2] = graph::reduce_grad(frugal::masked_fill(g, c, 0.0), b.sizes, b.dtype);
    return out;
  }
};

// out = mask ? value : x
// grad_x = mask ? 0 : g
struct MaskedFillBackward final : Node {
  SavedTensor mask{this};
  InputMeta x;
  std::string name() const override { return "MaskedFillBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {reduce_grad(ops::masked_fill(grads[0], mask.unpack(name()), 0.0), x.sizes, x.dtype)};
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    return {graph::reduce_grad(frugal::masked_fill(grads[0], mask.unpack(name()), 0.0), x.sizes, x.dtype)};
  }
};

// out = lerp(start, end, w) = start + w (end - start)
// grad_start = g (1 - w), grad_end = g w, grad_w = g (end - start) (w a tensor)
struct LerpBackward final : Node {
  SavedTensor start{this}, end{this};  // only for weight's gradient
  SavedTensor weight{this};            // a tensor weight
  InputMeta ms, me, mw;
  double w = 0.0;  // a scalar weight (weight undefined)
  bool scalar = false;
  std::string name() const override { return "LerpBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(scalar ? 2 : 3);
    if (scalar) {  // scale after reducing: fewer elements
      if (wants_grad(*this, 0)) out[0] = in_dtype(ops::mul(autograd::sum_to(g, ms.sizes), 1.0 - w), ms.dtype);
      if (wants_grad(*this, 1)) out[1] = in_dtype(ops::mul(autograd::sum_to(g, me.sizes), w), me.dtype);
      return out;
    }
    const Tensor wv = weight.unpack(name());
    if (wants_grad(*this, 0)) out[0] = reduce_grad(ops::mul(g, ops::affine(wv, -1.0, 1.0)), ms.sizes, ms.dtype);
    if (wants_grad(*this, 1)) out[1] = reduce_grad(ops::mul(g, wv), me.sizes, me.dtype);
    if (wants_grad(*this, 2))
      out[2] = reduce_grad(ops::mul(g, ops::sub(end.unpack(name()), start.unpack(name()))), mw.sizes, mw.dtype);
    return out;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(scalar ? 2 : 3);
    if (scalar) {
      if (wants_grad(*this, 0)) out[0] = in_dtype(frugal::mul(graph::sum_to(g, ms.sizes), 1.0 - w), ms.dtype);
      if (wants_grad(*this, 1)) out[1] = in_dtype(frugal::mul(graph::sum_to(g, me.sizes), w), me.dtype);
      return out;
    }
    const Tensor wv = graph::saved_input(*this, 2, weight);
    if (wants_grad(*this, 0)) out[0] = graph::reduce_grad(frugal::mul(g, frugal::rsub(wv, 1.0)), ms.sizes, ms.dtype);
    if (wants_grad(*this, 1)) out[1] = graph::reduce_grad(frugal::mul(g, wv), me.sizes, me.dtype);
    if (wants_grad(*this, 2)) {
      const Tensor d = frugal::sub(graph::saved_input(*this, 1, end), graph::saved_input(*this, 0, start));
      out[2] = graph::reduce_grad(frugal::mul(g, d), mw.sizes, mw.dtype);
    }
    return out;
  }
};

Tensor scalar_op(const char* label, const Tensor& out, const Tensor& x, double factor) {
  if (auto node = make_node<ScalarBackward>({x})) {
    node->factor = factor;
    node->dtype = x.dtype();
    node->label = label;
    autograd::record(node, {out});
  }
  return out;
}

Tensor add_op(const char* op, const char* label, const Tensor& a, const Tensor& b, double alpha) {
  core::OpScope scope(op);
  // sub(a, b, alpha) is add(a, b, -alpha) exactly (negation is exact); ops::sub names it in errors.
  const bool is_sub = std::string_view(op) == "sub";
  Tensor out = autograd::raw([&] { return is_sub ? ops::sub(a, b, -alpha) : ops::add(a, b, alpha); });
  if (auto node = make_node<AddBackward>({a, b})) {
    node->a = a;
    node->b = b;
    node->alpha = alpha;
    node->label = label;
    autograd::record(node, {out});
  }
  return out;
}

Tensor max_min(bool is_max, const Tensor& a, const Tensor& b) {
  core::OpScope scope(is_max ? "maximum" : "minimum");
  Tensor out = autograd::raw([&] { return is_max ? ops::maximum(a, b) : ops::minimum(a, b); });
  if (auto node = make_node<MaximumMinimumBackward>({a, b})) {
    node->a = a;
    node->b = b;
    node->ma = a;
    node->mb = b;
    node->is_max = is_max;
    autograd::record(node, {out});
  }
  return out;
}

// ---- in place (Note [In-place ops and autograd] in autograd/ops/inplace.h) ---------

/// A copy of t's current values, taken below autograd.
Tensor snapshot(const Tensor& t) {
  return autograd::raw([&] { return t.clone(); });
}

const Tensor& add_inplace(const char* op, const char* label, const Tensor& self, const Tensor& other, double alpha) {
  core::OpScope scope(op);
  const bool is_sub = std::string_view(op) == "sub_";  // ops::sub_ names it in errors
  if (!must_record_inplace(op, self, &other)) {
    autograd::raw([&] { is_sub ? ops::sub_(self, other, -alpha) : ops::add_(self, other, alpha); });
    return self;
  }
  auto node = make_node<AddBackward>({self, other});
  node->a = self;
  node->b = other;
  node->alpha = alpha;
  node->label = label;
  autograd::raw([&] { is_sub ? ops::sub_(self, other, -alpha) : ops::add_(self, other, alpha); });
  rebase_history(self, node);
  return self;
}

const Tensor& scalar_inplace(const char* op, const char* label, const Tensor& self, double factor,
                             const Tensor& (*raw_op)(const Tensor&, double), double s) {
  core::OpScope scope(op);
  if (!must_record_inplace(op, self, nullptr)) {
    autograd::raw([&] { raw_op(self, s); });
    return self;
  }
  auto node = make_node<ScalarBackward>({self});
  node->factor = factor;
  node->dtype = self.dtype();
  node->label = label;
  autograd::raw([&] { raw_op(self, s); });
  rebase_history(self, node);
  return self;
}

}  // namespace

// ---- binary ------------------------------------------------------------------------

// add, sub, mul, div, maximum, minimum: no autocast cast, the kernels promote (Note [Autocast]).
Tensor add(const Tensor& a, const Tensor& b, double alpha) { return add_op("add", "AddBackward", a, b, alpha); }
Tensor sub(const Tensor& a, const Tensor& b, double alpha) { return add_op("sub", "SubBackward", a, b, -alpha); }

Tensor mul(const Tensor& a, const Tensor& b) {
  core::OpScope scope("mul");
  Tensor out = autograd::raw([&] { return ops::mul(a, b); });
  if (auto node = make_node<MulBackward>({a, b})) {
    if (wants_grad(*node, 1)) node->a = a;
    if (wants_grad(*node, 0)) node->b = b;
    node->ma = a;
    node->mb = b;
    autograd::record(node, {out});
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  core::OpScope scope("div");
  Tensor out = autograd::raw([&] { return ops::div(a, b); });
  if (auto node = make_node<DivBackward>({a, b})) {
    if (wants_grad(*node, 1)) node->a = a;
    node->b = b;
    node->ma = a;
    node->mb = b;
    autograd::record(node, {out});
  }
  return out;
}

Tensor maximum(const Tensor& a, const Tensor& b) { return max_min(true, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return max_min(false, a, b); }

Tensor pow(const Tensor& a, const Tensor& b) {
  core::OpScope scope("pow");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&a, &b})) return pow((*c)[0], (*c)[1]);
  Tensor out = autograd::raw([&] { return ops::pow(a, b); });
  if (auto node = make_node<PowBackward>({a, b})) {
    node->a = a;
    node->b = b;
    if (wants_grad(*node, 1)) node->out = out;
    node->ma = a;
    node->mb = b;
    autograd::record(node, {out});
  }
  return out;
}

Tensor add(const Tensor& x, double s) {
  core::OpScope scope("add");
  return scalar_op("AddBackward", autograd::raw([&] { return ops::add(x, s); }), x, 1.0);
}
Tensor sub(const Tensor& x, double s) {
  core::OpScope scope("sub");
  return scalar_op("SubBackward", autograd::raw([&] { return ops::sub(x, s); }), x, 1.0);
}
Tensor mul(const Tensor& x, double s) {
  core::OpScope scope("mul");
  return scalar_op("MulBackward", autograd::raw([&] { return ops::mul(x, s); }), x, s);
}
Tensor div(const Tensor& x, double s) {
  core::OpScope scope("div");
  return scalar_op("DivBackward", autograd::raw([&] { return ops::div(x, s); }), x, 1.0 / s);
}

Tensor rsub(const Tensor& x, double s) {
  core::OpScope scope("rsub");
  FRUGAL_CHECK(x.defined(), "rsub: undefined input tensor");
  FRUGAL_CHECK(x.dtype() != kBool && x.dtype() != kUInt8,  // as PyTorch: no subtraction with bool
               "rsub: expects a floating or integer tensor, got ", x.describe());
  if (is_floating(x.dtype())) return affine(x, -1.0, s);  // one pass, one rounding
  // Integers (no gradient): s - x in torch.rsub's result dtype. A fractional s gives float32,
  // so x is converted first: negating in the integer type would wrap -INT32_MIN to INT32_MIN
  // and flip the sign of 0.5 - INT32_MIN. An integral s keeps integer arithmetic, which wraps.
  const bool fractional = !(std::isfinite(s) && s == std::trunc(s));  // Note [Binary type promotion]
  return ops::add(ops::neg(fractional ? x.to(kFloat32) : x), s);
}

Tensor rdiv(const Tensor& x, double s) {
  core::OpScope scope("rdiv");
  FRUGAL_CHECK(x.defined(), "rdiv: undefined input tensor");
  FRUGAL_CHECK(x.dtype() != kUInt8, "rdiv: uint8 is a storage-only dtype and takes no arithmetic, got ", x.describe(),
               " (Note [Storage-only uint8] in tensor/dtype.h)");
  if (s == 1.0 && is_floating(x.dtype())) return reciprocal(x);
  // A 0-d numerator broadcast by div: one pass. Integer x divides as float32 (true division).
  const Tensor numerator = scalar_tensor(s, {is_floating(x.dtype()) ? x.dtype() : kFloat32, x.device()});
  return div(numerator, x);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  core::OpScope scope("where");  // promotes natively (Note [Autocast])
  Tensor out = autograd::raw([&] { return ops::where(cond, a, b); });
  if (auto node = make_node<WhereBackward>({cond, a, b})) {
    node->cond = cond;
    node->a = a;
    node->b = b;
    autograd::record(node, {out});
  }
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  core::OpScope scope("masked_fill");
  Tensor out = autograd::raw([&] { return ops::masked_fill(x, mask, value); });
  if (auto node = make_node<MaskedFillBackward>({x})) {
    node->mask = mask;
    node->x = x;
    autograd::record(node, {out});
  }
  return out;
}

Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight) {
  core::OpScope scope("lerp");  // no autocast cast: one dtype, as PyTorch (Note [Autocast])
  Tensor out = autograd::raw([&] { return ops::lerp(start, end, weight); });
  if (auto node = make_node<LerpBackward>({start, end, weight})) {
    node->ms = start;
    node->me = end;
    node->mw = weight;
    if (wants_grad(*node, 0) || wants_grad(*node, 1)) node->weight = weight;
    if (wants_grad(*node, 2)) {
      node->start = start;
      node->end = end;
    }
    autograd::record(node, {out});
  }
  return out;
}

Tensor lerp(const Tensor& start, const Tensor& end, double weight) {
  core::OpScope scope("lerp");
  Tensor out = autograd::raw([&] { return ops::lerp(start, end, weight); });
  if (auto node = make_node<LerpBackward>({start, end})) {
    node->ms = start;
    node->me = end;
    node->w = weight;
    node->scalar = true;
    autograd::record(node, {out});
  }
  return out;
}

// ---- in place (Note [In-place ops and autograd]) ----------------------------------

const Tensor& add_(const Tensor& a, const Tensor& b, double alpha) {
  return add_inplace("add_", "AddBackward", a, b, alpha);
}
const Tensor& sub_(const Tensor& a, const Tensor& b, double alpha) {
  return add_inplace("sub_", "SubBackward", a, b, -alpha);
}

const Tensor& mul_(const Tensor& self, const Tensor& other) {
  core::OpScope scope("mul_");
  if (!must_record_inplace("mul_", self, &other)) {
    autograd::raw([&] { ops::mul_(self, other); });
    return self;
  }
  auto node = make_node<MulBackward>({self, other});
  node->ma = self;
  node->mb = other;
  if (wants_grad(*node, 0)) node->b = other.shares_storage(self) ? snapshot(other) : other;
  if (wants_grad(*node, 1)) node->a = snapshot(self);  // self's old value
  autograd::raw([&] { ops::mul_(self, other); });
  rebase_history(self, node);
  return self;
}

const Tensor& div_(const Tensor& self, const Tensor& other) {
  core::OpScope scope("div_");
  if (!must_record_inplace("div_", self, &other)) {
    autograd::raw([&] { ops::div_(self, other); });
    return self;
  }
  auto node = make_node<DivBackward>({self, other});
  node->ma = self;
  node->mb = other;
  node->b = other.shares_storage(self) ? snapshot(other) : other;
  if (wants_grad(*node, 1)) node->a = snapshot(self);  // self's old value
  autograd::raw([&] { ops::div_(self, other); });
  rebase_history(self, node);
  return self;
}

const Tensor& add_(const Tensor& x, double s) { return scalar_inplace("add_", "AddBackward", x, 1.0, ops::add_, s); }
const Tensor& sub_(const Tensor& x, double s) { return scalar_inplace("sub_", "SubBackward", x, 1.0, ops::sub_, s); }
const Tensor& mul_(const Tensor& x, double s) { return scalar_inplace("mul_", "MulBackward", x, s, ops::mul_, s); }
const Tensor& div_(const Tensor& x, double s) {
  return scalar_inplace("div_", "DivBackward", x, 1.0 / s, ops::div_, s);
}

const Tensor& masked_fill_(const Tensor& x, const Tensor& mask, double value) {
  core::OpScope scope("masked_fill_");
  if (!must_record_inplace("masked_fill_", x, nullptr)) {
    autograd::raw([&] { ops::masked_fill_(x, mask, value); });
    return x;
  }
  auto node = make_node<MaskedFillBackward>({x});
  node->mask = mask;
  node->x = x;
  autograd::raw([&] { ops::masked_fill_(x, mask, value); });
  rebase_history(x, node);
  return x;
}

const Tensor& lerp_(const Tensor& self, const Tensor& end, const Tensor& weight) {
  core::OpScope scope("lerp_");
  // Before must_record_inplace reads them: an undefined operand is refused by name.
  FRUGAL_CHECK(self.defined() && end.defined() && weight.defined(), "lerp_: undefined input tensor (self ",
               self.describe(), ", end ", end.describe(), ", weight ", weight.describe(), ")");
  // Recorded when self, end or weight needs grad (must_record_inplace takes one operand).
  const bool record = must_record_inplace("lerp_", self, &end) || must_record_inplace("lerp_", self, &weight);
  if (!record) {
    autograd::raw([&] { ops::lerp_(self, end, weight); });
    return self;
  }
  auto node = make_node<LerpBackward>({self, end, weight});
  node->ms = self;
  node->me = end;
  node->mw = weight;
  // What shares self's storage changes with the write: saved as copies.
  const auto saved = [&](const Tensor& t) { return t.shares_storage(self) ? snapshot(t) : t; };
  if (wants_grad(*node, 0) || wants_grad(*node, 1)) node->weight = saved(weight);
  if (wants_grad(*node, 2)) {
    node->start = snapshot(self);  // self's old value
    node->end = saved(end);
  }
  autograd::raw([&] { ops::lerp_(self, end, weight); });
  rebase_history(self, node);
  return self;
}

const Tensor& lerp_(const Tensor& self, const Tensor& end, double weight) {
  core::OpScope scope("lerp_");
  FRUGAL_CHECK(self.defined() && end.defined(), "lerp_: undefined input tensor (self ", self.describe(), ", end ",
               end.describe(), ")");
  if (!must_record_inplace("lerp_", self, &end)) {
    autograd::raw([&] { ops::lerp_(self, end, weight); });
    return self;
  }
  auto node = make_node<LerpBackward>({self, end});
  node->ms = self;
  node->me = end;
  node->w = weight;
  node->scalar = true;
  autograd::raw([&] { ops::lerp_(self, end, weight); });
  rebase_history(self, node);
  return self;
}

// ---- not differentiable: forwarded below autograd ------------------------------------

#define FRUGAL_FORWARD_COMPARISON(op)                    \
  Tensor op(const Tensor& a, const Tensor& b) {          \
    core::OpScope scope(#op);                            \
    return autograd::raw([&] { return ops::op(a, b); }); \
  }                                                      \
  Tensor op(const Tensor& x, double s) {                 \
    core::OpScope scope(#op);                            \
    return autograd::raw([&] { return ops::op(x, s); }); \
  }
FRUGAL_FORWARD_COMPARISON(eq)
FRUGAL_FORWARD_COMPARISON(ne)
FRUGAL_FORWARD_COMPARISON(lt)
FRUGAL_FORWARD_COMPARISON(le)
FRUGAL_FORWARD_COMPARISON(gt)
FRUGAL_FORWARD_COMPARISON(ge)
#undef FRUGAL_FORWARD_COMPARISON

Tensor logical_not(const Tensor& x) {
  core::OpScope scope("logical_not");
  return autograd::raw([&] { return ops::logical_not(x); });
}
Tensor logical_and(const Tensor& a, const Tensor& b) {
  core::OpScope scope("logical_and");
  return autograd::raw([&] { return ops::logical_and(a, b); });
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  core::OpScope scope("logical_or");
  return autograd::raw([&] { return ops::logical_or(a, b); });
}

}  // namespace frugal

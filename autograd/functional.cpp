// torch.autograd.functional's helpers on grad() (autograd/functional.h).
#include "autograd/functional.h"

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/join.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"

namespace frugal::autograd::functional {

namespace {

/// Detached copies of `inputs` that require grad (PyTorch's _grad_preprocess): f's graph starts
/// at them, not at the caller's tensors.
TensorList fresh_leaves(const char* op, const TensorList& inputs) {
  TensorList out;
  for (const Tensor& x : inputs) {
    FRUGAL_CHECK(x.defined() && x.is_floating_point(), op, ": inputs must be defined floating tensors, got ",
                 x.defined() ? x.describe() : std::string("an undefined tensor"));
    out.push_back(x.detach().requires_grad_());
  }
  return out;
}

/// The gradient with respect to `x`, or zeros of its shape where none reaches it.
Tensor or_zeros(const Tensor& g, const Tensor& x) { return g.defined() ? g.detach() : zeros(x.sizes(), x.options()); }

/// d(y)/d(x) as a (y.numel(), x.numel()) matrix, one grad() per element of y.
Tensor jacobian_rows(const Tensor& y, const Tensor& x) {
  const int64_t m = y.numel(), n = x.numel();
  if (!y.requires_grad()) return zeros({m, n}, x.options());  // y is constant in x
  if (m == 0) return zeros({0, n}, x.options());
  const Tensor flat = y.reshape({m});
  const Tensor positions = arange(m, {kInt64, y.device()});
  TensorList rows;
  for (int64_t i = 0; i < m; ++i) {
    const Tensor unit = raw([&] { return ops::eq(positions, double(i)).to(y.dtype()); });
    const TensorList g = grad({flat}, {x}, {unit}, /*retain_graph=*/true, /*allow_unused=*/true);
    rows.push_back(or_zeros(g[0], x).reshape({n}));
  }
  return frugal::stack(rows, 0);
}

Shape joined(const Shape& a, const Shape& b) {
  Shape s = a;
  s.insert(s.end(), b.begin(), b.end());
  return s;
}

}  // namespace

VjpResult vjp(const Function& f, const TensorList& inputs, const Tensor& v) {
  EnableGradGuard with_grad;
  const TensorList xs = fresh_leaves("vjp", inputs);
  const Tensor y = f(xs);
  VjpResult r{y.detach(), {}};
  if (!y.requires_grad()) {
    for (const Tensor& x : xs) r.vjp.push_back(zeros(x.sizes(), x.options()));
    return r;
  }
  const TensorList g = grad({y}, xs, v.defined() ? TensorList{v} : TensorList{}, false, /*allow_unused=*/true);
  for (size_t i = 0; i < xs.size(); ++i) r.vjp.push_back(or_zeros(g[i], xs[i]));
  return r;
}

HvpResult hvp(const Function& f, const TensorList& inputs, const TensorList& v) {
  FRUGAL_CHECK(v.size() == inputs.size(), "hvp: ", inputs.size(), " inputs but ", v.size(), " vectors");
  for (size_t i = 0; i < v.size(); ++i)
    FRUGAL_CHECK(v[i].defined() && v[i].sizes() == inputs[i].sizes(), "hvp: vector ", i, " ",
                 v[i].defined() ? v[i].describe() : std::string("undefined"), " does not have input ", i, "'s shape ",
                 shape_str(inputs[i].sizes()));
  EnableGradGuard with_grad;
  const TensorList xs = fresh_leaves("hvp", inputs);
  const Tensor y = f(xs);
  FRUGAL_CHECK(y.numel() == 1, "hvp: f must return one element, got ", y.describe());
  HvpResult r{y.detach(), {}};
  auto all_zeros = [&] {
    for (const Tensor& x : xs) r.hvp.push_back(zeros(x.sizes(), x.options()));
    return r;
  };
  if (!y.requires_grad()) return all_zeros();
  const TensorList g = grad({y}, xs, {}, {.create_graph = true, .allow_unused = true});
  Tensor dot;  // <grad f, v>: its gradient is H v
  for (size_t i = 0; i < g.size(); ++i) {
    if (!g[i].defined()) continue;
    const Tensor term = frugal::sum(frugal::mul(g[i], v[i].detach()));
    dot = dot.defined() ? frugal::add(dot, term) : term;
  }
  if (!dot.defined() || !dot.requires_grad()) return all_zeros();  // f is linear: H = 0
  const TensorList h = grad({dot}, xs, {}, false, /*allow_unused=*/true);
  for (size_t i = 0; i < xs.size(); ++i) r.hvp.push_back(or_zeros(h[i], xs[i]));
  return r;
}

Tensor jacobian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x) {
  EnableGradGuard with_grad;
  const Tensor xs = fresh_leaves("jacobian", {x})[0];
  const Tensor y = f(xs);
  return jacobian_rows(y, xs).reshape(joined(y.sizes(), x.sizes()));
}

Tensor hessian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x) {
  EnableGradGuard with_grad;
  const Tensor xs = fresh_leaves("hessian", {x})[0];
  const Tensor y = f(xs);
  FRUGAL_CHECK(y.numel() == 1, "hessian: f must return one element, got ", y.describe());
  if (!y.requires_grad()) return zeros(joined(x.sizes(), x.sizes()), x.options());
  const Tensor g = grad({y}, {xs}, {}, {.create_graph = true, .allow_unused = true})[0];
  if (!g.defined()) return zeros(joined(x.sizes(), x.sizes()), x.options());
  return jacobian_rows(g, xs).reshape(joined(x.sizes(), x.sizes()));
}

}  // namespace frugal::autograd::functional

// Differentiable unary, binary, in-place, reduction and softmax ops (autograd/ops/unary.h,
// activation.h, binary.h, reduce.h, softmax.h) in the differentiable op table.
#include <cmath>
#include <functional>
#include <tuple>
#include <utility>

#include "autograd/ops/activation.h"
#include "autograd/ops/all.h"
#include "tests/op_table/grad_util.h"

namespace frugal::optest {

namespace {

using A = AmpPolicy;
using Fn1 = Tensor (*)(const Tensor&);

struct Unary {
  const char* name;
  Fn1 fn;
  double lo, hi, min_abs;
  A amp;
};

void add_unary(std::vector<GradEntry>& t) {
  const Unary ops[] = {
      {"neg", [](const Tensor& x) { return neg(x); }, -2, 2, 0, A::Keep},
      {"exp", [](const Tensor& x) { return exp(x); }, -2, 2, 0, A::Float32},
      {"log", [](const Tensor& x) { return log(x); }, 0.3, 2, 0, A::Float32},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.3, 2, 0, A::Keep},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.3, 2, 0, A::Float32},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -2, 2, 0, A::Keep},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -3, 3, 0, A::Keep},
      {"relu", [](const Tensor& x) { return relu(x); }, -2, 2, 0.05, A::Keep},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -3, 3, 0, A::Keep},
      {"gelu_tanh", [](const Tensor& x) { return gelu_tanh(x); }, -3, 3, 0, A::Keep},
      {"silu", [](const Tensor& x) { return silu(x); }, -3, 3, 0, A::Keep},
      {"abs", [](const Tensor& x) { return abs(x); }, -2, 2, 0.05, A::Keep},
      {"square", [](const Tensor& x) { return square(x); }, -2, 2, 0, A::Keep},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, -2, 2, 0.4, A::Float32},
      {"sin", [](const Tensor& x) { return sin(x); }, -3, 3, 0, A::Keep},
      {"cos", [](const Tensor& x) { return cos(x); }, -3, 3, 0, A::Keep},
      {"log1p", [](const Tensor& x) { return log1p(x); }, -0.7, 2, 0, A::Float32},
      {"tan", [](const Tensor& x) { return tan(x); }, -1.2, 1.2, 0, A::Float32},
      {"asin", [](const Tensor& x) { return asin(x); }, -0.8, 0.8, 0, A::Float32},
      {"acos", [](const Tensor& x) { return acos(x); }, -0.8, 0.8, 0, A::Float32},
      {"atan", [](const Tensor& x) { return atan(x); }, -3, 3, 0, A::Keep},
      {"sinh", [](const Tensor& x) { return sinh(x); }, -2, 2, 0, A::Float32},
      {"cosh", [](const Tensor& x) { return cosh(x); }, -2, 2, 0, A::Float32},
      {"asinh", [](const Tensor& x) { return asinh(x); }, -3, 3, 0, A::Keep},
      {"acosh", [](const Tensor& x) { return acosh(x); }, 1.2, 3, 0, A::Keep},
      {"atanh", [](const Tensor& x) { return atanh(x); }, -0.8, 0.8, 0, A::Keep},
      {"erf", [](const Tensor& x) { return erf(x); }, -2, 2, 0, A::Keep},
      {"erfc", [](const Tensor& x) { return erfc(x); }, -2, 2, 0, A::Keep},
      {"expm1", [](const Tensor& x) { return expm1(x); }, -2, 2, 0, A::Float32},
      {"exp2", [](const Tensor& x) { return exp2(x); }, -2, 2, 0, A::Keep},
      {"log2", [](const Tensor& x) { return log2(x); }, 0.3, 3, 0, A::Float32},
      {"log10", [](const Tensor& x) { return log10(x); }, 0.3, 3, 0, A::Float32},
      {"logsigmoid", [](const Tensor& x) { return logsigmoid(x); }, -4, 4, 0, A::Keep},
      {"selu", [](const Tensor& x) { return selu(x); }, -3, 3, 0.05, A::Keep},
      {"softsign", [](const Tensor& x) { return softsign(x); }, -3, 3, 0.05, A::Keep},
      {"tanhshrink", [](const Tensor& x) { return tanhshrink(x); }, -3, 3, 0, A::Keep},
  };
  for (const Unary& u : ops)
    t.push_back({u.name,
                 [u](Rng& rng) {
                   GradSample s;
                   s.inputs = {grad_in(values(rng, small_shape(rng, 0, 4), u.lo, u.hi, u.min_abs))};
                   s.f = [fn = u.fn](const TensorList& in) { return fn(in[0]); };
                   return s;
                 },
                 u.amp});
  t.push_back({"pow(x, e)",
               [](Rng& rng) {
                 const double e = rng.pick(std::vector<double>{2.0, 3.0, -1.0, 0.5, 1.7, -1.5});
                 const bool integral = e == std::floor(e);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, small_shape(rng, 0, 4), integral ? -2 : 0.3, 2, integral ? 0.3 : 0))};
                 s.params = cat_str("exponent=", e);
                 s.f = [e](const TensorList& in) { return pow(in[0], e); };
                 return s;
               },
               A::Float32});
  t.push_back({"affine",
               [](Rng& rng) {
                 const double scale = rng.uniform(-2, 2), shift = rng.uniform(-1, 1);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, small_shape(rng, 0, 4)))};
                 s.params = cat_str("scale=", scale, " shift=", shift);
                 s.f = [=](const TensorList& in) { return affine(in[0], scale, shift); };
                 return s;
               },
               A::Keep});
  // The piecewise activations, drawn at least 0.05 from their kinks (finite differences
  // straddling a kink are wrong, not the gradient); tests/cpu/test_activations.cpp covers
  // the kinks themselves.
  struct Piecewise {
    const char* name;
    std::function<Tensor(const Tensor&, double, double)> f;
    std::function<std::pair<double, double>(Rng&)> params;  // (a, b)
    std::function<std::vector<double>(double, double)> kinks;
    double lo, hi;
  };
  const auto no_params = [](Rng&) { return std::pair<double, double>{0, 0}; };
  const auto integers = [](double, double) { return std::vector<double>{-3, -2, -1, 0, 1, 2, 3}; };
  const auto half_integers = [](double, double) { return std::vector<double>{-2.5, -1.5, -0.5, 0.5, 1.5, 2.5}; };
  const Piecewise piecewise[] = {
      {"leaky_relu", [](const Tensor& x, double a, double) { return leaky_relu(x, a); },
       [](Rng& r) {
         return std::pair<double, double>{r.pick(std::vector<double>{0.01, 0.2, -0.5}), 0};
       },
       [](double, double) { return std::vector<double>{0}; }, -2, 2},
      {"elu", [](const Tensor& x, double a, double) { return elu(x, a); },
       [](Rng& r) {
         return std::pair<double, double>{r.pick(std::vector<double>{1.0, 0.5, 2.0}), 0};
       },
       [](double, double) { return std::vector<double>{0}; }, -3, 2},
      {"hardtanh", [](const Tensor& x, double a, double b) { return hardtanh(x, a, b); },
       [](Rng& r) {
         const double lo = r.uniform(-1.5, 0.0);
         return std::pair<double, double>{lo, lo + r.uniform(0.5, 2.0)};
       },
       [](double a, double b) {
         return std::vector<double>{a, b};
       },
       -2, 2},
      {"relu6", [](const Tensor& x, double, double) { return relu6(x); }, no_params,
       [](double, double) {
         return std::vector<double>{0, 6};
       },
       -2, 7},
      {"hardsigmoid", [](const Tensor& x, double, double) { return hardsigmoid(x); }, no_params,
       [](double, double) {
         return std::vector<double>{-3, 3};
       },
       -4, 4},
      {"hardswish", [](const Tensor& x, double, double) { return hardswish(x); }, no_params,
       [](double, double) {
         return std::vector<double>{-3, 3};
       },
       -4, 4},
      {"mish", [](const Tensor& x, double, double) { return mish(x); }, no_params,
       [](double, double) { return std::vector<double>{}; }, -3, 3},
      // The rounding ops: gradient zeros, which finite differences away from the jumps agree with.
      {"floor", [](const Tensor& x, double, double) { return floor(x); }, no_params, integers, -3, 3},
      {"ceil", [](const Tensor& x, double, double) { return ceil(x); }, no_params, integers, -3, 3},
      {"trunc", [](const Tensor& x, double, double) { return trunc(x); }, no_params, integers, -3, 3},
      {"round", [](const Tensor& x, double, double) { return round(x); }, no_params, half_integers, -3, 3},
      {"sign", [](const Tensor& x, double, double) { return sign(x); }, no_params,
       [](double, double) { return std::vector<double>{0}; }, -2, 2},
      {"celu", [](const Tensor& x, double a, double) { return celu(x, a); },
       [](Rng& r) {
         return std::pair<double, double>{r.pick(std::vector<double>{1.0, 0.5, 2.0}), 0};
       },
       [](double, double) { return std::vector<double>{0}; }, -3, 2},
      {"hardshrink", [](const Tensor& x, double a, double) { return hardshrink(x, a); },
       [](Rng& r) {
         return std::pair<double, double>{r.pick(std::vector<double>{0.5, 0.0, 1.0}), 0};
       },
       [](double a, double) {
         return std::vector<double>{-a, a};
       },
       -2, 2},
      {"softshrink", [](const Tensor& x, double a, double) { return softshrink(x, a); },
       [](Rng& r) {
         return std::pair<double, double>{r.pick(std::vector<double>{0.5, 0.0, 1.0}), 0};
       },
       [](double a, double) {
         return std::vector<double>{-a, a};
       },
       -2, 2},
      {"threshold", [](const Tensor& x, double a, double b) { return threshold(x, a, b); },
       [](Rng& r) {
         return std::pair<double, double>{r.pick(std::vector<double>{0.0, 0.5, -1.0}), r.uniform(-2, 2)};
       },
       [](double a, double) {
         return std::vector<double>{a};
       },
       -2, 2},
  };
  for (const Piecewise& p : piecewise)
    t.push_back({p.name,
                 [p](Rng& rng) {
                   const auto [a, b] = p.params(rng);
                   Tensor x = values(rng, small_shape(rng, 0, 4), p.lo, p.hi);
                   std::vector<double> v = x.tolist<double>();
                   for (double& e : v)
                     for (bool near = true; near;) {
                       near = false;
                       for (double k : p.kinks(a, b)) near = near || std::fabs(e - k) < 0.05;
                       if (near) e = rng.uniform(p.lo, p.hi);
                     }
                   GradSample s;
                   s.inputs = {grad_in(tensor_of(v, x.sizes(), kFloat64))};
                   s.params = cat_str("a=", a, " b=", b);
                   s.f = [f = p.f, a, b](const TensorList& in) { return f(in[0], a, b); };
                   return s;
                 },
                 A::Keep});
  t.push_back({"softplus",
               [](Rng& rng) {
                 const double beta = rng.pick(std::vector<double>{1.0, 2.0, 0.5, -1.0});
                 // Values at least 0.05 from the threshold, where the gradient jumps (slightly).
                 const double threshold = rng.pick(std::vector<double>{20.0, 1.0, 0.0});
                 Tensor x = values(rng, small_shape(rng, 0, 4), -3, 3);
                 std::vector<double> v = x.tolist<double>();
                 for (double& e : v)
                   while (std::fabs(beta * e - threshold) < 0.05) e = rng.uniform(-3, 3);
                 GradSample s;
                 s.inputs = {grad_in(tensor_of(v, x.sizes(), kFloat64))};
                 s.params = cat_str("beta=", beta, " threshold=", threshold);
                 s.f = [=](const TensorList& in) { return softplus(in[0], beta, threshold); };
                 return s;
               },
               A::Float32});
  t.push_back({"clamp",
               [](Rng& rng) {
                 const double lo = rng.uniform(-1.5, 0.0), hi = lo + rng.uniform(0.5, 2.0);
                 GradSample s;
                 // Values at least 0.05 from the bounds, where the gradient jumps.
                 Tensor x = values(rng, small_shape(rng, 0, 4));
                 std::vector<double> v = x.tolist<double>();
                 for (double& e : v)
                   while (std::fabs(e - lo) < 0.05 || std::fabs(e - hi) < 0.05) e = rng.uniform(-2, 2);
                 s.inputs = {grad_in(tensor_of(v, x.sizes(), kFloat64))};
                 s.params = cat_str("lo=", lo, " hi=", hi);
                 s.f = [=](const TensorList& in) { return clamp(in[0], lo, hi); };
                 return s;
               },
               A::Keep});
  t.push_back({"glu",
               [](Rng& rng) {
                 Shape shape = small_shape(rng, 1, 3, 12);
                 const int64_t dim = rng.range(0, int64_t(shape.size()) - 1);
                 shape[size_t(dim)] = 2 * rng.range(1, 3);  // an even size to halve
                 GradSample s;
                 s.inputs = {grad_in(values(rng, shape, -3, 3))};
                 s.params = cat_str("dim=", dim);
                 s.f = [dim](const TensorList& in) { return glu(in[0], dim); };
                 return s;
               },
               A::Keep});
  // prelu: x (N, C, ...) with one slope a channel or one in all; x kept from the kink at 0.
  t.push_back({"prelu",
               [](Rng& rng) {
                 const Shape shape = small_shape(rng, 2, 4, 24, 0.0);
                 const int64_t slopes = rng.chance(0.5) ? 1 : shape[1];
                 GradSample s;
                 s.inputs = {grad_in(values(rng, shape, -2, 2, 0.05)), grad_in(values(rng, {slopes}, -0.5, 0.5))};
                 s.params = cat_str("slopes=", slopes);
                 s.f = [](const TensorList& in) { return prelu(in[0], in[1]); };
                 return s;
               },
               A::Keep});
}

/// Two operands that broadcast to a random shape; b nonzero when divisor, a positive when base.
GradSample two_operands(Rng& rng, double b_min_abs = 0.0, bool positive_a = false) {
  const Shape out = small_shape(rng, 0, 4);
  Shape sa = broadcast_operand(rng, out), sb = broadcast_operand(rng, out);
  if (rng.chance(0.5)) sa = out;
  GradSample s;
  s.inputs = {grad_in(values(rng, sa, positive_a ? 0.3 : -2.0, 2.0)), grad_in(values(rng, sb, -2, 2, b_min_abs))};
  if (rng.chance(0.2)) s.inputs[size_t(rng.range(0, 1))].grad = false;
  return s;
}

/// `a` (an input of out's shape or broadcast to it by b) with each a / b at least 0.05 from an
/// integer: redrawn where a quotient is not, so that finite differences never straddle a step.
GradInput quotients_off_steps(Rng& rng, GradInput a, const Tensor& b) {
  const Shape out = broadcast_shapes(a.value.sizes(), b.sizes(), "quotients_off_steps");
  if (out != a.value.sizes()) a.value = a.value.expand(out).contiguous();  // each a meets one b
  std::vector<double> v = a.value.tolist<double>();
  const Host hb = read_host(b);
  for (int64_t i = 0; i < int64_t(v.size()); ++i) {
    const double d = hb.at_broadcast(unravel(i, out));
    for (double q = v[size_t(i)] / d; std::fabs(q - std::round(q)) < 0.05; q = v[size_t(i)] / d)
      v[size_t(i)] = rng.uniform(-4, 4);
  }
  a.value = tensor_of(v, out, kFloat64);
  return a;
}

void add_binary(std::vector<GradEntry>& t) {
  t.push_back({"add",
               [](Rng& rng) {
                 GradSample s = two_operands(rng);
                 const double alpha = rng.chance(0.5) ? 1.0 : rng.uniform(-2, 2);
                 s.params = cat_str("alpha=", alpha);
                 s.f = [alpha](const TensorList& in) { return add(in[0], in[1], alpha); };
                 return s;
               },
               A::Promote});
  t.push_back({"sub",
               [](Rng& rng) {
                 GradSample s = two_operands(rng);
                 const double alpha = rng.chance(0.5) ? 1.0 : rng.uniform(-2, 2);
                 s.params = cat_str("alpha=", alpha);
                 s.f = [alpha](const TensorList& in) { return sub(in[0], in[1], alpha); };
                 return s;
               },
               A::Promote});
  // Plain binary ops: two broadcasting operands, the second kept away from 0 for div, and
  // from the origin for atan2 and hypot (a NaN gradient there, as PyTorch's).
  using Binary = Tensor (*)(const Tensor&, const Tensor&);
  const std::tuple<const char*, Binary, double> plain[] = {
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, 0.0},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, 0.5},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, 0.0},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, 0.0},
      {"atan2", [](const Tensor& a, const Tensor& b) { return atan2(a, b); }, 0.3},
      {"hypot", [](const Tensor& a, const Tensor& b) { return hypot(a, b); }, 0.3},
      {"logaddexp", [](const Tensor& a, const Tensor& b) { return logaddexp(a, b); }, 0.0},
  };
  for (const auto& [name, op, b_min_abs] : plain)
    t.push_back({name,
                 [op, b_min_abs](Rng& rng) {
                   GradSample s = two_operands(rng, b_min_abs);
                   s.f = [op](const TensorList& in) { return op(in[0], in[1]); };
                   return s;
                 },
                 A::Promote});
  t.push_back({"pow",
               [](Rng& rng) {
                 GradSample s = two_operands(rng, 0.0, /*positive_a=*/true);
                 s.f = [](const TensorList& in) { return pow(in[0], in[1]); };
                 return s;
               },
               A::Float32});
  // The division-like ops, a / b drawn at least 0.05 from an integer (their steps; the
  // rounded divisions' gradient is zeros, which finite differences away from them agree with).
  const std::tuple<const char*, Binary> division[] = {
      {"remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }},
      {"fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }},
      {"floor_divide", [](const Tensor& a, const Tensor& b) { return floor_divide(a, b); }},
      {"div(a, b, trunc)", [](const Tensor& a, const Tensor& b) { return div(a, b, "trunc"); }},
      {"div(a, b, floor)", [](const Tensor& a, const Tensor& b) { return div(a, b, "floor"); }},
  };
  for (const auto& [name, op] : division)
    t.push_back({name,
                 [op](Rng& rng) {
                   GradSample s = two_operands(rng, 0.5);
                   s.inputs[0] = quotients_off_steps(rng, s.inputs[0], s.inputs[1].value);
                   s.f = [op](const TensorList& in) { return op(in[0], in[1]); };
                   return s;
                 },
                 A::Promote});
  using DivScalar = Tensor (*)(const Tensor&, double);
  const std::tuple<const char*, DivScalar> division_scalar[] = {
      {"remainder(x, s)", [](const Tensor& x, double c) { return remainder(x, c); }},
      {"fmod(x, s)", [](const Tensor& x, double c) { return fmod(x, c); }},
      {"floor_divide(x, s)", [](const Tensor& x, double c) { return floor_divide(x, c); }},
      {"div(x, s, floor)", [](const Tensor& x, double c) { return div(x, c, "floor"); }},
  };
  for (const auto& [name, fn] : division_scalar)
    t.push_back({name,
                 [fn](Rng& rng) {
                   const double c = rng.pick(std::vector<double>{-1.5, 0.75, 2.0, 1.25});
                   GradSample s;
                   s.inputs = {grad_in(values(rng, small_shape(rng, 0, 4), -4, 4))};
                   s.inputs[0] = quotients_off_steps(rng, s.inputs[0], tensor_of({c}, {}, kFloat64));
                   s.params = cat_str("s=", c);
                   s.f = [fn, c](const TensorList& in) { return fn(in[0], c); };
                   return s;
                 },
                 A::Keep});
  using Scalar = Tensor (*)(const Tensor&, double);
  const std::pair<const char*, Scalar> scalars[] = {
      {"add(x, s)", [](const Tensor& x, double s) { return add(x, s); }},
      {"sub(x, s)", [](const Tensor& x, double s) { return sub(x, s); }},
      {"mul(x, s)", [](const Tensor& x, double s) { return mul(x, s); }},
      {"div(x, s)", [](const Tensor& x, double s) { return div(x, s); }},
      {"rsub", [](const Tensor& x, double s) { return rsub(x, s); }},
      {"rdiv(s != 1)", [](const Tensor& x, double s) { return rdiv(x, s); }},
  };
  for (const auto& [name, fn] : scalars)
    t.push_back({name,
                 [fn](Rng& rng) {
                   const double c = rng.pick(std::vector<double>{-1.5, 0.5, 2.0, 3.25});
                   GradSample s;
                   s.inputs = {grad_in(values(rng, small_shape(rng, 0, 4), -2, 2, 0.4))};
                   s.params = cat_str("s=", c);
                   s.f = [fn, c](const TensorList& in) { return fn(in[0], c); };
                   return s;
                 },
                 A::Keep});
  // rdiv(x, 1) is reciprocal, of autocast's float32 list.
  t.push_back({"rdiv",
               [](Rng& rng) {
                 GradSample s;
                 s.inputs = {grad_in(values(rng, small_shape(rng, 0, 4), -2, 2, 0.4))};
                 s.params = "s=1";
                 s.f = [](const TensorList& in) { return rdiv(in[0], 1.0); };
                 return s;
               },
               A::Float32});
  t.push_back({"where",
               [](Rng& rng) {
                 const Shape out = small_shape(rng, 0, 4);
                 GradSample s;
                 s.inputs = {const_in(mask_of(rng, broadcast_operand(rng, out), 0.5)),
                             grad_in(values(rng, rng.chance(0.5) ? out : broadcast_operand(rng, out))),
                             grad_in(values(rng, broadcast_operand(rng, out)))};
                 s.f = [](const TensorList& in) { return where(in[0], in[1], in[2]); };
                 return s;
               },
               A::Promote});
  t.push_back({"masked_fill",
               [](Rng& rng) {
                 const Shape out = small_shape(rng, 0, 4);
                 const double v = rng.uniform(-3, 3);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, out)), const_in(mask_of(rng, broadcast_operand(rng, out), 0.4))};
                 s.params = cat_str("value=", v);
                 s.f = [v](const TensorList& in) { return masked_fill(in[0], in[1], v); };
                 return s;
               },
               A::Keep});
  // lerp: one dtype (no promotion, as PyTorch), so no mixed autocast variant.
  t.push_back({"lerp",
               [](Rng& rng) {
                 const Shape out = small_shape(rng, 0, 4);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, rng.chance(0.5) ? out : broadcast_operand(rng, out))),
                             grad_in(values(rng, broadcast_operand(rng, out))),
                             grad_in(values(rng, broadcast_operand(rng, out), -1, 2))};
                 s.f = [](const TensorList& in) { return lerp(in[0], in[1], in[2]); };
                 return s;
               },
               A::Keep, true, 0});
  t.push_back({"lerp(start, end, w)",
               [](Rng& rng) {
                 const Shape out = small_shape(rng, 0, 4);
                 const double w = rng.uniform(-1, 2);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, out)), grad_in(values(rng, broadcast_operand(rng, out)))};
                 s.params = cat_str("weight=", w);
                 s.f = [w](const TensorList& in) { return lerp(in[0], in[1], w); };
                 return s;
               },
               A::Keep, true, 0});
  t.push_back({"masked_select",
               [](Rng& rng) {
                 const Shape out = small_shape(rng, 0, 4);
                 const bool x_bigger = rng.chance(0.5);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, x_bigger ? out : broadcast_operand(rng, out))),
                             const_in(mask_of(rng, x_bigger ? broadcast_operand(rng, out) : out, 0.4))};
                 s.f = [](const TensorList& in) { return masked_select(in[0], in[1]); };
                 return s;
               },
               A::Keep});
}

/// In-place ops write into a clone of input 0 (a leaf may not be written), whose history
/// they rebase (Note [In-place ops and autograd]).
void add_inplace(std::vector<GradEntry>& t) {
  using Binary_ = const Tensor& (*)(const Tensor&, const Tensor&);
  const std::pair<const char*, Binary_> binary[] = {
      {"add_", [](const Tensor& a, const Tensor& b) -> const Tensor& { return add_(a, b, 1.5); }},
      {"sub_", [](const Tensor& a, const Tensor& b) -> const Tensor& { return sub_(a, b); }},
      {"mul_", [](const Tensor& a, const Tensor& b) -> const Tensor& { return mul_(a, b); }},
      {"div_", [](const Tensor& a, const Tensor& b) -> const Tensor& { return div_(a, b); }},
  };
  for (const auto& [name, fn] : binary)
    t.push_back(
        {name,
         [fn](Rng& rng) {
           const Shape out = small_shape(rng, 0, 4);
           GradSample s;
           s.inputs = {grad_in(values(rng, out)), grad_in(values(rng, broadcast_operand(rng, out), -2, 2, 0.5))};
           if (rng.chance(0.2)) s.inputs[size_t(rng.range(0, 1))].grad = false;
           s.f = [fn](const TensorList& in) {
             Tensor self = in[0].clone();
             fn(self, in[1]);
             return self;
           };
           return s;
         },
         A::Keep});
  using Scalar_ = const Tensor& (*)(const Tensor&, double);
  const std::pair<const char*, Scalar_> scalars[] = {
      {"add_(x, s)", [](const Tensor& x, double s) -> const Tensor& { return add_(x, s); }},
      {"sub_(x, s)", [](const Tensor& x, double s) -> const Tensor& { return sub_(x, s); }},
      {"mul_(x, s)", [](const Tensor& x, double s) -> const Tensor& { return mul_(x, s); }},
      {"div_(x, s)", [](const Tensor& x, double s) -> const Tensor& { return div_(x, s); }},
  };
  for (const auto& [name, fn] : scalars)
    t.push_back({name,
                 [fn](Rng& rng) {
                   const double c = rng.pick(std::vector<double>{-1.5, 0.5, 2.0});
                   GradSample s;
                   s.inputs = {grad_in(values(rng, small_shape(rng, 0, 4)))};
                   s.params = cat_str("s=", c);
                   s.f = [fn, c](const TensorList& in) {
                     Tensor self = in[0].clone();
                     fn(self, c);
                     return self;
                   };
                   return s;
                 },
                 A::Keep});
  t.push_back({"lerp_",
               [](Rng& rng) {
                 const Shape out = small_shape(rng, 0, 4);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, out)), grad_in(values(rng, broadcast_operand(rng, out))),
                             grad_in(values(rng, broadcast_operand(rng, out), -1, 2))};
                 if (rng.chance(0.3)) s.inputs[size_t(rng.range(0, 2))].grad = false;
                 s.f = [](const TensorList& in) {
                   Tensor self = in[0].clone();
                   lerp_(self, in[1], in[2]);
                   return self;
                 };
                 return s;
               },
               A::Keep, true, 0});
  t.push_back({"lerp_(self, end, w)",
               [](Rng& rng) {
                 const Shape out = small_shape(rng, 0, 4);
                 const double w = rng.uniform(-1, 2);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, out)), grad_in(values(rng, broadcast_operand(rng, out)))};
                 s.params = cat_str("weight=", w);
                 s.f = [w](const TensorList& in) {
                   Tensor self = in[0].clone();
                   lerp_(self, in[1], w);
                   return self;
                 };
                 return s;
               },
               A::Keep, true, 0});
  t.push_back({"masked_fill_",
               [](Rng& rng) {
                 const Shape out = small_shape(rng, 0, 4);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, out)), const_in(mask_of(rng, broadcast_operand(rng, out), 0.4))};
                 s.f = [](const TensorList& in) {
                   Tensor self = in[0].clone();
                   masked_fill_(self, in[1], -0.75);
                   return self;
                 };
                 return s;
               },
               A::Keep});
}

void add_reduce(std::vector<GradEntry>& t) {
  // Reductions over a list of dims (only sum's samples include size-0 dims).
  using OverDims = Tensor (*)(const Tensor&, const std::vector<int64_t>&, bool);
  const std::tuple<const char*, OverDims, double, A> over_dims[] = {
      {"sum", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return sum(x, d, k); }, 0.03, A::Float32},
      {"mean", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return mean(x, d, k); }, 0.0, A::Float32},
      {"prod", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return prod(x, d, k); }, 0.03, A::Float32},
      {"amax", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amax(x, d, k); }, 0.0, A::Keep},
      {"amin", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amin(x, d, k); }, 0.0, A::Keep},
  };
  for (const auto& [name, fn, p_zero, amp] : over_dims)
    t.push_back({name,
                 [fn, p_zero](Rng& rng) {
                   const Shape sh = small_shape(rng, 0, 4, 24, p_zero);
                   const std::vector<int64_t> dims = random_dims(rng, int64_t(sh.size()));
                   const bool keep = rng.chance(0.5);
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh))};
                   s.params = cat_str("dims=", str(dims), " keepdim=", keep);
                   s.f = [=](const TensorList& in) { return fn(in[0], dims, keep); };
                   return s;
                 },
                 amp});
  // var and std (sqrt of var) over dims with a correction the slice allows. std's gradient
  // (x - mean) / (n std) is ill-conditioned where a slice's values nearly agree (the rounding
  // of the mean is then a large part of x - mean, PyTorch's formula alike), so its bound for
  // the float32 and 16-bit runs is wider.
  using Spread = Tensor (*)(const Tensor&, const std::vector<int64_t>&, int64_t, bool);
  const std::tuple<const char*, Spread, double> spreads[] = {
      {"var", [](const Tensor& x, const std::vector<int64_t>& d, int64_t c, bool k) { return var(x, d, c, k); }, 2.0},
      {"std", [](const Tensor& x, const std::vector<int64_t>& d, int64_t c, bool k) { return frugal::std(x, d, c, k); },
       8.0},
  };
  for (const auto& [name, fn, low_tol] : spreads)
    t.push_back({name,
                 [fn](Rng& rng) {
                   const Shape sh = small_shape(rng, 1, 4, 24, 0.0);
                   std::vector<int64_t> dims = random_dims(rng, int64_t(sh.size()));
                   int64_t n = 1;
                   for (int64_t d : wrap_dims(dims, int64_t(sh.size()))) n *= sh[size_t(d)];
                   if (dims.empty()) n = numel_of(sh);
                   const int64_t correction = n > 1 ? rng.range(0, 1) : 0;
                   const bool keep = rng.chance(0.5);
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh))};
                   s.params = cat_str("dims=", str(dims), " correction=", correction, " keepdim=", keep);
                   s.f = [=](const TensorList& in) { return fn(in[0], dims, correction, keep); };
                   s.grad_tol = 10.0;
                   return s;
                 },
                 A::Float32, true, 1, low_tol});
  t.push_back({"vector_norm",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 0, 4, 24, 0.0);
                 const std::vector<int64_t> dims = random_dims(rng, int64_t(sh.size()));
                 const double ords[] = {2.0, 1.0, 3.0, 1.5, 0.5, -1.0, INFINITY, -INFINITY};
                 const double ord = ords[rng.range(0, 7)];
                 const bool keep = rng.chance(0.5);
                 GradSample s;
                 // |x| >= 0.1: ord < 2 is not differentiable at 0, and ord < 1 is steep near it.
                 s.inputs = {grad_in(values(rng, sh, -2.0, 2.0, 0.1))};
                 s.params = cat_str("ord=", ord, " dims=", str(dims), " keepdim=", keep);
                 s.f = [=](const TensorList& in) { return vector_norm(in[0], ord, dims, keep); };
                 return s;
               },
               A::Float32});
  // The distances (autograd/ops/distance.h), |x| >= 0.1 so every norm is far above eps.
  t.push_back({"normalize",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 1, 4, 24, 0.0);
                 const int64_t dim = rng.range(-int64_t(sh.size()), int64_t(sh.size()) - 1);
                 const double p = rng.pick(std::vector<double>{2.0, 1.0, 3.0, INFINITY});
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh, -2.0, 2.0, 0.1))};
                 s.params = cat_str("p=", p, " dim=", dim);
                 s.f = [=](const TensorList& in) { return normalize(in[0], p, dim); };
                 return s;
               },
               A::Float32});
  /// Two operands of one broadcast shape: b is a, or a's trailing dims, or a with a dim of size 1.
  const auto broadcast_pair = [](Rng& rng) {
    const Shape a = small_shape(rng, 1, 3, 24, 0.0);
    Shape b = a;
    if (rng.chance(0.3)) b.erase(b.begin(), b.begin() + rng.range(0, int64_t(a.size()) - 1));
    else if (rng.chance(0.3)) b[size_t(rng.range(0, int64_t(b.size()) - 1))] = 1;
    return std::vector<GradInput>{grad_in(values(rng, a, -2.0, 2.0, 0.1)), grad_in(values(rng, b, -2.0, 2.0, 0.1))};
  };
  t.push_back({"cosine_similarity",
               [broadcast_pair](Rng& rng) {
                 GradSample s;
                 s.inputs = broadcast_pair(rng);
                 const int64_t n = s.inputs[0].value.dim(), dim = rng.range(-n, n - 1);
                 s.params = cat_str("dim=", dim);
                 s.f = [=](const TensorList& in) { return cosine_similarity(in[0], in[1], dim); };
                 return s;
               },
               A::Float32});
  t.push_back({"pairwise_distance",
               [broadcast_pair](Rng& rng) {
                 GradSample s;
                 s.inputs = broadcast_pair(rng);
                 // (p = inf: the max |x1 - x2| of 16-bit differences picks other elements than
                 // float64's at near-ties; vector_norm's entry covers the inf norm.)
                 const double p = rng.pick(std::vector<double>{2.0, 3.0, 1.5});
                 const bool keepdim = rng.chance(0.5);
                 s.params = cat_str("p=", p, " keepdim=", keepdim);
                 s.f = [=](const TensorList& in) { return pairwise_distance(in[0], in[1], p, 1e-6, keepdim); };
                 return s;
               },
               A::Float32});
  t.push_back({"triplet_margin_loss",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 1, 3, 24, 0.0);
                 const double margin = rng.uniform(-1.0, 2.0), p = rng.pick(std::vector<double>{2.0, 3.0, 1.5});
                 const bool swap = rng.chance(0.5);
                 const Reduction reduction = rng.pick(std::vector<Reduction>{Reduction::Mean, Reduction::Sum,
                                                                             Reduction::None});
                 GradSample s;
                 for (int i = 0; i < 3; ++i) s.inputs.push_back(grad_in(values(rng, sh, -2.0, 2.0, 0.1)));
                 s.params = cat_str("margin=", margin, " p=", p, " swap=", swap, " reduction=", int(reduction));
                 s.f = [=](const TensorList& in) {
                   return triplet_margin_loss(in[0], in[1], in[2], margin, p, 1e-6, swap, reduction);
                 };
                 return s;
               },
               A::Float32});
  t.push_back({"cosine_embedding_loss",
               [](Rng& rng) {
                 const int64_t n = rng.range(1, 5), d = rng.range(1, 6);
                 const double margin = rng.uniform(-1.0, 0.5);
                 const Reduction reduction = rng.pick(std::vector<Reduction>{Reduction::Mean, Reduction::Sum,
                                                                             Reduction::None});
                 std::vector<double> y;
                 for (int64_t i = 0; i < n; ++i) y.push_back(rng.pick(std::vector<double>{1.0, -1.0, 0.0}));
                 GradSample s;
                 s.inputs = {grad_in(values(rng, {n, d}, -2.0, 2.0, 0.1)), grad_in(values(rng, {n, d}, -2.0, 2.0, 0.1)),
                             {tensor_of(y, {n}, kFloat64).to(kInt64), false, false}};
                 s.params = cat_str("margin=", margin, " reduction=", int(reduction));
                 s.f = [=](const TensorList& in) { return cosine_embedding_loss(in[0], in[1], in[2], margin, reduction); };
                 return s;
               },
               A::Float32});
  using Along = ValuesIndices (*)(const Tensor&, int64_t, bool);
  const std::pair<const char*, Along> along[] = {
      {"max", [](const Tensor& x, int64_t d, bool k) { return max(x, d, k); }},
      {"min", [](const Tensor& x, int64_t d, bool k) { return min(x, d, k); }},
  };
  for (const auto& [name, fn] : along)
    t.push_back({name,
                 [fn](Rng& rng) {
                   const Shape sh = small_shape(rng, 1, 4, 24, 0.0);
                   const int64_t dim = rng.range(-int64_t(sh.size()), int64_t(sh.size()) - 1);
                   const bool keep = rng.chance(0.5);
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh))};
                   s.params = cat_str("dim=", dim, " keepdim=", keep);
                   s.f = [=](const TensorList& in) { return fn(in[0], dim, keep).values; };
                   return s;
                 },
                 A::Keep});
}

// sort and topk: the values re-read through gather (Note [Sort order]).
void add_sort(std::vector<GradEntry>& t) {
  t.push_back({"sort",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 0, 3, 24, 0.05);
                 const int64_t dim = sh.empty() ? 0 : rng.range(-int64_t(sh.size()), int64_t(sh.size()) - 1);
                 const bool descending = rng.chance(0.5);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("dim=", dim, " descending=", descending);
                 s.f = [=](const TensorList& in) { return sort(in[0], dim, descending).values; };
                 return s;
               },
               A::Keep});
  t.push_back({"topk",
               [](Rng& rng) {
                 Shape sh = small_shape(rng, 1, 3, 24, 0.0);
                 const int64_t dim = rng.range(-int64_t(sh.size()), int64_t(sh.size()) - 1);
                 const int64_t k = rng.range(0, sh[size_t(dim < 0 ? dim + int64_t(sh.size()) : dim)]);
                 const bool largest = rng.chance(0.5);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("k=", k, " dim=", dim, " largest=", largest);
                 s.f = [=](const TensorList& in) { return topk(in[0], k, dim, largest).values; };
                 return s;
               },
               A::Keep});
}

void add_softmax(std::vector<GradEntry>& t) {
  using Soft = Tensor (*)(const Tensor&, int64_t);
  const std::pair<const char*, Soft> ops[] = {
      {"softmax", [](const Tensor& x, int64_t d) { return softmax(x, d); }},
      {"log_softmax", [](const Tensor& x, int64_t d) { return log_softmax(x, d); }},
  };
  for (const auto& [name, fn] : ops)
    t.push_back({name,
                 [fn](Rng& rng) {
                   const Shape sh = small_shape(rng, 1, 4);
                   const int64_t dim = rng.range(-int64_t(sh.size()), int64_t(sh.size()) - 1);
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh, -3, 3))};
                   s.params = cat_str("dim=", dim);
                   s.f = [=](const TensorList& in) { return fn(in[0], dim); };
                   return s;
                 },
                 A::Float32});
}

}  // namespace

void add_grad_elementwise(std::vector<GradEntry>& t) {
  add_unary(t);
  add_binary(t);
  add_inplace(t);
  add_reduce(t);
  add_softmax(t);
  add_sort(t);
}

}  // namespace frugal::optest
